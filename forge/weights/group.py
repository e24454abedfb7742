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

A group fails as a whole: a member that dies mid-broadcast would otherwise leave the others
blocked in gloo until the bucket timeout (60 s), holding a generator's weight lock while the
run waits for its rollouts. So every wait here (the members' arrival, gloo's rendezvous, each
bucket's broadcast) polls the group's ``abort`` key, which the sender sets
when its side fails and the weight sync sets (``GroupHost.abort``, through the trainer) when
any member's call fails: the others raise ``GroupAborted`` within ~50 ms and the sync
re-forms the group without the dead.
"""

from __future__ import annotations

import hashlib
import math
import secrets
import socket
import threading
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from forge.weights.dist import plan_buckets
from forge.weights.store import TensorMeta, checked_destination

__all__ = [
    "GroupAborted",
    "GroupHost",
    "GroupSpec",
    "join",
    "receive_state_dict",
    "send_state_dict",
]

BUCKET_BYTES = 64 << 20
JOIN_TIMEOUT_S = 60.0  # every member must join a new group within this
BUCKET_TIMEOUT_S = 60.0  # one bucket's broadcast (and the group's own rendezvous)
POLL_S = 0.05  # the longest sleep between two looks at a wait (and at the abort key)
ABORT_KEY = "abort"


class GroupAborted(RuntimeError):
    """The group was given up (a member failed or died): this member stops waiting in it."""


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
            self.current = GroupSpec(
                secrets.token_hex(16), self.host, self.store.port, len(members) + 1, self.backend
            )
            self.members = tuple(members)
        return self.current

    def abort(self, group_id: str) -> None:
        """Tell every member of group ``group_id`` to stop waiting in it (``GroupAborted``)."""
        dist.PrefixStore(key_prefix(group_id), self.store).set(ABORT_KEY, "1")


def bound_store(
    host: str, port: int = 0, timeout: timedelta = timedelta(seconds=JOIN_TIMEOUT_S)
) -> dist.TCPStore:
    """A ``TCPStore`` server listening on ``host`` only (at ``port``; 0: one the OS picks).
    torch's own binds every interface whatever host it is given, so the socket is made here,
    bound and listening, and handed over (``master_listen_fd``; the store's libuv loop owns
    and closes it). Also the trainer's own store (``forge.training.parallel``)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
        port = sock.getsockname()[1]
        store = dist.TCPStore(
            host,
            port,
            None,
            True,
            timeout,
            wait_for_workers=False,
            master_listen_fd=sock.fileno(),
            use_libuv=True,
        )
    except BaseException:
        sock.close()
        raise
    sock.detach()  # the store closes the descriptor now
    return store


def key_prefix(group_id: str) -> str:
    """The store prefix of the group ``group_id``: a one-way hash, so listing the store's
    keys never shows the id itself."""
    return "forge-weights/" + hashlib.sha256(b"forge-weights\0" + group_id.encode()).hexdigest()


_joined: dict[str, tuple[GroupSpec, int, dist.ProcessGroup, dist.Store]] = {}  # the last group


def join(spec: GroupSpec, rank: int | None = None) -> dist.ProcessGroup:
    """This process's member of ``spec``: rank 0 is the sender; receivers pass no rank and
    are numbered 1.. in the order they join. Formed on first use (blocking until all
    ``spec.world`` members have joined) and kept until a spec with another id arrives."""
    last = _joined.get("group")
    if last is not None and last[0].id == spec.id and (rank is None or last[1] == rank):
        if last[3].check([ABORT_KEY]):
            raise GroupAborted(f"weight group {spec.id[:8]} was given up (a member failed)")
        return last[2]
    _joined.pop("group", None)  # the old group's sockets close with it
    nccl = getattr(dist, "ProcessGroupNCCL", None)
    if spec.backend == "nccl" and (nccl is None or not torch.cuda.is_available()):
        raise RuntimeError(
            "weights type broadcast with backend nccl needs CUDA and a "
            "torch built with NCCL; use backend: gloo on CPU"
        )
    store = dist.TCPStore(spec.host, spec.port, None, False, timedelta(seconds=JOIN_TIMEOUT_S))
    prefixed = dist.PrefixStore(key_prefix(spec.id), store)
    if rank is None:
        rank = prefixed.add("receivers", 1)
    if not 0 <= rank < spec.world:
        raise RuntimeError(
            f"weight group {spec.id[:8]} of {spec.world} has no room for another "
            "receiver: more replicas joined than the weight sync counted"
        )
    # Everyone arrives before gloo's rendezvous: a member that died before arriving fails the
    # others here as soon as the group is aborted.
    prefixed.add("arrived", 1)
    _poll(
        lambda: prefixed.add("arrived", 0) >= spec.world,
        prefixed,
        JOIN_TIMEOUT_S,
        f"all {spec.world} members to join weight group {spec.id[:8]}",
    )
    timeout = timedelta(seconds=BUCKET_TIMEOUT_S)
    if spec.backend == "nccl":
        opts = nccl.Options()
        opts._timeout = timeout
        group = nccl(prefixed, rank, spec.world, opts)
    else:
        group = _formed(lambda: dist.ProcessGroupGloo(prefixed, rank, spec.world, timeout), spec)
    # Nobody leaves join before every member has its group: a sender that starts while a
    # receiver is still connecting would leave it in gloo's rendezvous if another one died.
    prefixed.add("formed", 1)
    _poll(
        lambda: prefixed.add("formed", 0) >= spec.world,
        prefixed,
        JOIN_TIMEOUT_S,
        f"all {spec.world} members to form weight group {spec.id[:8]}",
    )
    _joined["group"] = (spec, rank, group, prefixed)
    return group


def _formed(make, spec: GroupSpec) -> dist.ProcessGroup:
    """``make()`` (gloo's rendezvous, which blocks without the GIL and cannot be interrupted)
    in a daemon thread, while this one polls the abort key: an aborted group lets go at once
    (the thread ends at gloo's own timeout, its error dropped). The abort key is read over a
    connection of its own: a store client serves one request at a time, and the rendezvous
    holds the group's in a blocking get."""
    box: list = []
    watch = dist.PrefixStore(
        key_prefix(spec.id),
        dist.TCPStore(spec.host, spec.port, None, False, timedelta(seconds=JOIN_TIMEOUT_S)),
    )

    def run() -> None:
        try:
            box.append(make())
        except BaseException as e:  # noqa: BLE001 - handed to the caller below
            box.append(e)

    thread = threading.Thread(target=run, name=f"forge-weight-group-{spec.id[:8]}", daemon=True)
    thread.start()
    _poll(
        lambda: bool(box), watch, BUCKET_TIMEOUT_S + 5, f"weight group {spec.id[:8]}'s rendezvous"
    )
    if isinstance(box[0], BaseException):
        raise box[0]
    return box[0]


def _store_of(group: dist.ProcessGroup) -> dist.Store | None:
    last = _joined.get("group")
    return last[3] if last is not None and last[2] is group else None


def _poll(done, store: dist.Store | None, timeout_s: float, what: str) -> None:
    """Wait until ``done()``, looking at the group's abort key in between (sleeps grow from
    1 ms to ``POLL_S``); ``GroupAborted`` once it is set, ``TimeoutError`` after
    ``timeout_s``."""
    deadline, delay = time.monotonic() + timeout_s, 0.001
    while not done():
        if store is not None and store.check([ABORT_KEY]):
            raise GroupAborted(
                f"gave up waiting for {what}: the group was aborted (a member failed or died)"
            )
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited over {timeout_s:.0f} s for {what}")
        time.sleep(delay)
        delay = min(delay * 2, POLL_S)


def send_state_dict(
    group: dist.ProcessGroup, state_dict: dict[str, torch.Tensor], manifest: dict[str, TensorMeta]
) -> None:
    """Rank 0: broadcast ``state_dict``'s tensors in ``manifest``'s buckets. A failure (a
    receiver died) aborts the group, so the other receivers stop waiting at once."""
    try:
        for names, dtype, total in _buckets(manifest):
            flat = torch.cat([state_dict[n].detach().reshape(-1).to(dtype) for n in names])
            _broadcast(group, flat, total)
    except BaseException:
        store = _store_of(group)
        if store is not None:
            try:
                store.set(ABORT_KEY, "1")
            except Exception:  # noqa: BLE001 - the send's own error is the one to raise
                pass
        raise


def receive_state_dict(
    group: dist.ProcessGroup,
    manifest: dict[str, TensorMeta],
    into: dict[str, torch.Tensor] | None,
    device: str = "cpu",
    source: str = "the weight broadcast",
) -> dict[str, torch.Tensor]:
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
    # Polled rather than waited on, so an aborted group lets go at once. (gloo's op goes on
    # in its own thread until its timeout; the group is dropped and ``flat`` stays alive in
    # ``work`` meanwhile.)
    _poll(work.is_completed, _store_of(group), BUCKET_TIMEOUT_S, "a weight broadcast bucket")
    work.wait()  # the op's own error, if it failed


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
