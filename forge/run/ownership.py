"""Whether a run directory is safe to resume: only its owner could have written it.

``forge run --resume <dir>`` reads the directory's config (which names modules to import)
and its checkpoints. Checkpoint files are loaded without unpickling code
(``forge.training.trainer_checkpoint.safe_load``), but a directory that another local user wrote, or
could have changed since, is refused before anything in it is read:

- every entry under ``<dir>`` (not following links) must belong to the current user and not
  be writable by others, or by its group unless that group is the user's private group;
- every directory above it must belong to the user or root and, when others may write it,
  carry the sticky bit (as ``/tmp`` does), so nobody else can swap ``<dir>`` out.

A copy made with ``cp -r`` belongs to whoever copied it and passes: its config and
checkpoints are then trusted as the copier's own (docs/security.md says so).
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
from pathlib import Path

__all__ = ["ForeignRunDirError", "check_run_dir"]


class ForeignRunDirError(ValueError):
    """A run directory another user wrote or may write; ``forge run --resume`` refuses it."""


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _private_group(gid: int, uid: int) -> bool:
    """Whether group ``gid`` is ``uid``'s own: named after the user, with no other members."""
    try:
        group = grp.getgrgid(gid)
    except KeyError:
        return False
    name = _user(uid)
    return group.gr_name == name and set(group.gr_mem) <= {name}


def _writable_by_others(st: os.stat_result, uid: int) -> str | None:
    if stat.S_ISLNK(st.st_mode):
        return None  # a link's own mode means nothing; its owner is checked
    if st.st_mode & stat.S_IWOTH:
        return "writable by every user"
    if st.st_mode & stat.S_IWGRP and not _private_group(st.st_gid, uid):
        return f"writable by group {st.st_gid}"
    return None


def check_run_dir(path: str | Path) -> None:
    """Raise ``ForeignRunDirError`` unless ``path`` (a run directory) and everything in it
    belong to the current user and nobody else may write them (see the module docstring)."""
    uid = os.getuid()
    root = Path(os.path.abspath(path))
    me = _user(uid)
    hint = (
        "forge run --resume loads only run directories that you own and nobody else can "
        "write (their config imports code); copy it if you trust it (cp -r), or fix the "
        "ownership / mode (chmod go-w)"
    )
    for parent in reversed(root.parents):
        st = os.stat(parent)
        sticky = st.st_mode & stat.S_ISVTX
        if st.st_uid not in (0, uid):
            raise ForeignRunDirError(
                f"--resume {path}: refused: the directory above it, {parent}, belongs to "
                f"{_user(st.st_uid)}, not {me}; {hint}"
            )
        why = _writable_by_others(st, uid)
        if why and not sticky:
            raise ForeignRunDirError(
                f"--resume {path}: refused: the directory above it, {parent}, is {why} "
                f"(without the sticky bit); {hint}"
            )
    entries = [root]
    for dirpath, dirnames, filenames in os.walk(root):  # links are not followed
        entries += [Path(dirpath, n) for n in dirnames + filenames]
    for entry in entries:
        st = os.lstat(entry)
        if st.st_uid != uid:
            raise ForeignRunDirError(
                f"--resume {path}: refused: {entry} belongs to {_user(st.st_uid)}, not {me}; {hint}"
            )
        why = _writable_by_others(st, uid)
        if why:
            raise ForeignRunDirError(f"--resume {path}: refused: {entry} is {why}; {hint}")
