"""Training internals the ``Trainer`` and ``ReferenceModel`` actors wrap (testable without
processes): typed configs, the LR schedule, DDP/FSDP2 wrapping, the optimisation core,
checkpoints, the reference model's logprob computation, and LoRA (``forge.training.lora``,
which needs ``forge[lora]`` only when ``trainer.lora`` is set). ``forge.training.titan`` (the
torchtitan backend) is imported only when ``backend="titan"`` is chosen.
"""

from forge.training.reference_policy import ReferenceCore
from forge.training.schedule import build_scheduler, lr_multiplier
from forge.training.trainer_checkpoint import load_checkpoint, save_checkpoint
from forge.training.trainer_config import (
    LoraConfig,
    OptimizerConfig,
    ReferenceConfig,
    ScheduleConfig,
    TrainerConfig,
)
from forge.training.trainer_core import TrainerCore, loss_denominator

__all__ = [
    "LoraConfig",
    "OptimizerConfig",
    "ReferenceConfig",
    "ReferenceCore",
    "ScheduleConfig",
    "TrainerConfig",
    "TrainerCore",
    "build_scheduler",
    "load_checkpoint",
    "loss_denominator",
    "lr_multiplier",
    "save_checkpoint",
]
