"""``controller.malloc``: how the settings merge into a child's ``GLIBC_TUNABLES`` (their
effect in real processes: ``tests/integration/controller/test_malloc_processes.py``)."""

from __future__ import annotations

import platform
import sys

import pytest

from controller.malloc import NAME, tuned_env

glibc = pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
    reason="the settings are glibc's",
)


@glibc
def test_merge_keeps_the_users_values_and_is_idempotent():
    env = tuned_env({"GLIBC_TUNABLES": "glibc.malloc.arena_max=4"})
    items = env[NAME].split(":")
    assert items[0] == "glibc.malloc.arena_max=4"  # the user's value wins
    assert "glibc.malloc.mmap_max=0" in items and len(items) == 3
    assert tuned_env(env) == env
    plain = tuned_env({})
    assert plain[NAME].startswith("glibc.malloc.mmap_max=0:glibc.malloc.arena_max=1:")


def test_off_leaves_the_environment_alone():
    env = {"FORGE_MALLOC": "0", "GLIBC_TUNABLES": "glibc.malloc.arena_max=4"}
    assert tuned_env(env) == env
    assert NAME not in tuned_env({"FORGE_MALLOC": "0"})
