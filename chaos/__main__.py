"""`python -m chaos`: see chaos/cli.py."""

import sys

from .cli import main

sys.exit(main())
