"""``python -m forge.cli``: the ``forge`` command."""

import sys

from forge.cli.main import main

sys.exit(main())
