"""`python -m rules check [MODULE ...] [--jobs N] [--cache-dir DIR] [--json PATH] [--junit-xml PATH]`:
verify rules with examples."""

import sys

from ._check import main

if __name__ == "__main__":  # not when a worker process of `check --jobs` imports this module
    sys.exit(main())
