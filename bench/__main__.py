"""`python -m bench <scenario>`: see bench/cli.py."""

import sys

from .cli import main

# Guarded: spawned load workers import this module as __mp_main__ and must not run the suite.
if __name__ == "__main__":
    sys.exit(main())
