"""Same-host weight transport: one shared-memory file per version under ``/dev/shm``.

Push copies every tensor once into ``/dev/shm/forge-w-<prefix>-v<version>-<random>``; any
process on the host maps that file and copies out of it (into the model's own tensors, or into fresh
ones), so the cost is two memcpys per byte and no pickling. The file's layout and writing are
``shm_file.py``; pulling (copies, leases, kept mappings) is ``shm_read.py``; this module is the
transport that names, publishes, recycles and drops the files.

Another user of the host. ``/dev/shm`` is shared: every name in it ends in 64 random bits, so
no one can plant a file where a push will create one (``O_CREAT | O_EXCL | O_NOFOLLOW``, mode
0600), and a puller opens a version only if the file is a regular file owned by its own user
and not open to group or others (a file planted under a matching name is skipped by
``versions`` and refused by name, ``PermissionError``).

Warm files on both sides. Most of a copy into a *fresh* tmpfs file, or out of a *fresh*
mapping, is page faults, not bytes. So:

* the pusher keeps the files it wrote mapped, and when retention drops a version it renames
  the file to a spare (``forge-w-<prefix>-spare-...``) instead of unlinking it; the next push
  rewrites a spare of the right size through its already-populated mapping (a memcpy);
* a puller keeps up to :data:`KEEP_MAPPED` read-only mappings per process, keyed by the file's
  inode, so pulling a recycled file again copies through populated page tables.

The invariant that makes recycling safe: **a file is only written while no version name
links to it and the writer holds an exclusive ``flock`` on it; a reader copies only while
holding a shared ``flock`` and after checking that the header names the version it asked
for.** A spare is taken only if its exclusive lock is free (a late reader of the dropped
version still holds its shared lock: the pusher then leaves that spare alone and writes a
fresh file); the writer puts the new header in first, so a reader that opened the file under
its old name and locks it afterwards sees another version number and reports the version as
dropped, never mixes two versions. Files are never resized, so a kept mapping never reaches
past the end of its file. A kept mapping holds its file's memory until the next pull in that
process notices the file was unlinked, or :func:`close_mappings`, or the process exits.
"""

from __future__ import annotations

import os
import re
import secrets
import time
import uuid
import weakref
from pathlib import Path

import torch

from controller import files
from controller._serialization import shm_prefix
from forge.weights.shm_file import Segment, plan_layout, write_shm_file
from forge.weights.shm_read import (
    KEEP_MAPPED,
    ShmLease,
    close_mappings,
    gone,
    is_own,
    lease_shm_file,
    read_shm_file,
)
from forge.weights.store import WeightHandle, WeightTransport

__all__ = [
    "KEEP_MAPPED",
    "SharedMemoryTransport",
    "ShmLease",
    "close_mappings",
    "lease_shm_file",
    "read_shm_file",
    "write_shm_file",
]

_PREFIX_RE = re.compile(r"^[A-Za-z0-9_.-]+$")


def _session_suffix(prefix: str) -> str:
    """``.<session tag>`` unless ``prefix`` already holds the tag: a file of a session killed
    before it could remove it (SIGKILL) is then removed by the next session's sweep
    (``controller._runtime``), whatever prefix it was pushed under."""
    tag = shm_prefix()
    return "" if tag in prefix else f".{tag}"


def _close_all(live: dict[int, Segment], spares: list[Segment]) -> None:
    for seg in [*live.values(), *spares]:
        seg.close(unlink=True)
    live.clear()
    spares.clear()


class SharedMemoryTransport(WeightTransport):
    """Weights in ``<shm_dir>/forge-w-<prefix>-v<version>-<random>``, one file per version.

    Args:
        prefix: names this run's files (letters, digits, ``_.-``); pusher and pullers agree.
        shm_dir: a RAM-backed directory (``/dev/shm`` on Linux).
        wait_s: how long ``pull(version)`` waits for a version's file to appear.
        spares: files of dropped versions kept (renamed, still mapped) for later pushes to
            rewrite instead of faulting in new pages; each holds one version's bytes of
            memory. ``0`` unlinks dropped versions at once.

    Files this instance pushed are unlinked by ``close``, and at garbage collection or
    interpreter exit as a safety net; a crash (SIGKILL) can still leave them behind.
    """

    name = "shm"

    def __init__(
        self, prefix: str, shm_dir: str = "/dev/shm", wait_s: float = 0.0, spares: int = 1
    ) -> None:
        if not _PREFIX_RE.match(prefix):
            raise ValueError(
                f"SharedMemoryTransport prefix {prefix!r} must be non-empty letters, digits, "
                "'_', '.' or '-' (it becomes part of a file name)"
            )
        if not Path(shm_dir).is_dir():
            raise ValueError(f"SharedMemoryTransport shm_dir {shm_dir!r} is not a directory")
        if not isinstance(spares, int) or spares < 0:
            raise ValueError(f"SharedMemoryTransport spares must be an int >= 0, got {spares!r}")
        self.prefix = prefix
        self.shm_dir = shm_dir
        self.wait_s = wait_s
        self.spares = spares
        self._live: dict[int, Segment] = {}  # versions this instance pushed
        self._spares: list[Segment] = []
        self._renames = 0
        self._finalizer = weakref.finalize(self, _close_all, self._live, self._spares)

    def path(self, version: int) -> str:
        """File holding ``version`` (one of this user's); where there is none, the glob
        pattern of its name (``...-v<version>-*``), which names no file."""
        found = self._find(int(version))
        return self._pattern(int(version)) if found is None else found

    def _pattern(self, version: int) -> str:
        return os.path.join(self.shm_dir, f"forge-w-{self.prefix}-v{version}-*")

    def _names(self) -> dict[int, str]:
        """{version: path} of this user's version files with this prefix."""
        pattern = re.compile(
            rf"^forge-w-{re.escape(self.prefix)}-v(\d+)-[0-9a-f]{{16}}(?:\.forge-[0-9a-z_-]+)?$"
        )
        out = {}
        for name in os.listdir(self.shm_dir):
            m = pattern.match(name)
            if m is None:
                continue
            path = os.path.join(self.shm_dir, name)
            try:
                if is_own(os.lstat(path)):  # planted files (another owner, a link) are skipped
                    out[int(m.group(1))] = path
            except FileNotFoundError:
                pass
        return out

    def _find(self, version: int) -> str | None:
        seg = self._live.get(version)
        return seg.path if seg is not None else self._names().get(version)

    def push(self, state_dict: dict[str, torch.Tensor], version: int) -> WeightHandle:
        if self._find(int(version)) is not None:
            where = self._find(int(version))
            raise ValueError(f"weight version {version} already exists at {where}; drop it first")
        name = f"forge-w-{self.prefix}-v{int(version)}-{secrets.token_hex(8)}"
        final = os.path.join(self.shm_dir, name + _session_suffix(self.prefix))
        manifest, header, size = plan_layout(state_dict, version)
        seg = self._take_spare(size)  # locked exclusively: no reader is in it
        if seg is None:
            seg = Segment(self._unique_name("tmp"), size)
        try:
            seg.write(header, manifest, state_dict)
            seg.unlock()  # no-op for a new file, which nobody could lock
            # link() never replaces an existing name: an atomic, no-clobber publish.
            os.link(seg.path, final)
        except BaseException as e:
            seg.close(unlink=True)
            if isinstance(e, FileExistsError):
                raise ValueError(
                    f"weight version {version} was pushed concurrently by another process ({final})"
                ) from None
            raise
        os.unlink(seg.path)
        seg.path = final
        self._live[int(version)] = seg
        files.publish(final)  # pullers on other hosts copy it through this process
        source = files.own_address()
        return WeightHandle(version, self.name, final, manifest, source, uuid.uuid4().hex[:12])

    def _unique_name(self, kind: str) -> str:
        self._renames += 1
        name = f"forge-w-{self.prefix}-{kind}-{os.getpid()}-{self._renames}-{secrets.token_hex(8)}"
        name += _session_suffix(self.prefix)
        return os.path.join(self.shm_dir, name)

    def _take_spare(self, size: int) -> Segment | None:
        """A spare of ``size`` bytes that no reader holds, exclusively locked; else None."""
        for seg in list(self._spares):
            if seg.size != size:  # the state dict changed shape: this file will not fit
                self._spares.remove(seg)
                seg.close(unlink=True)
            elif seg.try_lock():
                self._spares.remove(seg)
                return seg
        return None

    def pull(
        self,
        handle_or_version: WeightHandle | int,
        into: dict[str, torch.Tensor] | None = None,
    ) -> dict[str, torch.Tensor]:
        if isinstance(handle_or_version, WeightHandle):
            h = handle_or_version
            return read_shm_file(h.location, h.version, h.manifest, into, self.wait_s)
        version = int(handle_or_version)
        deadline = time.monotonic() + self.wait_s
        while (path := self._find(version)) is None:
            if time.monotonic() >= deadline:
                raise gone(
                    version, self._pattern(version), f"does not exist (waited {self.wait_s:g}s)"
                )
            time.sleep(0.01)
        return read_shm_file(path, version, None, into, 0.0)

    def drop(self, version: int) -> None:
        """Remove ``version``'s name; a file this instance pushed becomes a spare (while
        fewer than ``spares`` are kept), else it is unlinked."""
        seg = self._live.pop(int(version), None)
        if seg is None:
            path = self._names().get(int(version))
            if path is not None:
                files.unpublish(path)
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
            return
        files.unpublish(seg.path)
        if len(self._spares) >= self.spares:
            seg.close(unlink=True)
            return
        spare = self._unique_name("spare")
        try:
            os.rename(seg.path, spare)  # atomic: new opens of the version fail from here on
        except FileNotFoundError:  # someone else removed it; nothing to keep
            seg.close(unlink=False)
            return
        seg.path = spare
        self._spares.append(seg)

    def versions(self) -> list[int]:
        return sorted(self._names())

    def close(self) -> None:
        _close_all(self._live, self._spares)
