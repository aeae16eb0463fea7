"""Drop-in namespaces shaped like JAX's, whose functions use the library's rules.

Change one import and `jax.grad`, `jax.jit`, `jax.vmap` and `zygote_jax.gradient` use the
library's rules wherever it has one that is right where plain JAX is not:

    import rules.library.jax.numpy as jnp         # for: import jax.numpy as jnp
    from rules.library.jax import nn              # for: from jax import nn
    from rules.library.jax.scipy import special, stats, linalg

Each module is JAX's own module with the names in its `SHADOWED` replaced: JAX's signature
and values, the library's derivatives. Every other name is JAX's object itself.
"""

from . import nn as nn
from . import numpy as numpy
from . import scipy as scipy
