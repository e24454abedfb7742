#!/usr/bin/env bash
# Set up, then run the test tiers (tests/conftest.py says which folder is which): the fast
# tier (`-m "not slow"`: unit, checks, integration), then the slow one (`-m slow`: e2e,
# multihost) as a separate step, then the vLLM tier. Extra arguments go to both of those
# pytest runs. At the end (also when a step fails) it prints and writes a timings table, one
# row per test folder and per step, to $FORGE_TEST_TIMINGS (default test-timings.md).
#
# Every optional part that runs on a CPU is installed, so its tests run rather than skip:
# ray and monarch (the service suite also runs on Ray and on Monarch proc meshes), the titan
# trainer backend, the tensorboard and wandb metric backends, PEFT (LoRA), the tinker SDK
# (forge serve's tests), and the ecosystem environments' packages (reasoning-gym, verifiers,
# textarena, openenv-core). The vLLM tests (tests/vllm/) run last, from a virtual environment
# of their own (scripts/test_vllm.sh); FORGE_CI_VLLM=0 leaves them out.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TIMINGS=${FORGE_TEST_TIMINGS:-test-timings.md}
REPORTS=$(mktemp -d)
STEPS=()
SIDE=()  # process groups of the side venvs' builds

timings() {
  for pgid in "${SIDE[@]}"; do  # a side venv still building when a tier failed
    kill -- "-$pgid" 2>/dev/null || true
  done
  "$PY" scripts/test_timings.py "${STEPS[@]}" "$REPORTS"/*.xml | tee "$TIMINGS" || true
  rm -rf "$REPORTS"
}
trap timings EXIT

start=$SECONDS
FORGE_EXTRAS=${FORGE_EXTRAS:-dev,ray,monarch,titan,tensorboard,wandb,envs,lora,serve} bash scripts/setup.sh
echo "[test] setup took $((SECONDS - start)) s"
STEPS+=(--step "setup=$((SECONDS - start))")

# The side venvs are built beside the tiers, not before them: tinker-cookbook's (~40 s of pip
# on a fresh machine; its test needs it when the slow tier starts) beside the fast tier, and
# vLLM's (~170 s) beside the slow tier. Each is a few seconds once built.
setsid bash -c 'bash scripts/cookbook_venv.sh >"$1/cookbook-python" 2>"$1/cookbook-build.log" \
  || rm -f "$1/cookbook-python"' _ "$REPORTS" &
COOKBOOK_BUILD=$!
SIDE+=("$COOKBOOK_BUILD")

echo "[test] fast tier"
start=$SECONDS
set +e
# Three workers (pytest-xdist), one test file at a time each (--dist loadgroup with the groups
# tests/conftest.py gives them: a file's module fixtures are built once, and multihost/ stays
# on one worker). The fast tier waits on processes and sockets much of the time: 8:20 on one
# worker, 5:02 on two (1.7 cores busy), 4:11-4:26 on three (1.9 cores; 2026-11-27, quiet;
# benchmarks/ci_durations.md). FORGE_TEST_WORKERS=0: one.
"$PY" -m pytest -q -m "not slow" -n "${FORGE_TEST_WORKERS:-3}" --dist loadgroup \
  --junitxml="$REPORTS/fast.xml" "$@"
rc=$?
set -e
echo "[test] fast tier took $((SECONDS - start)) s"
STEPS+=(--step "fast tier=$((SECONDS - start))")
if [[ $rc -ne 0 ]]; then
  exit $rc
fi

echo "[test] slow tier"
start=$SECONDS
VLLM_ON=${FORGE_CI_VLLM:-1}
if [[ "$VLLM_ON" != 0 ]]; then
  setsid bash scripts/test_vllm.sh --build-only >"$REPORTS/vllm-build.log" 2>&1 &
  VLLM_BUILD=$!
  SIDE+=("$VLLM_BUILD")
fi
# tinker-cookbook's recipe runs from a venv of its own (it pins another transformers).
wait $COOKBOOK_BUILD || true
cat "$REPORTS/cookbook-build.log" >&2
TINKER_COOKBOOK_PYTHON=$(cat "$REPORTS/cookbook-python" 2>/dev/null) \
  || echo "[test] no cookbook venv: its test skips"
export TINKER_COOKBOOK_PYTHON
set +e
# The slow tier on two workers too (multihost/ on one of them: the simulated hosts take one
# user at a time); FORGE_SLOW_WORKERS=0 runs it on one.
"$PY" -m pytest -q -m slow -n "${FORGE_SLOW_WORKERS:-2}" --dist loadgroup \
  --junitxml="$REPORTS/slow.xml" "$@"
rc=$?
set -e
if [[ $rc -eq 5 ]]; then  # pytest: no slow tests collected
  echo "[test] no slow tests"
  rc=0
fi
echo "[test] slow tier took $((SECONDS - start)) s"
STEPS+=(--step "slow tier=$((SECONDS - start))")

if [[ "$VLLM_ON" != 0 ]]; then
  echo "[test] vllm tier"
  start=$SECONDS
  wait $VLLM_BUILD || echo "[test] building the vLLM venv failed (its log follows)"
  cat "$REPORTS/vllm-build.log"
  bash scripts/test_vllm.sh --junitxml="$REPORTS/vllm.xml" || rc=$?
  echo "[test] vllm tier took $((SECONDS - start)) s"
  STEPS+=(--step "vllm tier=$((SECONDS - start))")
fi
exit $rc
