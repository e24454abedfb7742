"""``forge run``: load an app's typed config, make its run directory, run it, clean up.

How an app is found and its config loaded is ``forge.launch`` (an app module defines
``Config`` and ``run``). The config is validated before anything is spawned; ``--dry-run``
prints it resolved (``forge.config.describe``) and stops there. Otherwise the resolved config
is written to ``<run_dir>/config.yaml``. ``--resume <run_dir>`` reloads that file (plus
overrides) and passes ``resume=True`` so the app continues from its last checkpoint; a
directory another user owns or may write is refused (``forge.run.ownership``). Ctrl-C or
SIGTERM stop every process the run spawned before the command exits. A runtime failure
(``ForgeRuntimeError``: a process died, a service had no replica, ...) stops them too, prints
the error and the ``forge run --resume`` command, and exits with code 1.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from controller import loops
from controller.errors import ForgeRuntimeError
from forge.launch import load_app, new_run_dir

__all__ = ["run_app"]


def run_app(
    config_path: str | None,
    overrides: list[str],
    resume: str | None = None,
    run_dir: str | None = None,
    dry_run: bool = False,
) -> int:
    """Run an app to completion; returns the process exit code. ``dry_run``: load and
    validate the config exactly as a run would, print it (``forge.config.describe``) and
    return without making a run directory or starting anything."""
    from forge.config import dump_config
    from forge.run.ownership import check_run_dir

    if resume:
        rdir = Path(resume)
        if not (rdir / "config.yaml").is_file():
            raise ValueError(f"--resume {resume}: no config.yaml there; is it a run directory?")
        # another user's directory: refused before anything is read; links resolved, and
        # the run reads the directory that was checked
        rdir = check_run_dir(rdir)
        module, cfg = load_app(config_path or rdir / "config.yaml", overrides)
    else:
        if not config_path:
            raise ValueError("forge run needs --config <yaml> (or --resume <run_dir>)")
        module, cfg = load_app(config_path, overrides)
    if dry_run:
        from forge.config.describe import show_config

        sys.stdout.write(show_config(cfg))
        return 0
    if not resume:
        rdir = Path(run_dir) if run_dir else new_run_dir(cfg.app)
        rdir.mkdir(parents=True, exist_ok=True)
    dump_config(cfg, rdir / "config.yaml")
    print(f"[forge] run directory: {rdir}", flush=True)
    from forge.run.actors import prefork_actor_zygote

    # The actors' zygote forked from here (FORGE_PREFORK=0: not), with the config's thread
    # settings where it has them at its top (an RL or SFT config), the defaults otherwise.
    prefork_actor_zygote(getattr(cfg, "threads_per_actor", 0), getattr(cfg, "deterministic", False))
    try:
        loops.run(_run(module, cfg, rdir, bool(resume)))
    except KeyboardInterrupt:
        print("[forge] interrupted; all processes stopped", flush=True)
        return 130
    except ForgeRuntimeError as e:  # a process died, a service gave up, ...: say what, and how
        print(
            f"forge run: error: {type(e).__name__}: {e}\n"
            f"forge run: all processes stopped; continue from the last checkpoint with:\n"
            f"    forge run --resume {rdir}",
            file=sys.stderr,
            flush=True,
        )
        return 1
    return 0


async def _run(module, cfg, run_dir: Path, resume: bool) -> None:
    from controller import shutdown
    from forge.observability.status import run_status

    try:
        with run_status(run_dir, app=cfg.app):  # <run_dir>/status.json for `forge top`
            await module.run(cfg, run_dir, resume)
    finally:
        # Also on an exception or Ctrl-C (CancelledError): stop every actor we spawned.
        await asyncio.shield(asyncio.ensure_future(shutdown()))
