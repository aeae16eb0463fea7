"""rules: ChainRules.jl's rule system for JAX.

Write a reverse rule (`rrule`) or forward rule (`frule`) once, with ChainRules' tangent types;
`primitive` lowers it into one JAX primitive that keeps its rules (or a `jax.custom_jvp` for an
frule alone), so `jax.jit`, `jax.vmap`, `jax.grad`, `jax.jvp` and `jax.linearize` use it. `rules.testing` checks rules against finite differences.
"""

# Tangent types
from ._zeros import AbstractZero as AbstractZero
from ._zeros import NoTangent as NoTangent
from ._zeros import ZeroTangent as ZeroTangent
from ._tangent import Tangent as Tangent
from ._tangent import backing as backing
from ._tangent import canonicalize as canonicalize
from ._thunks import AbstractThunk as AbstractThunk
from ._thunks import InplaceableThunk as InplaceableThunk
from ._thunks import Thunk as Thunk
from ._thunks import thunk as thunk
from ._thunks import unthunk as unthunk
from ._notimplemented import NotImplementedTangent as NotImplementedTangent
from ._notimplemented import not_implemented as not_implemented

# Projection
from ._projection import ProjectTo as ProjectTo

# Rules and the registry
from ._registry import frule as frule
from ._registry import has_frule as has_frule
from ._registry import has_rrule as has_rrule
from ._registry import opt_out as opt_out
from ._registry import register_examples as register_examples
from ._registry import registry_version as registry_version
from ._registry import rrule as rrule
from ._via_ad import frule_via_ad as frule_via_ad
from ._via_ad import rrule_via_ad as rrule_via_ad

# Definition helpers
from ._helpers import ignore_derivatives as ignore_derivatives
from ._helpers import non_differentiable as non_differentiable
from ._helpers import scalar_rule as scalar_rule

# Primitives and the JAX lowering
from ._primitive import Primitive as Primitive
from ._primitive import external as external
from ._primitive import primitive as primitive

# Errors
from ._errors import AmbiguousRuleError as AmbiguousRuleError
from ._errors import ForwardModeError as ForwardModeError
from ._errors import LoweringContractError as LoweringContractError
from ._errors import TracerClosureError as TracerClosureError
from ._errors import NotImplementedTangentError as NotImplementedTangentError
from ._errors import ProjectionError as ProjectionError
from ._errors import PullbackError as PullbackError
from ._errors import RuleDefinitionError as RuleDefinitionError
from ._errors import RuleError as RuleError
from ._errors import StaticArgumentError as StaticArgumentError
from ._errors import TangentStructureError as TangentStructureError
from ._registry import PlainFunctionWarning as PlainFunctionWarning

__version__ = "0.1.0"
from . import library as library  # registers the shipped rules

# The implicit solvers' convergence report and error (rules.library.implicit)
from .library.implicit import ConvergenceError as ConvergenceError
from .library.implicit import SolveInfo as SolveInfo
