"""`python -m rules check [MODULE ...]`: verify every shipped rule that carries examples."""

import sys

from ._check import main

sys.exit(main())
