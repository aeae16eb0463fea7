"""`jax.scipy`'s `special`, `stats` and `linalg`, with the library's rules (see each module)."""

from . import linalg as linalg
from . import special as special
from . import stats as stats
