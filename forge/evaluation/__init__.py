"""Evaluation: named sets (``EvalSet``), the harness that scores a policy on them
(``evaluate_set``: pass@k, rewards by component, turns, finish reasons), and ``forge eval``
(``forge.cli.eval``) that runs them on a saved policy."""

from forge.evaluation.harness import Defaults, evaluate_set, pass_at_k
from forge.evaluation.sets import EvalSet

__all__ = ["Defaults", "EvalSet", "evaluate_set", "pass_at_k"]
