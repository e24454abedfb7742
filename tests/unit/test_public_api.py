"""``forge`` exposes its public names lazily; every one of them resolves (that ``import forge``
stays light is checked in a fresh interpreter, tests/checks/test_import_weight.py)."""

from __future__ import annotations

import forge


def test_every_public_name_resolves():
    import importlib.util

    for name in forge.__all__:
        module = forge._EXPORTS[name]
        if module == "forge.actors.trainer" and importlib.util.find_spec(module) is None:
            continue
        assert getattr(forge, name) is not None, name
