"""Code reads as ``ruff format`` writes it: no ``# fmt: skip``, ``# fmt: off`` or
``# fmt: on`` in the Python files of the repository's packages, tests, benchmarks and scripts
(packing several statements on a line to meet a length target is what they were used for;
let the formatter write the code and the length be what it is)."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

from tests.helpers import REPO

DIRS = ["forge", "controller", "apps", "tests", "benchmarks", "scripts"]
PRAGMA = re.compile(r"#\s*fmt\s*:\s*(skip|off|on)\b", re.IGNORECASE)


def pragmas(source: str) -> list[int]:
    """The lines of ``source`` whose comments turn the formatter off (comments only: a string
    that mentions the pragma, like this module's, is not one)."""
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return [t.start[0] for t in tokens if t.type == tokenize.COMMENT and PRAGMA.search(t.string)]


def python_files() -> list[Path]:
    return sorted(p for d in DIRS for p in (REPO / d).rglob("*.py") if "__pycache__" not in p.parts)


def test_the_pragma_finder_sees_comments_and_ignores_strings():
    source = 'x = [1,2]  # fmt: skip\ns = "# fmt: off"\n# fmt:off\ny = 1\n#   FMT: on\n'
    assert pragmas(source) == [1, 3, 5]


def test_no_file_turns_the_formatter_off():
    found = {
        str(path.relative_to(REPO)): lines
        for path in python_files()
        if (lines := pragmas(path.read_text(encoding="utf-8")))
    }
    assert found == {}, (
        "remove these '# fmt: skip' / '# fmt: off' comments and run `ruff format` on the files "
        "(CONTRIBUTING.md: code reads as ruff formats it)"
    )
