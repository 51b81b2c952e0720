"""``python -m opforge.report summary|best|html ...`` (see opforge/report/cli.py)."""

import sys

from .cli import main

sys.exit(main())
