"""``forge top [RUN_DIR]``: a live view of a run, read from its ``status.json``.

    forge top                      # the newest run under $FORGE_RUN_DIR (default runs/)
    forge top runs/sumdigits-...   # that run; also works once it has finished or crashed
    forge top RUN_DIR --once       # print one frame and exit (scripts, tests)

The run's controller rewrites ``<run_dir>/status.json`` about once a second
(``forge/observability/status.py``); this command only reads that file, so it needs no open
port and shows a finished or crashed run as it ended. The frame itself is
``forge/observability/status_view.py``'s (notebooks show the same one).
"""

from __future__ import annotations

import time

from rich.console import Console, RenderableType
from rich.panel import Panel
from rich.text import Text

from forge.observability.status_view import find_status_file, load_status, render

__all__ = ["find_status_file", "load_status", "main", "render"]


def main(run_dir: str | None, once: bool = False, interval: float = 1.0) -> int:
    """The ``forge top`` command; returns the exit code."""
    if interval <= 0:
        raise ValueError(f"--interval must be > 0 seconds, got {interval}")
    path = find_status_file(run_dir)
    console = Console()
    if once:
        console.print(render(load_status(path), path))
        return 0
    from rich.live import Live

    def frame() -> RenderableType:
        try:
            return render(load_status(path), path)
        except ValueError as e:  # no file yet, or not a snapshot
            return Panel(Text(str(e), style="yellow"), title="forge top", title_align="left")
        except Exception as e:  # noqa: BLE001 - shown, and the view keeps refreshing
            msg = f"cannot render {path}: {type(e).__name__}: {e}"
            return Panel(Text(msg, style="red"), title="forge top", title_align="left")

    try:
        with Live(frame(), console=console, screen=True, auto_refresh=False) as live:
            while True:
                time.sleep(interval)
                live.update(frame(), refresh=True)
    except KeyboardInterrupt:
        pass
    return 0
