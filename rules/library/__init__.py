"""rules.library: the shipped rules, one module per topic.

Importing a module registers its rules; `python -m rules check` imports them all.
"""

from . import elementwise as elementwise
from . import nondiff as nondiff
