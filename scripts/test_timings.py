"""The timings table of a CI run: one row per test folder (tier), read from pytest's JUnit XML
reports, then the wall time of each step of scripts/test.sh.

    python scripts/test_timings.py --step setup=61 --step fast=352 reports/*.xml

Then the slowest tests (``--slowest N``, default 15): where a step's wall time goes.
A folder's seconds are the sum of its tests' times (setup, call and teardown, as pytest
reports them; a module's fixtures count towards its first test), so they add up to a little
less than the step's wall time, which also holds collection and interpreter start-up.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

# Tiers with sub-folders get a row per sub-folder (integration/controller, e2e/apps, ...).
NESTED = {"integration", "e2e"}


def folder_of(classname: str) -> str:
    """``tests.integration.controller.test_calls`` -> ``integration/controller``."""
    parts = [p for p in classname.split(".") if p]
    if parts and parts[0] == "tests":
        parts = parts[1:]
    if not parts:
        return "(outside a test: collection, session)"
    if parts[0] in NESTED and len(parts) > 2:
        return f"{parts[0]}/{parts[1]}"
    return parts[0]


def cases(paths: list[Path]) -> list[ET.Element]:
    """Every ``testcase`` element of the reports."""
    return [case for path in paths for case in ET.parse(path).getroot().iter("testcase")]


def slowest(paths: list[Path], n: int) -> str:
    """A table of the ``n`` longest tests (setup + call + teardown), longest first."""
    timed = [(float(c.get("time", 0) or 0), c) for c in cases(paths)]
    timed = sorted(timed, key=lambda t: -t[0])[:n]
    if not timed:
        return ""
    out = ["", "| slowest tests | seconds |", "|---|---:|"]
    for secs, c in timed:
        path = c.get("classname", "").removeprefix("tests.").replace(".", "/")
        out.append(f"| {path}::{c.get('name', '').split('@')[0]} | {secs:.0f} |")
    return "\n".join(out) + "\n"


def read(paths: list[Path]) -> dict[str, dict[str, float]]:
    rows: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for case in cases(paths):
        row = rows[folder_of(case.get("classname", ""))]
        row["tests"] += 1
        row["seconds"] += float(case.get("time", 0) or 0)
        kinds = {child.tag for child in case}
        if kinds & {"failure", "error"}:
            row["failed"] += 1
        elif "skipped" in kinds:
            row["skipped"] += 1
    return rows


def table(rows: dict[str, dict[str, float]], steps: list[tuple[str, float]]) -> str:
    out = [
        "| tier (folder) | tests | skipped | failed | seconds |",
        "|---|---:|---:|---:|---:|",
    ]
    for name in sorted(rows):
        r = rows[name]
        out.append(
            f"| {name} | {int(r['tests'])} | {int(r['skipped'])} | {int(r['failed'])} "
            f"| {r['seconds']:.0f} |"
        )
    if steps:
        out += ["", "| step (wall) | seconds | minutes |", "|---|---:|---:|"]
        for name, s in steps + [("total", sum(s for _, s in steps))]:
            out.append(f"| {name} | {s:.0f} | {s / 60:.1f} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("reports", nargs="*", type=Path, help="pytest --junitxml files")
    p.add_argument("--step", action="append", default=[], help="NAME=SECONDS, in order")
    p.add_argument("--slowest", type=int, default=15, help="list the N longest tests (0: none)")
    args = p.parse_args(argv)
    steps = []
    for s in args.step:
        name, _, secs = s.partition("=")
        steps.append((name, float(secs)))
    reports = [r for r in args.reports if r.exists()]
    sys.stdout.write(table(read(reports), steps))
    if args.slowest > 0:
        sys.stdout.write(slowest(reports, args.slowest))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
