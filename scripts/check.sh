#!/usr/bin/env bash
# The checks tier by hand: lint, format and types (tests/checks runs the same under pytest).
# pyright's files and settings are pyproject.toml's [tool.pyright]: controller/, forge/run/,
# apps/ (the Tinker loops excepted, reason there) and tests/checks/typed_handles.py (what a
# type checker must see of actor handles).
set -euo pipefail
cd "$(dirname "$0")/.."
PATHS=(controller forge apps tests benchmarks)
ruff check "${PATHS[@]}"
ruff format --check "${PATHS[@]}"
if command -v pyright >/dev/null; then
  pyright
else
  echo "[check] pyright is not installed (pip install -e '.[dev]'): types not checked" >&2
  exit 1
fi
