#!/usr/bin/env bash
# Set up, then run the whole test suite: the fast tests, then the slow ones (real models,
# end-to-end runs) as a separate step. Extra arguments go to both of those pytest runs.
#
# Every optional part that runs on a CPU is installed, so its tests run rather than skip:
# ray and monarch (the service suite also runs on Ray and on Monarch proc meshes), the titan
# trainer backend, the tensorboard and wandb metric backends, PEFT (LoRA), the tinker SDK (forge serve's tests), and the ecosystem
# environments' packages (reasoning-gym, verifiers, textarena, openenv-core). The vLLM generator tests run
# last, from a virtual environment of their own (scripts/test_vllm.sh); FORGE_CI_VLLM=0 leaves
# them out.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
start=$SECONDS
FORGE_EXTRAS=${FORGE_EXTRAS:-dev,ray,monarch,titan,tensorboard,wandb,envs,lora,serve} bash scripts/setup.sh
echo "[test] setup took $((SECONDS - start)) s"

echo "[test] fast tests"
start=$SECONDS
"$PY" -m pytest -q -m "not slow" "$@"
echo "[test] fast tests took $((SECONDS - start)) s"

echo "[test] slow tests"
start=$SECONDS
# tinker-cookbook's recipe runs from a venv of its own (it pins another transformers).
TINKER_COOKBOOK_PYTHON=$(bash scripts/cookbook_venv.sh) || echo "[test] no cookbook venv: its test skips"
export TINKER_COOKBOOK_PYTHON
set +e
"$PY" -m pytest -q -m slow "$@"
rc=$?
set -e
if [[ $rc -eq 5 ]]; then  # pytest: no slow tests collected
  echo "[test] no slow tests"
  rc=0
fi
echo "[test] slow tests took $((SECONDS - start)) s"

if [[ "${FORGE_CI_VLLM:-1}" != 0 ]]; then
  echo "[test] vllm tests"
  start=$SECONDS
  bash scripts/test_vllm.sh || rc=$?
  echo "[test] vllm tests took $((SECONDS - start)) s"
fi
exit $rc
