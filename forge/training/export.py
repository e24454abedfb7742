"""``forge export RUN_DIR --merge OUT_DIR``: a run's final policy as a plain HF model directory.

A run saves its final policy at ``<run_dir>/model`` (a pipeline: ``<run_dir>/rl/model``, else
``<run_dir>/sft/model``). With ``trainer.lora`` that is a PEFT adapter directory whose
``adapter_config.json`` names the base model (itself perhaps an adapter directory: an RL
adapter over an SFT adapter); :func:`export_merged` loads the base, merges the adapters and
writes a directory any ``transformers.AutoModelForCausalLM.from_pretrained`` (or vLLM) loads,
with the tokenizer. A full fine-tuning run's model directory is written out as it is.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["export_merged", "find_policy"]

CANDIDATES = ("", "model", "rl/model", "sft/model")


def _is_model_dir(path: Path) -> bool:
    return (path / "config.json").is_file() or (path / "adapter_config.json").is_file()


def find_policy(run_dir: str | Path) -> Path:
    """The final policy of ``run_dir`` (or ``run_dir`` itself when it is a model directory);
    ``FileNotFoundError`` naming the places looked at."""
    run_dir = Path(run_dir)
    for rel in CANDIDATES:
        path = run_dir / rel if rel else run_dir
        if _is_model_dir(path):
            return path
    looked = ", ".join(str(run_dir / r) if r else str(run_dir) for r in CANDIDATES)
    raise FileNotFoundError(
        f"no saved policy in {run_dir}: looked for a model or adapter directory at {looked}; "
        "a run saves one at its end (trainer.export_hf)"
    )


def export_merged(run_dir: str | Path, out_dir: str | Path, dtype: str = "float32") -> Path:
    """Write the final policy of ``run_dir`` to ``out_dir`` as a plain HF model directory,
    LoRA adapters merged into the base weights. Returns ``out_dir``."""
    from forge.models import load_tokenizer
    from forge.training.lora import load_base_model, tokenizer_source

    source = find_policy(run_dir)
    model = load_base_model(str(source), dtype, "cpu", "eager")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    load_tokenizer(tokenizer_source(str(source))).save_pretrained(out)
    return out
