"""Whether a run directory is safe to resume: only its owner could have written it.

``forge run --resume <dir>`` reads the directory's config (which names modules to import)
and its checkpoints. Checkpoint files are loaded without unpickling code
(``forge.training.trainer_checkpoint.safe_load``), but a directory that another local user wrote, or
could have changed since, is refused before anything in it is read:

- every entry under ``<dir>`` (not following links) must belong to the current user and not
  be writable by others, or by its group unless that group is the user's private group;
- every directory above it must belong to the user or root and, when others may write it,
  carry the sticky bit (as ``/tmp`` does), so nobody else can swap ``<dir>`` out;
- links are resolved and their targets checked by the same rules: ``<dir>`` may be a link
  to a directory elsewhere, and an entry under it a link, but what they point to (and the
  directories above it) must pass too.

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


def check_run_dir(path: str | Path) -> Path:
    """Raise ``ForeignRunDirError`` unless ``path`` (a run directory) and everything in it
    belong to the current user and nobody else may write them (see the module docstring).
    Links are resolved first and their targets checked, with the directories above them:
    ``path`` itself may be a link, and so may anything in it. Returns the resolved directory,
    the one to read from (a link swapped after the check changes nothing)."""
    uid = os.getuid()
    hint = (
        "forge run --resume loads only run directories that you own and nobody else can "
        "write (their config imports code); copy it if you trust it (cp -r), or fix the "
        "ownership / mode (chmod go-w)"
    )
    root = Path(os.path.realpath(path))
    _check_tree(root, f"--resume {path}: refused: ", uid, hint, set())
    return root


def _check_tree(root: Path, refused: str, uid: int, hint: str, seen: set[Path]) -> None:
    """``root`` (no link), the directories above it and everything under it; a link under
    it is followed to its target, which is checked the same way."""
    if root in seen:
        return
    seen.add(root)
    _check_parents(root, refused, uid, hint)
    if not root.exists():
        return  # a dangling link's target: nobody may create it (its parents are checked)
    _check_entry(root, refused, uid, hint, seen)
    for dirpath, dirnames, filenames in os.walk(root):  # links are not followed here
        for name in dirnames + filenames:
            _check_entry(Path(dirpath, name), refused, uid, hint, seen)


def _check_entry(entry: Path, refused: str, uid: int, hint: str, seen: set[Path]) -> None:
    st = os.lstat(entry)
    if st.st_uid != uid:
        raise ForeignRunDirError(
            f"{refused}{entry} belongs to {_user(st.st_uid)}, not {_user(uid)}; {hint}"
        )
    why = _writable_by_others(st, uid)
    if why:
        raise ForeignRunDirError(f"{refused}{entry} is {why}; {hint}")
    if stat.S_ISLNK(st.st_mode):
        target = Path(os.path.realpath(entry))
        _check_tree(target, f"{refused}{entry} links to {target}: ", uid, hint, seen)


def _check_parents(path: Path, refused: str, uid: int, hint: str) -> None:
    """Every existing directory above ``path``: the user's or root's, and sticky where
    others may write it (else someone could swap ``path`` out)."""
    for parent in reversed(path.parents):
        try:
            st = os.stat(parent)
        except FileNotFoundError:
            return  # a dangling target's missing parent: what exists above it was checked
        sticky = st.st_mode & stat.S_ISVTX
        if st.st_uid not in (0, uid):
            raise ForeignRunDirError(
                f"{refused}the directory above it, {parent}, belongs to {_user(st.st_uid)}, "
                f"not {_user(uid)}; {hint}"
            )
        why = _writable_by_others(st, uid)
        if why and not sticky:
            raise ForeignRunDirError(
                f"{refused}the directory above it, {parent}, is {why} (without the sticky "
                f"bit); {hint}"
            )
