"""``weights: {type: broadcast}``: a version sent to every replica in one broadcast group.

The trainer keeps the pushed version in its own memory (a snapshot on the tensors' device, so
training may go on while the replicas receive it) and the run's weight sync
(``forge.run.weights.WeightSync``) sends it to every healthy generator replica at once over a
``forge.weights.group`` broadcast group: NCCL between GPUs (``backend: nccl``, the default
where CUDA is available), gloo on CPU. The group is re-formed when the replicas change (one
restarted), and once more if a broadcast fails. A version exists only inside that broadcast:
there is no file to pull by number, so a replica that restarts between pushes serves its
starting weights until the next push reaches it (its completions carry that older version,
which the replay buffer's policy-age limit refuses). Use ``shm`` where a restarted replica
must load the latest version by itself, or where anything else pulls versions (a moving
reference model, ``forge serve``).
"""

from __future__ import annotations

import secrets

import torch

from controller import files
from forge.weights.group import GroupHost, GroupSpec, join, receive_state_dict, send_state_dict
from forge.weights.store import TensorMeta, WeightHandle, WeightTransport, dtype_name

__all__ = ["BroadcastTransport", "read_broadcast"]


class BroadcastTransport(WeightTransport):
    """The pushing side: snapshots of the newest versions and the group that sends them."""

    name = "broadcast"

    def __init__(self, backend: str = "auto"):
        self.backend = backend
        self._host: GroupHost | None = None
        self._snapshots: dict[int, dict[str, torch.Tensor]] = {}
        self._handles: dict[int, WeightHandle] = {}

    def push(self, state_dict: dict[str, torch.Tensor], version: int) -> WeightHandle:
        snapshot = {n: t.detach().clone() for n, t in state_dict.items()}
        manifest, offset = {}, 0
        for n, t in snapshot.items():
            nbytes = t.numel() * t.element_size()
            manifest[n] = TensorMeta(dtype_name(t.dtype), tuple(t.shape), offset, nbytes)
            offset += nbytes
        handle = WeightHandle(
            version, self.name, "", manifest, files.own_address(), secrets.token_hex(8)
        )
        self.close()  # only the newest version is ever sent: the weight sync sends it at once
        self._snapshots[version], self._handles[version] = snapshot, handle
        return handle

    def group(self, members: tuple, renew: bool = False) -> GroupSpec:
        """The broadcast group for this trainer and the replicas ``members`` names (a new
        one when they change, or if ``renew``)."""
        if self._host is None:
            self._host = GroupHost(self.backend)
        return self._host.spec(members, renew)

    def abort(self, group_id: str) -> None:
        """Make every member waiting in group ``group_id`` give up (``GroupAborted``)."""
        if self._host is not None:
            self._host.abort(group_id)

    def send(self, version: int, spec: GroupSpec) -> int:
        """Broadcast ``version`` to the group's other members (they call ``read_broadcast``
        at the same time). Returns the bytes sent."""
        if version not in self._snapshots:
            raise KeyError(
                f"weight version {version} is not held here (have {sorted(self._snapshots)})"
            )
        send_state_dict(join(spec, 0), self._snapshots[version], self._handles[version].manifest)
        return self._handles[version].nbytes

    def pull(self, handle_or_version, into=None):
        raise RuntimeError(
            "a version pushed with weights type broadcast is received only inside the run's "
            "weight sync broadcast; use type shm to pull versions by number"
        )

    def drop(self, version: int) -> None:
        self._snapshots.pop(version, None)
        self._handles.pop(version, None)

    def versions(self) -> list[int]:
        return sorted(self._snapshots)

    def close(self) -> None:
        self._snapshots.clear()
        self._handles.clear()


def read_broadcast(handle: WeightHandle, into: dict[str, torch.Tensor] | None = None):
    """A receiving replica's side: join the group the weight sync put in ``handle.location``
    (a ``GroupSpec``) and receive the version into ``into`` (or fresh CPU tensors)."""
    if not handle.location:
        raise RuntimeError(
            f"weight version {handle.version} (type broadcast) reaches a replica only through "
            "the run's weight sync, which names the group; it cannot be pulled on its own"
        )
    return receive_state_dict(
        join(GroupSpec.parse(handle.location)),
        handle.manifest,
        into,
        source=f"the broadcast of weight version {handle.version}",
    )
