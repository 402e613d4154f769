"""``python -m commitline.cli``: the same as the ``commitline`` console script."""

import sys

from commitline.cli import main

sys.exit(main())
