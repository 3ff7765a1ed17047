"""``python -m zoo.cli``: the ``zoo`` command (as ``torchrun -m zoo.cli train ...`` runs it)."""

import sys

from . import main

sys.exit(main())
