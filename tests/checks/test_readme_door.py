"""The README is a door and the docs reflect main, not history.

The README stays short (a word limit), keeps the tested quick start, then "Your own task"
(a data source, a reward and a YAML that really load: they are run here), and one results
table of at most four rows with short cells. Dates (``YYYY-MM-DD``) and commit hashes belong
to the dated history, ``docs/devlog.md``, and to the benchmark tables, where each current
figure names its commit: anywhere else in ``README.md`` or ``docs/*.md`` they are refused.
"""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO, script_env

README = REPO / "README.md"
MAX_WORDS = 1600
MAX_RESULT_ROWS = 4
MAX_CELL_WORDS = 16

# History lives here; dates and hashes are allowed anywhere in it.
HISTORY = "docs/devlog.md"
# Each benchmark's current table names the commit it ran on: hashes and dates are allowed in
# the markdown table rows of this file only, not in its prose.
TABLES = "docs/benchmarks.md"

DATE = re.compile(r"(?<!\d)\d{4}-\d{2}-\d{2}(?!\d)")
# A commit hash as written in prose: 7 to 40 lowercase hex characters with at least one digit
# and one letter (so neither a plain number nor a word like "deadbeef"), standing alone.
HASH = re.compile(r"(?<![\w/.#-])(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w-])")


def dated_or_hashed(path: str, text: str) -> list[str]:
    """``path:line: the date or hash`` for each one ``text`` (the file at ``path``, relative
    to the repository) holds where it may not."""
    if path == HISTORY:
        return []
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        if path == TABLES and line.lstrip().startswith("|"):
            continue
        for pattern in (DATE, HASH):
            found += [f"{path}:{number}: {m.group()}" for m in pattern.finditer(line)]
    return found


def _docs() -> list[Path]:
    return [README, *sorted((REPO / "docs").glob("*.md"))]


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def _blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def test_readme_is_short():
    words = len(README.read_text().split())
    assert words <= MAX_WORDS, (
        f"README.md has {words} words, more than {MAX_WORDS}: move detail to a page under "
        "docs/ and figures' history to docs/devlog.md"
    )


def test_readme_keeps_the_quick_start_then_your_own_task():
    text = README.read_text()
    quick = _section(text, "Quick start")
    assert "bash scripts/setup.sh && forge run --config apps/arith/smollm2.yaml\n" in quick
    assert "\nbash scripts/test.sh\n" in quick
    headings = re.findall(r"^## (.+)$", text, flags=re.M)
    assert headings[:2] == ["Quick start", "Your own task"], headings


def test_readme_has_one_short_results_table():
    results = _section(README.read_text(), "Results")
    rows = [line for line in results.splitlines() if line.startswith("|")]
    tables = sum(1 for row in rows if re.fullmatch(r"\|( *:?-+:? *\|)+", row.strip()))
    assert tables == 1, f"the Results section has {tables} tables; keep one"
    body = rows[2:]  # after the header and its rule
    assert 1 <= len(body) <= MAX_RESULT_ROWS, f"{len(body)} result rows; at most {MAX_RESULT_ROWS}"
    for row in body:
        for cell in row.strip("|").split("|"):
            assert len(cell.split()) <= MAX_CELL_WORDS, (
                f"a results cell of {len(cell.split())} words: {cell.strip()!r}; keep one "
                "figure per cell and put the detail in docs/benchmarks.md"
            )


def test_no_dates_or_commit_hashes_outside_the_history_and_benchmark_tables():
    found = []
    for path in _docs():
        found += dated_or_hashed(str(path.relative_to(REPO)), path.read_text())
    assert not found, (
        "dates and commit hashes belong in docs/devlog.md (history) or a table row of "
        "docs/benchmarks.md (a current figure's commit); found:\n" + "\n".join(found)
    )


@pytest.mark.parametrize(
    ("path", "line", "refused"),
    [
        ("README.md", "measured on 2026-11-29, quiet", True),
        ("README.md", "as shipped at f85ea86 (the skip)", True),
        ("docs/models.md", "| 0.140 -> 0.760 | f85ea86 |", True),  # a table, but not the tables
        ("docs/benchmarks.md", "On 2026-11-29 the machine changed.", True),  # prose there
        ("docs/benchmarks.md", "the run at 9e9fe4d5b1c2 went", True),
        ("docs/benchmarks.md", "| 0.120 -> 0.720 | AMD EPYC | 9e9fe4d |", False),
        ("docs/benchmarks.md", "| 2026-11-29 | 4cd0698 |", False),
        ("docs/devlog.md", "## 2026-11-29: a different CPU (6f5c39b)", False),
        ("README.md", "a 0xdeadbeef word, 1234567 rows, cafebabe, 2026 and 12-07", False),
        ("README.md", "the file forge-w-ab12cd34ef-v3 and docs/x.md#a1b2c3d4", False),
    ],
)
def test_the_date_and_hash_rule_on_neighbouring_cases(path, line, refused):
    assert bool(dated_or_hashed(path, line)) is refused


def test_your_own_task_loads_and_scores(tmp_path):
    """The section's Python and YAML, written to files as the section says, load: the data
    source gives prompts and targets that the reward scores, and ``forge run --dry-run``
    validates the YAML (import strings, signatures, every key) without starting anything."""
    section = _section(README.read_text(), "Your own task")
    (python,) = _blocks(section, "python")
    (config,) = _blocks(section, "yaml")
    assert python.startswith("# mytask.py") and config.startswith("# mytask.yaml")
    assert len(config.splitlines()) <= 25
    (tmp_path / "mytask.py").write_text(python)
    (tmp_path / "mytask.yaml").write_text(config)

    sys.path.insert(0, str(tmp_path))
    try:
        task = importlib.import_module("mytask")
        source = task.Doubling(seed=0)
        item, held = source.sample(), source.heldout()
        assert held and held == task.Doubling(seed=1).heldout()  # its own seed
        assert task.correct(item["prompt"], f"It is {item['target']}.", item["target"]) == 1.0
        assert task.correct(item["prompt"], "It is 7.", item["target"]) == 0.0
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("mytask", None)

    env = script_env(PYTHONPATH=f"{REPO}:{tmp_path}")
    args = ["--config", str(tmp_path / "mytask.yaml"), "--run-dir", str(tmp_path / "run")]
    out = subprocess.run(
        [sys.executable, "-m", "forge.cli", "run", *args, "--dry-run"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=240,
    )
    assert out.returncode == 0, out.stderr
    assert "fn: mytask:Doubling" in out.stdout
    assert not (tmp_path / "run").exists()
