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


def test_type_checkers_see_every_lazy_name_from_its_module():
    """PEP 562's ``__getattr__`` is opaque to type checkers and editors: the ``if
    TYPE_CHECKING:`` block of ``forge/__init__.py`` imports each lazy name from the module
    ``_EXPORTS`` loads it from, so ``from forge import Trainer`` resolves in an editor."""
    import ast
    from pathlib import Path

    tree = ast.parse(Path(forge.__file__).read_text())
    blocks = [
        n
        for n in tree.body
        if isinstance(n, ast.If) and isinstance(n.test, ast.Name) and n.test.id == "TYPE_CHECKING"
    ]
    assert len(blocks) == 1, "forge/__init__.py needs one `if TYPE_CHECKING:` block of imports"
    seen = {
        alias.asname or alias.name: node.module
        for node in blocks[0].body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert seen == forge._EXPORTS
