"""The frame ``forge top`` shows, from a run's ``status.json`` snapshot (or this process's
runtime, ``forge.notebook.status``): find the file, check it, render it with ``rich``.

The snapshot's writer is ``forge/observability/status.py``; the command that refreshes the
frame in a terminal is ``forge/cli/top.py``. A snapshot that stopped changing while still
marked running (the controller was killed) is shown as not updating.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from controller import pid_alive
from forge import settings
from forge.observability.status import STATUS_FILE

__all__ = ["find_status_file", "load_status", "render"]

_SPARK = "▁▂▃▄▅▆▇█"
_STATE_STYLE = {
    "running": "bold green",
    "finished": "bold blue",
    "crashed": "bold red",
    "interrupted": "bold yellow",
}
_REPLICA_STYLE = {"healthy": "green", "unhealthy": "red", "recovering": "yellow"}


def find_status_file(run_dir: str | Path | None) -> Path:
    """The status file of ``run_dir`` (a run directory or the file itself); with ``None``:
    ``./status.json`` if present, else the newest ``<FORGE_RUN_DIR>/*/status.json``."""
    if run_dir is not None:
        p = Path(run_dir)
        if p.is_dir():
            return p / STATUS_FILE
        if p.is_file():
            return p
        raise ValueError(f"{run_dir}: no such run directory (give the path `forge run` printed)")
    here = Path.cwd() / STATUS_FILE
    if here.is_file():
        return here
    root = settings.get_run_dir()
    found = sorted(root.glob(f"*/{STATUS_FILE}"), key=lambda f: f.stat().st_mtime)
    if not found:
        raise ValueError(
            f"no run directory with a {STATUS_FILE} under {root.resolve()}; pass RUN_DIR "
            "(the path `forge run` printed) or set FORGE_RUN_DIR"
        )
    return found[-1]


def load_status(path: Path) -> dict[str, Any]:
    """Read and check one snapshot; ``ValueError`` naming the file if it is not one."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{path}: no status file yet (has the run started?)") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not a status snapshot ({e})") from None
    if not isinstance(data, dict) or "format" not in data or "state" not in data:
        raise ValueError(f"{path}: not a status snapshot written by `forge run`")
    return data


def _ago(seconds: float) -> str:
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"

    return True


def _liveness(snap: dict[str, Any], now: float) -> Text:
    """The run's state, with 'not updating' for a running snapshot that went stale."""
    state = snap["state"]
    age = now - snap.get("updated_at", now)
    text = Text(state.upper(), style=_STATE_STYLE.get(state, "bold"))
    if state == "running" and age > max(3 * snap.get("interval_s", 1.0), 5.0):
        gone = snap.get("host") == socket.gethostname() and not pid_alive(
            snap.get("pid", 0), snap.get("pid_start")
        )  # (a number reused by a later process or thread since is not the run)
        why = f"process {snap.get('pid')} is gone" if gone else "controller stalled or killed"
        text = Text(f"NOT UPDATING ({why})", style="bold red")
    text.append(f"  updated {_ago(age)} ago", style="dim")
    return text


def _spark(values: list[float]) -> str:
    if not values:
        return ""
    lo, hi = min(values), max(values)
    span = (hi - lo) or 1.0
    return "".join(_SPARK[int((v - lo) / span * (len(_SPARK) - 1))] for v in values)


def _bar(frac: float, width: int = 20) -> str:
    n = round(max(0.0, min(1.0, frac)) * width)
    return "█" * n + "·" * (width - n)


def _fmt(v: Any) -> str:
    """A number short enough for a table cell: ints as ints, others to ~4 digits."""
    if v is None:
        return "-"
    if isinstance(v, float):
        if v.is_integer() and abs(v) < 1e15:
            return str(int(v))
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        return f"{v:.4g}"
    return str(v)


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}" if v >= 10 else f"{v:.1f}"


def _train_item(key: str, v: float) -> str:
    """``time/train_s 0.32`` -> ``train 0.32s``; ``train/loss`` -> ``loss``."""
    name = key.split("/", 1)[-1].replace("_per_s", "/s")
    if key.startswith("time/"):
        secs = f"{v:.2f}s" if v >= 0.1 else f"{1000 * v:.0f}ms"
        return f"{name.removesuffix('_s').replace('_', ' ')} {secs}"
    return f"{name.replace('_', ' ')} {_fmt(v)}"


def _header(snap: dict[str, Any], path: Path, now: float) -> Text:
    info = snap.get("info", {})
    t = Text()
    t.append(f"{info.get('app', '?')}", style="bold")
    t.append(f"  {path.parent}  pid {snap.get('pid')}  up ")
    t.append(_ago(snap.get("updated_at", now) - snap.get("started_at", now)))
    t.append("  ")
    t.append_text(_liveness(snap, now))
    return t


def _progress(rl: dict[str, Any]) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold cyan", no_wrap=True)
    grid.add_column()
    step, total = rl.get("step", 0), rl.get("steps_total")
    line = f"{rl.get('stage', '?')}  step {step}" + (f"/{total}" if total else "")
    if total:
        line += f"  {_bar(step / total)} {100 * step / total:.0f}%"
    rate = rl.get("steps_per_s")
    if rate:
        line += f"  {rate:.2f} steps/s"
        if total and step < total:
            line += f"  ETA {_ago((total - step) / rate)}"
    grid.add_row("progress", line)
    versions = rl.get("generator_versions") or {}
    tv = rl.get("trainer_version")
    if tv is not None or versions:
        w = Text(f"trainer v{_fmt(tv)}")
        for idx, v in sorted(versions.items(), key=lambda kv: int(kv[0])):
            lag = (tv - v) if isinstance(tv, int) else 0
            w.append(f"  generator r{idx} v{v}", style="yellow" if lag > 1 else "")
            if lag:
                w.append(f" ({lag} behind)", style="dim")
        grid.add_row("weights", w)
    rewards = rl.get("rewards") or {}
    if rewards:
        r = "  ".join(
            f"{k.removeprefix('rollout/reward').lstrip('/') or 'mean'} {v:.3f}"
            for k, v in rewards.items()
        )
        grid.add_row("reward", f"{r}  {_spark(rl.get('reward_history') or [])}")
    ev = rl.get("eval")
    if ev:
        vals = "  ".join(
            f"{k.removeprefix('eval/')} {v:.3f}" for k, v in ev.items() if _headline_eval(k)
        )
        grid.add_row("last eval", f"step {ev['step']}: {vals}")
    buf = rl.get("buffer") or {}
    if buf:
        grid.add_row(
            "replay", "  ".join(f"{k.replace('_', ' ')} {_fmt(v)}" for k, v in buf.items())
        )
    busy = rl.get("busy") or {}
    if busy:
        grid.add_row(
            "busy", "  ".join(f"{k} {_bar(v, 10)} {100 * v:.0f}%" for k, v in sorted(busy.items()))
        )
    train = rl.get("train") or {}
    if train:
        grid.add_row("train", "  ".join(_train_item(k, v) for k, v in train.items()))
    memory = rl.get("memory") or {}  # time-sliced colocation: MiB at each phase end
    if memory:
        grid.add_row(
            "memory",
            "  ".join(
                f"{role} " + " ".join(f"{phase} {v:.0f}M" for phase, v in phases.items())
                for role, phases in sorted(memory.items())
            ),
        )
    return grid


def _table(title: str, columns: tuple[str, ...]) -> Table:
    """A compact table; ``columns`` may use two-line headers ("in\\nflight") to stay narrow."""
    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    t.padding = (0, 1, 0, 0)
    for col in columns:
        t.add_column(col, no_wrap=True)
    return t


def _fit(t: Table, keep: tuple[int, ...]) -> Table:
    """Columns ``keep`` (names, states, pids) are never cut short; numbers give way first."""
    for i in keep:
        col = t.columns[i]
        col.min_width = max([len(str(c)) for c in col._cells] + [len(str(col.header))])
    return t


def _services(snap: dict[str, Any]) -> RenderableType:
    """One row per replica; last errors below the table (they are long)."""
    t = _table(
        "services",
        (
            "service",
            "rep",
            "state",
            "pid",
            "in\nflight",
            "queued",
            "reqs",
            "fail",
            "re-\nstarts",
            "p50\nms",
        ),
    )
    errors = Text()
    for svc in snap.get("services", []):
        for i, r in enumerate(svc.get("replicas", [])):
            state = r.get("state", "?")
            failed, restarts = r.get("requests_failed", 0), r.get("restarts", 0)
            t.add_row(
                svc["name"] if i == 0 else "",
                str(r.get("index")),
                Text(state, style=_REPLICA_STYLE.get(state, "dim")),
                _pids(r.get("pids", []), r.get("hosts") or []),
                str(r.get("in_flight", 0)),
                str(r.get("queued", 0)),
                str(r.get("requests_total", 0)),
                Text(str(failed), style="red" if failed else ""),
                Text(str(restarts), style="yellow" if restarts else ""),
                _ms(r.get("latency_p50_ms")),
            )
            if r.get("last_error"):
                errors.append(f"{svc['name']} replica {r.get('index')}: ", style="bold")
                errors.append(r["last_error"] + "\n", style="red")
    _fit(t, (0, 2, 3))
    if not errors:
        return t
    return Group(t, Text("last errors", style="italic"), errors)


def _pids(pids: list, hosts: list) -> str:
    """``pid`` on the controller's host, ``pid@host`` on another (the Ray backend's ranks)."""
    out = [f"{p}@{h}" if h else str(p) for p, h in zip(pids, [*hosts, *[None] * len(pids)])]
    return ",".join(out) or "-"


def _meshes(snap: dict[str, Any]) -> Table:
    t = _table("meshes", ("mesh", "ranks", "pids", "alive"))
    for m in snap.get("meshes", []):
        ranks = m.get("ranks", [])
        alive = sum(r.get("alive", False) for r in ranks)
        dead = [f"rank {r['rank']}: {r.get('exit')}" for r in ranks if not r.get("alive")]
        t.add_row(
            m["name"],
            str(len(ranks)),
            _pids([r.get("pid") for r in ranks], [r.get("host") for r in ranks]),
            Text(
                f"{alive}/{len(ranks)}" + (f" ({'; '.join(dead)})" if dead else ""),
                style="green" if alive == len(ranks) else "red",
            ),
        )
    return _fit(t, (0, 2))


def render(snap: dict[str, Any], path: Path | str = STATUS_FILE, now: float | None = None) -> Panel:
    """One frame for snapshot ``snap`` (read from ``path``) as a rich renderable."""
    now = time.time() if now is None else now
    path = Path(path)
    parts: list[RenderableType] = [_header(snap, path, now)]
    rl = (snap.get("extra") or {}).get("rl")
    if rl:
        parts += [Text(""), _progress(rl)]
        for alert in rl.get("alerts") or []:
            parts.append(Text(f"warning: {alert}", style="bold yellow"))
    if snap.get("services"):
        parts += [Text(""), _services(snap)]
    if snap.get("meshes"):
        parts += [Text(""), _meshes(snap)]
    if snap.get("error"):
        body = Text(snap["error"], style="bold red")
        tb = (snap.get("traceback") or "").strip().splitlines()[-12:]
        if tb:
            body.append("\n" + "\n".join(tb), style="red")
        parts += [Text(""), Panel(body, title=snap["state"], border_style="red")]
    return Panel(Group(*parts), title="forge top", title_align="left")


def _headline_eval(key: str) -> bool:
    """The evaluation values worth a glance: the run's own held-out score and turns, and
    each named set's pass@k and mean reward (not its counts and finish reasons)."""
    if key.count("/") < 2:
        return key != "step"
    return key.rsplit("/", 1)[-1].startswith("pass@") or key.endswith("/reward")
