#!/usr/bin/env bash
# The mutation pass over the RL maths (docs/rl_maths.md, "Mutation pass"): mutmut 3.8.1
# mutates forge/losses' advantage, KL, aggregation, policy-gradient and TIS code and the
# trainer's batching helpers, and runs the unit tests of those modules against each mutant.
#
#   pip install 'mutmut==3.8.1'     # or a venv with --system-site-packages
#   bash scripts/mutation_pass.sh [WORK_DIR]      # then: cd WORK_DIR && mutmut results
#
# mutmut rewrites the files it mutates, so it runs on a copy of the committed tree (HEAD) in
# WORK_DIR (default: a new temp dir), never in the checkout. Lines that raise an error or warn
# are not mutated (their messages are not maths; the conditions around them are).
set -euo pipefail
cd "$(dirname "$0")/.."
MUTMUT=${MUTMUT:-mutmut}
WORK=${1:-$(mktemp -d /tmp/forge-mutation-XXXXXX)}
mkdir -p "$WORK"
git archive HEAD | tar -x -C "$WORK"
cd "$WORK"
cat >setup.cfg <<'CFG'
[mutmut]
source_paths=forge
only_mutate=
    forge/losses/advantages.py
    forge/losses/distill.py
    forge/losses/gkd.py
    forge/losses/kl.py
    forge/losses/normalize.py
    forge/losses/policy_gradient.py
    forge/losses/tis.py
    forge/training/trainer_core.py
    forge/training/micro_batches.py
do_not_mutate_patterns=
    raise \w+\(
    warnings\.warn\(
also_copy=
    controller
    apps
    benchmarks
    docs
    scripts
    deploy
    README.md
pytest_add_cli_args=
    -p
    no:cacheprovider
    -q
    -n
    0
pytest_add_cli_args_test_selection=
    tests/unit/test_losses.py
    tests/unit/test_loss_invariants.py
    tests/unit/test_rl_maths_guards.py
    tests/unit/test_advantages.py
    tests/unit/test_gkd.py
    tests/unit/test_distill.py
CFG
ls tests/unit/test_mutants_*.py >/dev/null 2>&1 &&
  printf '    %s\n' tests/unit/test_mutants_*.py >>setup.cfg
echo "[mutation] $WORK" >&2
# trainer_core: only the batching helpers (micro-batch cuts, token caps, denominators, metric
# folding), against their unit tests; train_step/accumulate are left to the model-level
# equivalence tests (tests/unit/test_trainer_core.py), minutes per mutant on 2 cores.
T=forge.training.trainer_core
M=forge.training.micro_batches
"$MUTMUT" run --max-children "${MAX_CHILDREN:-2}" "forge.losses.*" \
  "$T.x_loss_denominator*" "$T.x_fold_metrics*" "$T.x__over_trained_rows*" "$M.x_micro_rows*" \
  "$M.x_token_cap*" "$M.x_length_cuts*"
