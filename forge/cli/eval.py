"""``forge eval``: evaluate a saved policy on a run config's evaluation sets.

    forge eval --config apps/guess/cpu.yaml --checkpoint runs/guess-20261124-101500
    forge eval --config my_task.yaml --checkpoint path/to/hf_model --sets heldout,chain_sum

The config is any RL run config (an RL app's, or a pipeline's, whose ``rl:`` section is
used). The policy is ``--checkpoint``: a model directory, or a run directory holding one
(``<run>/model`` or ``<run>/rl/model``); without it, the config's ``policy.model``. The sets
are the config's ``eval.sets`` (``--sets`` picks some by name); ``heldout`` is always there:
the run's own held-out items, scored by its environment or evaluation reward. A generator
service serves the policy; the table goes to the terminal and the metrics to
``--out`` (default ``<checkpoint>/eval.json``). As in a run, the sets that would sample the
run's greedy answers to its held-out items (``harness.scores_run_greedy``) score one greedy
pass instead of generating one each.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from forge.evaluation.harness import Defaults, evaluate_set, scores_run_greedy
from forge.evaluation.sets import EvalSet

__all__ = ["find_model", "run_eval"]


def find_model(path: str | Path) -> Path:
    """The HF model (or LoRA adapter) directory ``path`` names: itself, ``<path>/model`` or
    ``<path>/rl/model``. ``ValueError`` listing where it looked."""
    root = Path(path)
    for candidate in (root, root / "model", root / "rl" / "model"):
        if (candidate / "config.json").is_file() or (candidate / "adapter_config.json").is_file():
            return candidate  # a model, or a LoRA adapter directory (loaded onto its base)
    raise ValueError(
        f"--checkpoint {path}: no model there (looked for config.json in {root}, "
        f"{root / 'model'} and {root / 'rl' / 'model'})"
    )


def rl_section(cfg: Any) -> Any:
    """The RL run config in ``cfg`` (itself, or a pipeline's ``rl`` stage)."""
    rl = getattr(cfg, "rl", cfg)
    if not all(hasattr(rl, k) for k in ("eval", "policy", "generator", "data")):
        raise ValueError(
            f"{getattr(cfg, 'app', cfg)!r} is not an RL run config (no "
            "policy/generator/data/eval sections, nor an rl: stage with them)"
        )
    return rl


def choose_sets(rl: Any, names: str | None) -> list[EvalSet]:
    """``heldout`` (the run's own items) and the config's ``eval.sets``; ``names`` (comma
    separated) picks some."""
    sets = [EvalSet("heldout"), *[s for s in rl.eval.sets if s.name != "heldout"]]
    if not names:
        return sets
    by_name = {s.name: s for s in sets}
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in by_name]
    if unknown:
        raise ValueError(f"--sets {unknown}: no such eval set; the config has {list(by_name)}")
    return [by_name[n] for n in wanted]


async def run_eval(rl: Any, sets: list[EvalSet]) -> dict[str, dict[str, float]]:
    """Spawn a generator service for ``rl``'s policy, evaluate ``sets``, return
    ``{set name: metrics}``."""
    from forge.actors import Generator
    from forge.models import load_tokenizer
    from forge.rollout.groups import greedy_completions
    from forge.run import actor_env_vars
    from forge.slots import DATA_SOURCE

    heldout = list(DATA_SOURCE.resolve(rl.data)().heldout())
    reward = rl.eval_reward_fn()
    env_cfg = getattr(rl, "env", None)  # an app without environments (REINFORCE) has none
    defaults = Defaults(heldout, [reward] if reward else [], env_cfg, rl.eval.max_tokens)
    env_vars = actor_env_vars(rl.threads_per_actor, rl.deterministic)
    generator = await Generator.options(
        num_replicas=rl.replicas.generator, env_vars=env_vars
    ).as_service(rl.generator)
    tokenizer = load_tokenizer(rl.policy.model)
    reusing = [es.name for es in sets if scores_run_greedy(es, defaults)]
    if heldout and reusing:  # as in a run: one greedy pass, scored by every set that asks it
        t0 = time.perf_counter()
        defaults.greedy = await greedy_completions(
            generator.generate.route, heldout, defaults.max_tokens
        )
        print(
            f"[eval] greedy answers to {len(heldout)} held-out items in "
            f"{time.perf_counter() - t0:.1f} s, scored by: {', '.join(reusing)}",
            flush=True,
        )
    results = {}
    for es in sets:
        t0 = time.perf_counter()
        print(f"[eval] {es.name}: evaluating ...", flush=True)
        results[es.name] = await evaluate_set(es, generator, tokenizer, defaults)
        print(f"[eval] {es.name}: done in {time.perf_counter() - t0:.1f} s", flush=True)
    return results


def show(results: dict[str, dict[str, float]], console=None) -> None:
    """One table: a row per metric, a column per set (blank where a set has none)."""
    from rich.console import Console
    from rich.table import Table

    metrics: list[str] = []
    for m in results.values():
        metrics += [k for k in m if k not in metrics]
    table = Table(title="forge eval")
    table.add_column("metric")
    for name in results:
        table.add_column(name, justify="right")
    for k in metrics:
        table.add_row(k, *[_cell(m.get(k)) for m in results.values()])
    (console or Console()).print(table)


def _cell(v: float | None) -> str:
    if v is None:
        return ""
    return f"{v:.0f}" if float(v).is_integer() and abs(v) > 1 else f"{v:.3f}"


def write(results: dict, out: Path, model: str) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"model": model, "sets": results}, indent=2) + "\n")
    print(f"[eval] metrics written to {out}", flush=True)


def main(
    config: str, checkpoint: str | None, names: str | None, out: str | None, overrides: list[str]
) -> int:
    """``forge eval``'s body; returns the exit code."""
    from controller import loops, shutdown
    from forge.launch import load_app
    from forge.run.policy import retarget

    _, cfg = load_app(config, overrides)
    rl = rl_section(cfg)
    if checkpoint:
        retarget(rl, str(find_model(checkpoint)))
    elif not (Path(rl.policy.model) / "config.json").is_file() and rl.policy.model == "from-run":
        raise ValueError("the config's policy is 'from-run'; give --checkpoint")
    sets = choose_sets(rl, names)
    print(f"[eval] policy {rl.policy.model}; sets: {', '.join(s.name for s in sets)}", flush=True)

    async def go() -> dict:
        try:
            return await run_eval(rl, sets)
        finally:
            await shutdown()

    from forge.run.actors import prefork_actor_zygote

    prefork_actor_zygote(rl.threads_per_actor, rl.deterministic)  # its imports once, not twice
    results = loops.run(go())
    show(results)
    target = Path(out) if out else Path(checkpoint or rl.policy.model) / "eval.json"
    write(results, target, str(rl.policy.model))
    return 0
