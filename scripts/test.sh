#!/usr/bin/env bash
# Set up, then run the whole test suite: the fast tests, then the slow ones (real models,
# end-to-end runs) as a separate step. Extra arguments go to both pytest runs.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# The service suite also runs on Monarch proc meshes, so the tests install that extra too.
FORGE_EXTRAS=${FORGE_EXTRAS:-dev,monarch} bash scripts/setup.sh
echo "[test] fast tests"
"$PY" -m pytest -q -m "not slow" "$@"
echo "[test] slow tests"
set +e
"$PY" -m pytest -q -m slow "$@"
rc=$?
set -e
if [[ $rc -eq 5 ]]; then  # pytest: no slow tests collected
  echo "[test] no slow tests"
  rc=0
fi
exit $rc
