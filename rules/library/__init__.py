"""rules.library: the shipped rules, one module per topic.

Importing a module registers its rules; `import rules` imports them all, and
`python -m rules check` verifies every rule that carries examples.
"""

from . import elementwise as elementwise
from . import implicit as implicit
from . import linalg as linalg
from . import logexp as logexp
from . import linalg_solve as linalg_solve
from . import linalg_spectral as linalg_spectral
from . import linalg_matfun as linalg_matfun
from . import nn as nn
from . import nn_layers as nn_layers
from . import nondiff as nondiff
from . import special as special
from . import stats as stats
