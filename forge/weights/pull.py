"""Looking pushed versions up by number, and the run's default publication location.

Generators and moving reference models pull either a ``WeightHandle`` they were given or a
version by number from the transport their ``WeightTransportConfig`` builds
(``forge.weights.registry.build_transport``); this module holds what the second path shares.

The run's publication location: a trainer whose ``weights.prefix`` is unset pushes shared
memory versions under :func:`run_weights_prefix` (``<session tag>-policy``), and a puller
whose shm ``prefix`` is empty looks there. The session tag is made by the root controller
and reaches every actor process through its environment, so within one run pushes and pulls
meet with no wiring in the app (a restarted generator finds the latest version by itself).
An explicit prefix wins on either side. Two trainers pushing at once in one session need
their own prefixes.
"""

from __future__ import annotations

from typing import Any

from controller import session_tag
from forge.weights.store import WeightTransport, WeightVersionError

__all__ = ["latest_pushed_version", "requested_version", "run_weights_prefix"]


def run_weights_prefix() -> str:
    """The run's default shm prefix for pushed policy weights (same in every process of a
    session; under the session tag, so the root controller sweeps the files at exit)."""
    return f"{session_tag()}-policy"


def latest_pushed_version(transport: WeightTransport) -> int:
    """The newest version under ``transport``; ``WeightVersionError`` if none was pushed."""
    versions = transport.versions()
    if not versions:
        where = getattr(transport, "prefix", None) or getattr(transport, "root", "")
        raise WeightVersionError(
            f"no weight version was pushed yet under {transport.name} location {str(where)!r}"
        )
    return versions[-1]


def requested_version(version: int | None, handle: Any, latest: Any) -> int:
    """The version an ``update_weights(version, handle)`` call asks for: the handle's (which
    ``version``, if given, must match), else ``version``, else ``latest()``."""
    if handle is not None:
        if version is not None and version != handle.version:
            raise ValueError(
                f"update_weights got version={version} but a handle for version "
                f"{handle.version}; pass one or make them agree"
            )
        return handle.version
    return latest() if version is None else version
