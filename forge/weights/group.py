"""A broadcast group between the trainer and the processes that load its weights.

The ``broadcast`` weight transport sends a version to every generator (and reference) replica
in one collective per bucket instead of a copy per replica: NCCL between GPUs, gloo on CPU.
Its members are the trainer's pushing rank (rank 0) and the replicas of the moment; a new
group is formed whenever they change (a replica restarted), so a group never waits for a
process that is gone. Nothing in a group is unpickled:

- the trainer hosts a ``TCPStore`` for the rendezvous (``GroupHost``), listening only on the
  address peers reach it at (the loopback on one host; torch's own would listen on every
  interface). Each group has a random 128-bit id, which travels only over Forge's
  authenticated channels (in the ``GroupSpec`` the weight sync hands every member); its keys
  live under a name derived from the id by a one-way hash, so the id never appears in the
  store. The store itself has no authentication: a process that can reach its port can list
  its keys and join or disturb the group of the moment, and gloo and NCCL carry the bytes
  without authentication (docs/security.md, "Weight transport");
- the manifest (names, dtypes, shapes) travels in the ``WeightHandle``, also over Forge's
  channels; the group carries raw bytes only: the buckets of ``forge.weights.dist.plan_buckets``,
  each one ``broadcast`` from rank 0.

Each member keeps its group (``join``) until a spec with another id arrives.
"""

from __future__ import annotations

import hashlib
import math
import secrets
import socket
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from forge.weights.dist import plan_buckets
from forge.weights.store import TensorMeta, checked_destination

__all__ = ["GroupHost", "GroupSpec", "join", "receive_state_dict", "send_state_dict"]

BUCKET_BYTES = 64 << 20
JOIN_TIMEOUT_S = 60.0  # every member must join a new group within this
BUCKET_TIMEOUT_S = 60.0  # one bucket's broadcast (and the group's own rendezvous)


@dataclass(frozen=True)
class GroupSpec:
    """One broadcast group: where its store listens, its secret id, its size and backend."""

    id: str
    host: str
    port: int
    world: int
    backend: str  # "gloo" or "nccl"

    def url(self) -> str:
        """``<backend>://<host>:<port>/<world>/<id>`` (a ``WeightHandle.location``)."""
        return f"{self.backend}://{self.host}:{self.port}/{self.world}/{self.id}"

    @classmethod
    def parse(cls, url: str) -> GroupSpec:
        """The spec ``url()`` wrote; ``ValueError`` for anything else."""
        try:
            backend, rest = url.split("://", 1)
            where, world, gid = rest.split("/")
            host, port = where.rsplit(":", 1)
            return cls(gid, host, int(port), int(world), backend)
        except ValueError:
            raise ValueError(
                f"{url!r} is not a weight group (backend://host:port/world/id)"
            ) from None


class GroupHost:
    """The trainer's side: a ``TCPStore`` (kept for the process's life) and the current group,
    re-formed by ``spec`` when the receivers change or ``renew`` is set."""

    def __init__(self, backend: str = "auto"):
        self.backend = _backend(backend)
        self.host = _own_ip()
        self.store = bound_store(self.host)
        self.current: GroupSpec | None = None
        self.members: tuple = ()

    def spec(self, members: tuple, renew: bool = False) -> GroupSpec:
        """The group for the trainer and the receivers ``members`` names (e.g. their pids): a
        new one when they differ from the last call's, or if ``renew``."""
        if renew or self.current is None or tuple(members) != self.members:
            self.current = GroupSpec(secrets.token_hex(16), self.host, self.store.port,
                                     len(members) + 1, self.backend)  # fmt: skip
            self.members = tuple(members)
        return self.current


def bound_store(host: str) -> dist.TCPStore:
    """A ``TCPStore`` server listening on ``host`` only. torch's own binds every interface
    whatever host it is given, so the socket is made here, bound and listening, and handed
    over (``master_listen_fd``; the store's libuv loop owns and closes it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, 0))
        sock.listen(128)
        port = sock.getsockname()[1]
        store = dist.TCPStore(host, port, None, True, timedelta(seconds=JOIN_TIMEOUT_S),
                              wait_for_workers=False, master_listen_fd=sock.fileno(),
                              use_libuv=True)  # fmt: skip
    except BaseException:
        sock.close()
        raise
    sock.detach()  # the store closes the descriptor now
    return store


def key_prefix(group_id: str) -> str:
    """The store prefix of the group ``group_id``: a one-way hash, so listing the store's
    keys never shows the id itself."""
    return "forge-weights/" + hashlib.sha256(b"forge-weights\0" + group_id.encode()).hexdigest()


_joined: dict[str, tuple[GroupSpec, int, dist.ProcessGroup]] = {}  # per process: the last group


def join(spec: GroupSpec, rank: int | None = None) -> dist.ProcessGroup:
    """This process's member of ``spec``: rank 0 is the sender; receivers pass no rank and
    are numbered 1.. in the order they join. Formed on first use (blocking until all
    ``spec.world`` members have joined) and kept until a spec with another id arrives."""
    last = _joined.get("group")
    if last is not None and last[0].id == spec.id and (rank is None or last[1] == rank):
        return last[2]
    _joined.pop("group", None)  # the old group's sockets close with it
    store = dist.TCPStore(spec.host, spec.port, None, False, timedelta(seconds=JOIN_TIMEOUT_S))
    prefixed = dist.PrefixStore(key_prefix(spec.id), store)
    if rank is None:
        rank = prefixed.add("receivers", 1)
    if not 0 <= rank < spec.world:
        raise RuntimeError(f"weight group {spec.id[:8]} of {spec.world} has no room for another "
                           "receiver: more replicas joined than the weight sync counted")  # fmt: skip
    timeout = timedelta(seconds=BUCKET_TIMEOUT_S)
    if spec.backend == "nccl":
        nccl = getattr(dist, "ProcessGroupNCCL", None)
        if nccl is None or not torch.cuda.is_available():
            raise RuntimeError("weights type broadcast with backend nccl needs CUDA and a "
                               "torch built with NCCL; use backend: gloo on CPU")  # fmt: skip
        opts = nccl.Options()
        opts._timeout = timeout
        group = nccl(prefixed, rank, spec.world, opts)
    else:
        group = dist.ProcessGroupGloo(prefixed, rank, spec.world, timeout)
    _joined["group"] = (spec, rank, group)
    return group


def send_state_dict(group: dist.ProcessGroup, state_dict: dict[str, torch.Tensor],
                    manifest: dict[str, TensorMeta]) -> None:  # fmt: skip
    """Rank 0: broadcast ``state_dict``'s tensors in ``manifest``'s buckets."""
    for names, dtype, total in _buckets(manifest):
        flat = torch.cat([state_dict[n].detach().reshape(-1).to(dtype) for n in names])
        _broadcast(group, flat, total)


def receive_state_dict(group: dist.ProcessGroup, manifest: dict[str, TensorMeta],
                       into: dict[str, torch.Tensor] | None, device: str = "cpu",
                       source: str = "the weight broadcast") -> dict[str, torch.Tensor]:  # fmt: skip
    """Other ranks: receive the buckets and copy each tensor into ``into`` (checked names,
    dtypes and shapes) or into fresh tensors on ``device``."""
    out: dict[str, torch.Tensor] = {}
    if into:
        device = str(next(iter(into.values())).device)
    for names, dtype, total in _buckets(manifest):
        flat = torch.empty(total, dtype=dtype, device=device)
        _broadcast(group, flat, total)
        sizes = [math.prod(manifest[n].shape) for n in names]
        for name, part in zip(names, flat.split(sizes)):
            t = part.view(manifest[name].shape)
            if into is not None:
                checked_destination(into, name, t, source).copy_(t)
            else:
                out[name] = t.clone()
    return into if into is not None else out


def _buckets(manifest: dict[str, TensorMeta]):
    rows = [(n, m.dtype, tuple(m.shape)) for n, m in manifest.items()]
    for b in plan_buckets(rows, BUCKET_BYTES):
        yield b.names, b.dtype, sum(b.numels)


def _broadcast(group: dist.ProcessGroup, flat: torch.Tensor, total: int) -> None:
    if not total:
        return
    opts = dist.BroadcastOptions()
    opts.rootRank, opts.rootTensor = 0, 0
    work = group.broadcast([flat.view(torch.uint8)], opts)
    if not work.wait(timedelta(seconds=BUCKET_TIMEOUT_S)):
        raise TimeoutError(f"a weight broadcast bucket took over {BUCKET_TIMEOUT_S:.0f} s")


def _backend(name: str) -> str:
    if name == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    if name not in ("gloo", "nccl"):
        raise ValueError(f"weight broadcast backend {name!r} is unknown; choose auto, gloo or nccl")
    return name


def _own_ip() -> str:
    """The address peers reach this process at: the worker's TCP address where it has one
    (workers that may be called from other hosts), else the loopback (one host)."""
    from controller import files

    address = files.own_address()  # tcp:<ip>:<port>
    return address.split(":")[1] if address else "127.0.0.1"
