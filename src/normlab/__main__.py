"""``python -m normlab ...``: the same as the ``normlab`` console script."""

import sys

from .cli import main

sys.exit(main())
