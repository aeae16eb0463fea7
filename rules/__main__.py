"""`python -m rules check [MODULE ...] [--json PATH] [--junit-xml PATH]`: verify rules with examples."""

import sys

from ._check import main

sys.exit(main())
