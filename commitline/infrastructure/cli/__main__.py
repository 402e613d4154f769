"""``python -m commitline.infrastructure.cli``: the same as the ``commitline`` console script."""

import sys

from commitline.infrastructure.cli import main

sys.exit(main())
