"""``python -m sarjax.cli``."""

import sys

from sarjax.cli import main

sys.exit(main())
