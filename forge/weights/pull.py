"""Looking pushed versions up by number, from a puller's ``WeightPullConfig``.

Generators and moving reference models pull either a ``WeightHandle`` they were given or a
version by number from the transport their config names; this is the second path, shared.

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
from forge.weights.store import WeightTransport, WeightVersionError, build_weight_transport

__all__ = [
    "has_pull_source",
    "latest_pushed_version",
    "pull_prefix",
    "pull_transport",
    "requested_version",
    "run_weights_prefix",
]


def run_weights_prefix() -> str:
    """The run's default shm prefix for pushed policy weights (same in every process of a
    session; under the session tag, so the root controller sweeps the files at exit)."""
    return f"{session_tag()}-policy"


def pull_prefix(w: Any) -> str:
    """The shm prefix a ``WeightPullConfig`` pulls from: its own, else the run's."""
    return w.prefix or run_weights_prefix()


def has_pull_source(w: Any) -> bool:
    """Whether ``w`` (a ``WeightPullConfig``) says where versions are pushed: always for shm
    (the run's location by default), for ``safetensors_dir`` only with a ``root``."""
    return w.transport == "shm" or bool(w.root)


def pull_transport(w: Any, owner: str) -> WeightTransport:
    """The transport ``w`` names; ``ValueError`` naming ``owner``'s config if it names none."""
    if not has_pull_source(w):
        raise ValueError(
            f"update_weights got no handle and {owner}.weights names no root to look "
            f"versions up by; pass handle=WeightHandle or configure {owner}.weights.root"
        )
    if w.transport == "shm":
        return build_weight_transport(
            "shm", prefix=pull_prefix(w), shm_dir=w.shm_dir, wait_s=w.wait_s
        )
    return build_weight_transport(w.transport, root=w.root, wait_s=w.wait_s)


def latest_pushed_version(transport: WeightTransport, w: Any) -> int:
    """The newest version under ``transport``; ``WeightVersionError`` if none was pushed."""
    versions = transport.versions()
    if not versions:
        where = f"prefix {pull_prefix(w)!r}" if w.transport == "shm" else f"root {w.root!r}"
        raise WeightVersionError(f"no weight version was pushed yet under {where}")
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
