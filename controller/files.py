"""Files of the controller's host, from any host of the session.

On one host (or with a shared filesystem) a path means the same thing everywhere and these are
no-ops. Where workers run on hosts that share nothing with the controller (the ``ray``
backend), the controller's home (``controller._home``) serves its host's files:

- ``stage(path)``: a local copy of the controller host's file or folder ``path``, fetched once
  per host (concurrent callers on a host wait for one fetch, under a file lock) into
  ``<tmp>/forge-staged-<uid>/``; returns ``path`` itself when it exists here.
- ``upload(local, path)``: copy a local file or folder to ``path`` on the controller's host
  (each file written beside its target, then renamed into place).
- ``writing(path)`` / ``staged(path)``: a local place to write what belongs at ``path`` on the
  controller's host (uploaded on leaving), and a local copy of ``path`` for one ``with`` block
  (a checkpoint to load).

Bytes travel in 32 MiB chunks over the session's authenticated channel, 4 in flight. Both
have a sync twin (``stage_sync``, ``upload_sync``) for code that is not async (model loading
in an actor's setup).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import logging
import os
import shutil
import stat
import tempfile
import uuid

from controller import _published
from controller._home import home
from controller._runtime import get_runtime

logger = logging.getLogger("controller.files")
CHUNK = 32 << 20
IN_FLIGHT = 4
CALL_TIMEOUT_S = 300.0  # one chunk on a slow link


def staging_root() -> str:
    """Where this host keeps staged copies: ``<tmp>/forge-staged-<uid>``, private to the user.

    The temporary directory is shared with the host's other users, who could create that name
    first (and fill it, or make it a link elsewhere). So the directory is made with mode 0700,
    or, if it exists, accepted only if it is a real directory (not a symbolic link) owned by
    this user with mode 0700; anything else is a ``PermissionError`` naming it and the fix."""
    root = os.path.join(tempfile.gettempdir(), f"forge-staged-{os.getuid()}")
    try:
        os.mkdir(root, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(root)  # lstat: a symbolic link is judged itself, never followed
    if (
        not stat.S_ISDIR(st.st_mode)
        or st.st_uid != os.geteuid()
        or stat.S_IMODE(st.st_mode) != 0o700
    ):
        kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a directory"
        if stat.S_ISDIR(st.st_mode):
            kind = f"owned by uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):o}"
        raise PermissionError(
            f"the staging directory {root} is {kind}, not a directory of uid {os.geteuid()} "
            "with mode 700: another user may have made it. Remove it (or set TMPDIR to a "
            "private directory) and run again"
        )
    return root


async def stage(path: str) -> str:
    """A local path with the content of the controller host's ``path`` (see module doc).

    Raises ``FileNotFoundError`` if it exists neither here nor on the controller's host."""
    path = os.fspath(path)
    if os.path.exists(path):
        return path
    if not remote():  # no home, or we are the controller itself
        raise FileNotFoundError(path)
    h = home()
    assert h is not None  # remote(): the session has a home
    key = hashlib.sha1(f"{h._infos[0].address}:{path}".encode()).hexdigest()[:16]
    dest = os.path.join(staging_root(), key, os.path.basename(path.rstrip("/")) or "root")
    if os.path.exists(dest):
        return dest
    lock_path = os.path.join(staging_root(), f"{key}.lock")
    loop = asyncio.get_running_loop()
    fd = os.open(lock_path, os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW, 0o600)
    try:
        await loop.run_in_executor(None, fcntl.flock, fd, fcntl.LOCK_EX)
        if not os.path.exists(dest):  # another process on this host may have fetched it
            await _fetch(h, path, dest)
    finally:
        os.close(fd)
    return dest


async def _fetch(h, path: str, dest: str) -> None:
    files = await h.tree.call_one(path)
    if files is None:
        raise FileNotFoundError(f"{path} (neither on this host nor on the controller's)")
    tmp = f"{dest}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        for rel, size in files:
            src = os.path.join(path, rel) if rel else path
            out = os.path.join(tmp, rel) if rel else tmp
            os.makedirs(os.path.dirname(out), exist_ok=True)
            await _copy_in(h, src, out, size)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True) if os.path.isdir(tmp) else _unlink(tmp)
        raise


async def _copy_in(h, src: str, out: str, size: int) -> None:
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        sem = asyncio.Semaphore(IN_FLIGHT)

        async def one(offset: int) -> None:
            async with sem:
                data = await h.read.call_one(src, offset, CHUNK, timeout=CALL_TIMEOUT_S)
                os.pwrite(fd, data, offset)

        await asyncio.gather(*(one(o) for o in range(0, size, CHUNK)))
    finally:
        os.close(fd)


async def upload(local: str, path: str) -> None:
    """Copy the local file or folder ``local`` to ``path`` on the controller's host (a plain
    copy when there is no home, or we are the controller). Each file is written beside its
    target and renamed into place; a folder is merged into what ``path`` already holds, so
    several ranks may upload their parts of one checkpoint."""
    if not remote():
        await asyncio.get_running_loop().run_in_executor(None, _copy_local, local, path)
        return
    h = home()
    assert h is not None  # remote(): the session has a home
    sem = asyncio.Semaphore(IN_FLIGHT)

    async def one(src: str, tmp: str, offset: int) -> None:
        async with sem:
            with open(src, "rb") as f:
                f.seek(offset)
                data = f.read(CHUNK)
            await h.write.call_one(tmp, offset, data, timeout=CALL_TIMEOUT_S)

    async def put(rel: str, size: int) -> None:
        src = os.path.join(local, rel) if rel else local
        dst = os.path.join(path, rel) if rel else path
        tmp = f"{dst}.{uuid.uuid4().hex[:8]}.tmp"
        await asyncio.gather(*(one(src, tmp, o) for o in range(0, max(size, 1), CHUNK)))
        await h.replace.call_one(tmp, dst)

    await asyncio.gather(*(put(rel, size) for rel, size in _local_tree(local)))


def remote() -> bool:
    """Whether this process runs where the controller's files are not (a worker of a session
    with a home, on any host: it cannot tell whether it shares the controller's disk)."""
    return home() is not None and not get_runtime().session.home


@contextlib.contextmanager
def writing(path: str):
    """Where to write what should end up at ``path`` on the controller's host: ``path`` itself
    without a home; else a local temporary folder uploaded to ``path`` on leaving (sync)."""
    if not remote():
        yield path
        return
    tmp = tempfile.mkdtemp(prefix="forge-upload-", dir=staging_root())
    try:
        out = os.path.join(tmp, os.path.basename(path.rstrip("/")) or "out")
        yield out
        if os.path.exists(out):
            upload_sync(out, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def staged(path: str):
    """A local copy of the controller host's ``path`` for the ``with`` block only (sync; a
    checkpoint that may be rewritten later under the same name): ``path`` itself where it
    exists here."""
    path = os.fspath(path)
    if os.path.exists(path) or not remote():
        yield path
        return
    tmp = tempfile.mkdtemp(prefix="forge-fetch-", dir=staging_root())
    try:
        dest = os.path.join(tmp, os.path.basename(path.rstrip("/")) or "root")
        _run_sync(_fetch(home(), path, dest))
        yield dest
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _local_tree(path: str) -> list[tuple[str, int]]:
    if os.path.isfile(path):
        return [("", os.path.getsize(path))]
    out = []
    for root, _, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            out.append((os.path.relpath(full, path), os.path.getsize(full)))
    return sorted(out)


def _copy_local(local: str, path: str) -> None:
    if os.path.abspath(local) == os.path.abspath(path):
        return
    if os.path.isdir(local):
        shutil.copytree(local, path, dirs_exist_ok=True)
        return
    tmp = f"{path}.{uuid.uuid4().hex[:8]}.tmp"
    shutil.copyfile(local, tmp)
    os.replace(tmp, path)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _run_sync(coro):
    """Run ``coro`` on the runtime's background loop from code that is not async."""
    loop = get_runtime().background_loop()
    return asyncio.run_coroutine_threadsafe(coro, loop).result()


def stage_sync(path: str) -> str:
    """``stage`` for code that is not async (must not run on the runtime's own loop)."""
    path = os.fspath(path)
    if os.path.exists(path) or not remote():
        return path
    return _run_sync(stage(path))


def upload_sync(local: str, path: str) -> None:
    """``upload`` for code that is not async."""
    _run_sync(upload(local, path))


# -- files a worker publishes to the session (pushed weights), read by peers on other hosts --
# (the registry lives in controller._published, which the worker loop reads without this module)
publish, unpublish = _published.publish, _published.unpublish
served_bytes = _published.served_bytes


def own_address() -> str:
    """This worker's TCP address, where peers on other hosts reach it (``""`` for a worker
    on a unix socket, or outside a worker)."""
    from controller import env_vars

    address = env_vars.get("FORGE_ADDRESS") or ""
    return address if address.startswith("tcp:") and not address.endswith(":0") else ""


async def _read_remote(
    address: str, path: str, offset: int, size: int, timeout: float = CALL_TIMEOUT_S
):
    from controller import _serialization as ser
    from controller import _wire

    async def ask():
        client = get_runtime().client(address, "files", 0, None)
        await client.channel()
        body = ser.dumps((path, offset, size), use_shm=False)[0]
        return await client.request(_wire.READ, body)

    kind, payload = await asyncio.wait_for(ask(), timeout)
    if kind == _wire.ERR:
        _, message, _, _ = ser.loads(payload)
        raise OSError(f"reading {path} from {address}: {message}")
    return ser.loads(payload) if size < 0 else payload  # a memoryview of the frame


async def fetch_published(address: str, path: str, dest: str) -> int:
    """Copy the file ``path`` that the worker at ``address`` published into the local file
    ``dest`` (written beside it, renamed into place); returns its size."""
    size = await _read_remote(address, path, 0, -1)
    tmp = f"{dest}.{uuid.uuid4().hex[:8]}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.ftruncate(fd, size)
        sem = asyncio.Semaphore(IN_FLIGHT)

        async def one(offset: int) -> None:
            async with sem:
                os.pwrite(fd, await _read_remote(address, path, offset, CHUNK), offset)

        await asyncio.gather(*(one(o) for o in range(0, size, CHUNK)))
    except BaseException:
        os.close(fd)
        _unlink(tmp)
        raise
    os.close(fd)
    os.replace(tmp, dest)
    return size


# -- one file to many hosts: a pipelined tree (relayed weight versions) ------------------------
RELAY_CHUNK = 16 << 20  # smaller than CHUNK: a host forwards a chunk as soon as it has it
RELAY_FANOUT = 1  # a chain: every link carries each byte once
PARENT_TIMEOUT_S = 120.0  # one chunk from a relaying host (it may wait up to 60 s for it)
relayed: dict[str, dict] = {}  # dest -> where its last copies came from (newest 16)


async def fetch_relayed(
    source: str, path: str, dest: str, key: str, fanout: int = RELAY_FANOUT
) -> int:
    """Copy ``path``, published by the worker at ``source``, into the local file ``dest``, as
    one of several hosts copying the same file (``key`` names it, e.g. a weight version).

    The hosts form a tree rooted at ``source`` (the controller's home places each host in the
    order they ask; with ``fanout`` 1, a chain), and each copies from its parent while
    serving what it already has to its children (``dest`` is published while it grows), so the
    source's link carries the bytes ``fanout`` times, not once per host, and a host starts
    forwarding a chunk as soon as it has it. A parent that fails (its host died, a read
    timed out) is replaced by ``source`` for the rest of the file. Without a home (one host)
    or a TCP address of our own, this is ``fetch_published``. Returns the size."""
    me, h = own_address(), home()
    if not me or h is None:
        return await fetch_published(source, path, dest)
    tmp = f"{dest}.{uuid.uuid4().hex[:8]}.tmp"
    grow = _published.publish_growing(dest, tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        parent = await h.relay_join.call_one(key, source, me, fanout, timeout=10.0)
        read = _Reader(source, path, parent, dest)
        size = await read(0, -1)
        grow.set_size(size)
        os.ftruncate(fd, size)
        sem = asyncio.Semaphore(IN_FLIGHT)

        async def one(offset: int) -> None:
            async with sem:
                data = await read(offset, RELAY_CHUNK)
                os.pwrite(fd, data, offset)
                grow.wrote(offset, len(data))

        await asyncio.gather(*(one(o) for o in range(0, size, RELAY_CHUNK)))
        os.close(fd)
        fd = -1
        grow.finish()  # renamed into place; served as a plain published file from now on
        relayed[dest] = {"parent": parent, "from_parent": read.from_parent, "size": size}
        while len(relayed) > 16:
            relayed.pop(next(iter(relayed)))
        return size
    except BaseException as e:
        grow.fail(f"{type(e).__name__}: {e}")
        _unlink(tmp)
        raise
    finally:
        if fd >= 0:
            os.close(fd)


class _Reader:
    """Reads of one relayed file from the parent, falling back to the source for good once a
    read from the parent fails."""

    def __init__(self, source: str, path: str, parent: str, dest: str):
        self.source, self.path = source, path
        self.parent = None if parent == source else (parent, dest)
        self.from_parent = 0  # bytes read from the parent (the rest came from the source)

    async def __call__(self, offset: int, size: int):
        if self.parent is not None:
            address, path = self.parent
            try:
                data = await _read_remote(address, path, offset, size, PARENT_TIMEOUT_S)
                self.from_parent += len(data) if size >= 0 else 0
                return data
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - any failure of the parent: go to the source
                if self.parent is not None:
                    logger.warning(
                        "relay: reading %s from %s failed (%s); copying the rest from %s",
                        path,
                        address,
                        e,
                        self.source,
                    )
                    self.parent = None
        return await _read_remote(self.source, self.path, offset, size)
