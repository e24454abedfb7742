"""The ``forge`` command line: one module per program, the parser in ``forge.cli.main``.

=====================  ===============================================================
``main``               the parser and the subcommands' glue (``forge --help``)
``run``                ``forge run``: a config's app in a new run directory
``eval``               ``forge eval``: a saved policy on a config's evaluation sets
``top``                ``forge top``: a live view of a run from its ``status.json``
=====================  ===============================================================

``forge config show``, ``forge episodes``, ``forge export``, ``forge serve`` and
``forge make-tiny-model`` are short glue in ``main`` over library functions. This is the top
layer: it may import anything in ``forge``; nothing in ``forge`` imports it. Subcommands
import their heavy dependencies lazily, so ``forge --help`` answers at once.
"""

from forge.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
