"""Looking pushed versions up by number, from a puller's ``WeightPullConfig``.

Generators and moving reference models pull either a ``WeightHandle`` they were given or a
version by number from the transport their config names; this is the second path, shared.
"""

from __future__ import annotations

from typing import Any

from forge.weights.store import WeightTransport, WeightVersionError, build_weight_transport

__all__ = ["has_pull_source", "latest_pushed_version", "pull_transport", "requested_version"]


def has_pull_source(w: Any) -> bool:
    """Whether ``w`` (a ``WeightPullConfig``) names where versions are pushed."""
    return bool(w.prefix if w.transport == "shm" else w.root)


def pull_transport(w: Any, owner: str) -> WeightTransport:
    """The transport ``w`` names; ``ValueError`` naming ``owner``'s config if it names none."""
    if not has_pull_source(w):
        raise ValueError(
            f"update_weights got no handle and {owner}.weights names no "
            f"{'prefix' if w.transport == 'shm' else 'root'} to look versions up by; "
            f"pass handle=WeightHandle or configure {owner}.weights"
        )
    if w.transport == "shm":
        return build_weight_transport("shm", prefix=w.prefix, shm_dir=w.shm_dir, wait_s=w.wait_s)
    return build_weight_transport(w.transport, root=w.root, wait_s=w.wait_s)


def latest_pushed_version(transport: WeightTransport, w: Any) -> int:
    """The newest version under ``transport``; ``WeightVersionError`` if none was pushed."""
    versions = transport.versions()
    if not versions:
        where = f"prefix {w.prefix!r}" if w.transport == "shm" else f"root {w.root!r}"
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
