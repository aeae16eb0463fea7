"""zygote_jax: Zygote.jl's user API on JAX.

`gradient`, `pullback`, `jacobian`, `hessian`, ... with Zygote's return conventions, on top
of `jax.vjp` / `jax.jvp`, so they compose with `jax.jit` and `jax.vmap`, and every
`rules.Primitive` is differentiated through its registered rules.
"""

# Reverse mode
from ._api import WithGradient as WithGradient
from ._api import gradient as gradient
from ._api import jacobian as jacobian
from ._api import pullback as pullback
from ._api import withgradient as withgradient
from ._api import withjacobian as withjacobian

# Second order and forward mode
from ._forward import diaghessian as diaghessian
from ._forward import forward_jacobian as forward_jacobian
from ._forward import forwarddiff as forwarddiff
from ._forward import hessian as hessian
from ._forward import hessian_reverse as hessian_reverse

# Rules in Zygote's format
from ._adjoint import adjoint as adjoint

# Gradient control
from ._control import Buffer as Buffer
from ._control import checkpointed as checkpointed
from ._control import dropgrad as dropgrad
from ._control import hook as hook
from ._control import ignore_derivatives as ignore_derivatives
from ._control import isderiving as isderiving

# Implicit parameters
from ._params import Grads as Grads
from ._params import Params as Params

# Errors and warnings
from ._errors import AdjointWarning as AdjointWarning
from ._errors import GradientError as GradientError
from ._control import BufferIndexError as BufferIndexError
from ._control import BufferShapeError as BufferShapeError
from ._control import BufferTypeError as BufferTypeError

__version__ = "0.1.0"
