"""Where the policy's generator and trainer run on GPUs, and how they share one (``placement:``).

Three placements, chosen in the run config::

    placement: {}                                              # disjoint (the default)
    placement: {generator_memory: 0.35, trainer_memory: 0.6}  # one GPU, split by memory
    placement: {colocate: true}                               # one GPU, time-sliced

- **Disjoint** (default): no role shares a device with another; each GPU process uses its own
  device, when ``replicas.generator + trainer_procs`` GPUs are visible. With fewer, the roles
  share them with no caps and no sleep, as before placements existed (the apps ran so on one
  GPU); a shared placement below caps or time-slices them instead.
- **Split by memory** (``generator_memory`` and ``trainer_memory``, shares of one GPU's
  memory): the generator and trainer rank 0 run at the same time on GPU 0 (other trainer
  ranks on GPUs 1..P-1). The generator's share becomes vLLM's ``gpu_memory_utilization`` or,
  with the hf backend, its process's torch memory fraction (weights and KV cache); the
  trainer's becomes its torch memory fraction (``torch.cuda.set_per_process_memory_fraction``).
- **Time-sliced** (``colocate: true``): the same device, with phases that alternate every step
  (``forge.run.colocate``): generate, sleep the generator (``sleep_level`` 1: its KV cache is
  freed; 2: its weights too, since the next push replaces them), train (the optimizer state,
  offloaded to host memory while generating with ``offload_optimizer``, comes back), hand the
  new weights over, wake the generator. On-policy only: ``max_policy_age`` must be 0. Shares
  may be given too (caps while both are resident). On CPU the same phases run: sleeping frees
  the KV cache (and weights), offloading moves nothing.

Every check runs when the config loads (``check_placement``), against the GPUs torch sees,
so a config that cannot fit fails before anything spawns, naming the numbers. A GPU config
still loads on a machine without GPUs (to validate it there); counts are then not checked and
the GPU-only steps (a memory fraction, vLLM sleep) fail in the actor with a clear error.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PlacementConfig", "check_placement", "disjoint_gpus", "gpu_count"]

SLEEP_LEVELS = (1, 2)


@dataclass
class PlacementConfig:
    """Where the generator and the trainer run on GPUs (see the module docstring)."""

    colocate: bool = False
    """Time-slice one GPU: generate, sleep the generator, train, hand the weights over, wake
    (on-policy only: ``max_policy_age: 0``)."""
    generator_memory: float = 0.0
    """Share (0 to 1) of one GPU's memory for the generator (vLLM's
    ``gpu_memory_utilization``; the hf engine's torch memory fraction); 0: no cap."""
    trainer_memory: float = 0.0
    """Share (0 to 1) of one GPU's memory for each trainer rank; 0: no cap."""
    sleep_level: int = 2
    """With ``colocate``: 1 frees the generator's KV cache while it sleeps, 2 its weights too
    (each push replaces them anyway)."""
    offload_optimizer: bool = True
    """With ``colocate``: the trainer's optimizer state (and gradients) go to host memory
    while the generator runs."""

    def __post_init__(self) -> None:
        for key in ("generator_memory", "trainer_memory"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v < 1.0:
                raise ValueError(
                    f"placement.{key} is a share of one GPU's memory in [0, 1) (0: no cap), "
                    f"got {v!r}"
                )
        if self.sleep_level not in SLEEP_LEVELS:
            raise ValueError(
                f"placement.sleep_level must be 1 (free the KV cache) or 2 (also the weights), "
                f"got {self.sleep_level!r}"
            )
        if not self.colocate:
            ignored = [
                k
                for k, default in (("sleep_level", 2), ("offload_optimizer", True))
                if getattr(self, k) != default
            ]
            if ignored:
                raise ValueError(
                    f"placement.{ignored[0]} applies to time-sliced colocation only; set "
                    "placement.colocate: true or remove it"
                )
        total = self.generator_memory + self.trainer_memory
        if total > 1.0:
            raise ValueError(
                f"placement: generator_memory {self.generator_memory} + trainer_memory "
                f"{self.trainer_memory} = {total:.2f} of one GPU's memory, more than 1.0; "
                "lower them (leave a few percent for the CUDA context)"
            )

    @property
    def split(self) -> bool:
        """Whether memory shares are given (both roles resident on the device at once)."""
        return self.generator_memory > 0 or self.trainer_memory > 0

    @property
    def shared(self) -> bool:
        """Whether the generator and trainer share a device (split or time-sliced)."""
        return self.colocate or self.split

    @property
    def mode(self) -> str:
        """``"colocate"``, ``"split"`` or ``"disjoint"``."""
        return "colocate" if self.colocate else "split" if self.split else "disjoint"


def gpu_count() -> int:
    """GPUs torch sees in this process (0 without torch's CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def check_placement(
    p: PlacementConfig,
    *,
    generator_gpu: bool,
    trainer_gpu: bool,
    generators: int,
    trainer_procs: int,
    max_policy_age: int,
    stream: bool,
    visible: int,
) -> None:
    """``ValueError`` for a placement the run cannot have, naming the numbers.

    ``generator_gpu``/``trainer_gpu``: whether each role runs on a GPU; ``generators``:
    generator replicas; ``visible``: GPUs visible (``gpu_count()``; 0 skips the counts, see
    the module docstring)."""
    if p.colocate and max_policy_age > 0:
        raise ValueError(
            f"placement.colocate: true time-slices generation and training, so rollouts "
            f"cannot run ahead of training: max_policy_age={max_policy_age} would generate "
            "the next step's rollouts while the trainer steps. Set max_policy_age: 0 "
            "(on-policy), or use placement memory shares (generator_memory, trainer_memory) "
            "to run both at once"
        )
    if p.colocate and stream:
        raise ValueError(
            "placement.colocate: true and stream: true: streaming trains on a step's first "
            "groups while the rest generate, which time-slicing forbids; set stream: false"
        )
    if p.split:
        off = [r for r, on in (("generator", generator_gpu), ("trainer", trainer_gpu)) if not on]
        if off:
            raise ValueError(
                f"placement memory shares split a GPU, but the {off[0]} runs on the CPU; "
                f"remove placement.generator_memory/trainer_memory, or put the {off[0]} on "
                "a GPU (generator.device: cuda or backend: vllm; trainer.device: cuda)"
            )
    if p.shared and generator_gpu and generators != 1:
        raise ValueError(
            f"placement.{p.mode}: the generator shares GPU 0 with trainer rank 0, which "
            f"takes one generator replica; got replicas.generator={generators}"
        )
    if visible <= 0 or not p.shared:  # (disjoint with too few GPUs: shared uncapped)
        return
    needed = trainer_procs if trainer_gpu else 1
    if needed > visible:
        raise ValueError(
            f"placement.{p.mode} needs {needed} GPU(s) (trainer_procs={trainer_procs}, one per "
            f"GPU, the generator on GPU 0) but {visible} are visible "
            "(torch.cuda.device_count()); lower trainer_procs or make more GPUs visible"
        )


def disjoint_gpus(
    *, generator_gpu: bool, trainer_gpu: bool, generators: int, trainer_procs: int, visible: int
) -> bool:
    """Whether each GPU process of the generator and trainer can have a GPU of its own."""
    needed = generators * generator_gpu + trainer_procs * trainer_gpu
    return 0 < needed <= visible
