"""Training schedules: switch the loss, its KL coefficient or the algorithm at given steps.

A run's ``phases`` section lists, by the step from which each applies, partial overrides of
the loss config and of the app's rollout settings::

    phases:
      - {at: 0,  loss: {type: grpo, kl_coef: 0.2}}
      - {at: 30, loss: {kl_coef: 0.05}}
      - {at: 60, name: explore, loss: {clip_eps_high: 0.28, aggregation: token_mean},
         rollout: {filter: nonzero_variance, over_sampling_factor: 2.0}}

Overrides are cumulative: phase ``i`` starts from the loss config in force before it (the
run's base ``LossConfig`` for the first phase) and replaces only the fields it names, so at
step 60 above the loss is grpo with ``kl_coef=0.05`` and ``clip_eps_high=0.28``. Set a field
to ``null`` to fall back to the loss type's default (``clip_eps_*``, ``aggregation``).
Rollout overrides merge the same way (nested dicts key by key); they are opaque here and the
app validates their keys against its own rollout settings.

Everything is checked up front by :func:`validate_phases` (steps, unknown loss keys, every
cumulative ``LossConfig`` valid), so a typo in phase 3 fails before any process starts. The
app then asks a :class:`PhaseTracker` each step::

    tracker = PhaseTracker(cfg.phases, cfg.trainer.loss)
    for step in range(start_step, total_steps):
        # the first step (0, or where a resumed run restarts) takes the phase in force
        phase = tracker.current(step) if step == start_step else tracker.changes(step)
        if phase is not None:
            log.info(phase.describe())           # the app logs each phase as it starts
            await trainer.set_loss.call(phase.loss)
            apply_rollout_overrides(phase.rollout)
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from forge.losses import LossConfig

__all__ = ["Phase", "PhaseConfig", "PhaseTracker", "resolve_phases", "validate_phases"]


@dataclass
class PhaseConfig:
    """One entry of a ``phases`` section (see the module docstring)."""

    at: int
    """The first step (0-based, the app's training step counter) it applies to."""
    loss: dict[str, Any] = field(default_factory=dict)
    """``LossConfig`` fields to override from step ``at`` on."""
    rollout: dict[str, Any] = field(default_factory=dict)
    """The app's rollout settings to override (keys checked by the app)."""
    name: str = ""
    """A label for logs."""


@dataclass(frozen=True)
class Phase:
    """A phase resolved against everything before it.

    ``index``: position in the ``phases`` list. ``loss``: the full ``LossConfig`` in force
    from step ``at`` on. ``rollout``: every rollout override of this and earlier phases,
    merged. ``loss_overrides`` / ``rollout_overrides``: what this phase itself set.
    """

    index: int
    at: int
    name: str
    loss: LossConfig
    rollout: dict[str, Any]
    loss_overrides: dict[str, Any]
    rollout_overrides: dict[str, Any]

    def describe(self) -> str:
        """One log line: ``phase 2 'explore' from step 60: loss {...} -> LossConfig(...)``."""
        label = f" {self.name!r}" if self.name else ""
        text = f"phase {self.index}{label} from step {self.at}: loss {self.loss_overrides} -> "
        text += repr(self.loss)
        if self.rollout_overrides:
            text += f"; rollout {self.rollout_overrides} -> {self.rollout}"
        return text


def _merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` updated by ``over``, recursing into values that are dicts on both sides."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _as_phase_config(i: int, phase: PhaseConfig | Mapping[str, Any]) -> PhaseConfig:
    if isinstance(phase, PhaseConfig):
        return phase
    if isinstance(phase, Mapping):
        from forge.config.schema import config_from_dict

        return config_from_dict(PhaseConfig, phase, source=f"phases[{i}]")
    raise TypeError(
        f"phases[{i}] must be a PhaseConfig or a dict with keys at, loss, rollout, name; "
        f"got {type(phase).__name__}"
    )


def _check_loss_keys(i: int, overrides: dict[str, Any]) -> None:
    names = [f.name for f in dataclasses.fields(LossConfig)]
    for key in overrides:
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(
                f"phases[{i}].loss.{key}: not a LossConfig field{hint}; choose from {names}"
            )


def resolve_phases(
    phases: Sequence[PhaseConfig | Mapping[str, Any]], base_loss: LossConfig
) -> list[Phase]:
    """Check ``phases`` (as :func:`validate_phases`) and resolve each against the ones before
    it, starting from ``base_loss``."""
    if not isinstance(base_loss, LossConfig):
        raise TypeError(f"base_loss must be a LossConfig, got {type(base_loss).__name__}")
    loss, rollout, out = base_loss, {}, []
    for i, raw in enumerate(phases):
        p = _as_phase_config(i, raw)
        if isinstance(p.at, bool) or not isinstance(p.at, int):
            raise TypeError(f"phases[{i}].at must be an int (a training step), got {p.at!r}")
        if p.at < 0:
            raise ValueError(f"phases[{i}].at must be >= 0, got {p.at}")
        if out and p.at <= out[-1].at:
            raise ValueError(
                f"phases[{i}].at = {p.at} is not after phases[{i - 1}].at = {out[-1].at}; "
                "list phases by strictly increasing step"
            )
        for key in ("loss", "rollout"):
            if not isinstance(getattr(p, key), Mapping):
                raise TypeError(
                    f"phases[{i}].{key} must be a dict of overrides, got "
                    f"{type(getattr(p, key)).__name__}"
                )
        _check_loss_keys(i, p.loss)
        try:
            loss = dataclasses.replace(loss, **p.loss)
        except (TypeError, ValueError) as e:
            raise ValueError(f"phases[{i}].loss (cumulative from the phases before): {e}") from e
        rollout = _merge(rollout, p.rollout)
        out.append(Phase(i, p.at, p.name, loss, rollout, dict(p.loss), dict(p.rollout)))
    return out


def validate_phases(
    phases: Sequence[PhaseConfig | Mapping[str, Any]], base_loss: LossConfig
) -> None:
    """Raise ``ValueError`` / ``TypeError`` naming ``phases[i]...`` for the first problem:
    steps not ``>= 0`` and strictly increasing, an unknown loss key (the message lists
    ``LossConfig``'s fields), or a cumulative loss config ``LossConfig`` rejects."""
    resolve_phases(phases, base_loss)


class PhaseTracker:
    """Which phase starts at, or is in force at, a step (see the module docstring)."""

    def __init__(
        self, phases: Sequence[PhaseConfig | Mapping[str, Any]], base_loss: LossConfig
    ) -> None:
        self.base_loss = base_loss
        self.phases = resolve_phases(phases, base_loss)
        self._by_step = {p.at: p for p in self.phases}

    def changes(self, step: int) -> Phase | None:
        """The phase that starts exactly at ``step`` (apply and log it), else ``None``."""
        return self._by_step.get(step)

    def current(self, step: int) -> Phase | None:
        """The phase in force at ``step``: the last one with ``at <= step``, or ``None`` when
        ``step`` comes before the first phase (the base loss config applies). A run resumed
        at ``step`` applies this one, then ``changes`` from ``step + 1`` on."""
        found = None
        for p in self.phases:
            if p.at > step:
                break
            found = p
        return found
