#!/usr/bin/env bash
# Build (once) the virtual environment the tinker-cookbook test runs its recipe from, and
# print its python. tinker-cookbook 0.5.8 pins transformers 5.5.4 and huggingface_hub, so it
# stays out of the main environment; the venv sees the main environment's packages
# (--system-site-packages) and lives in ~/.cache/forge/cookbook-venv, so a fresh clone on the
# same machine reuses it (building it took ~60 s on the 2-core machine).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${XDG_CACHE_HOME:-$HOME/.cache}/forge/cookbook-venv
stamp=$(sha256sum scripts/cookbook_venv.sh | cut -c1-16)
if [[ "$(cat "$VENV/forge-stamp" 2>/dev/null)" != "$stamp" ]]; then
  echo "[cookbook] building $VENV (tinker-cookbook 0.5.8)" >&2
  rm -rf "$VENV"
  "$PY" -m venv --system-site-packages "$VENV"
  PIP_ROOT_USER_ACTION=ignore "$VENV/bin/python" -m pip install --disable-pip-version-check -q \
    "tinker==0.38.0" "tinker-cookbook==0.5.8" sympy pylatexenc math-verify >&2
  echo "$stamp" >"$VENV/forge-stamp"
fi
echo "$VENV/bin/python"
