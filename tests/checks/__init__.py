"""Checks over the whole repository that run a tool or a fresh interpreter: ruff, pyright
(types), and what importing a package or starting the CLI costs. Fast tier; not unit tests,
since each starts a process (tests/unit/conftest.py refuses that)."""
