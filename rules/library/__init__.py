"""rules.library: the shipped rules, one module per topic.

Importing a module registers its rules; `import rules` imports them all, and
`python -m rules check` verifies every rule that carries examples. `rules.library.jax`
(imported on its own) holds drop-in namespaces shaped like `jax.numpy`, `jax.nn` and
`jax.scipy.*` whose functions use these rules.
"""

from . import elementwise as elementwise
from . import implicit as implicit
from . import linalg as linalg
from . import linalg_solve as linalg_solve
from . import linalg_spectral as linalg_spectral
from . import linalg_matfun as linalg_matfun
from . import linalg_polar as linalg_polar
from . import logexp as logexp
from . import nn as nn
from . import nn_layers as nn_layers
from . import nondiff as nondiff
from . import special as special
from . import special_jax as special_jax
from . import stats as stats
