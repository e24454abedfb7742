#!/usr/bin/env bash
# The GPU check of issue 35 (benchmarks/gpu_check.py): GRPO on a model of Qwen2-0.5B's shapes
# with random weights, colocated (time-sliced) and then split by memory, hf engine in bf16;
# with 2+ GPUs also the NCCL weight broadcast. Needs one GPU, no network, and only torch,
# transformers and peft installed; everything else comes from this working tree. Under 8
# minutes on one GPU. Extra arguments go to the script (e.g. --steps 4).
#
#   bash scripts/gpu_check.sh                 # prints per-step lines, then a JSON report
#   bash scripts/gpu_check.sh --cpu-smoke     # the tiny CPU run the tests use
#
# Write the figures into docs/benchmarks.md with the card's name (the first line printed).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1  # nothing is downloaded
PY=${PYTHON:-python3}
if [[ " $* " != *" --cpu-smoke "* ]]; then
  if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "gpu_check: no GPU visible (torch.cuda.is_available() is False); run it on a GPU" \
      "machine, or pass --cpu-smoke for the CPU test of the script" >&2
    exit 2
  fi
fi
exec timeout 480 "$PY" -m benchmarks.gpu_check "$@"
