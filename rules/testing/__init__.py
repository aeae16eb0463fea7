"""rules.testing: finite differences and rule testers (ChainRulesTestUtils + FiniteDifferences).

Importing a tester into a test module is safe: every tester carries `__test__ = False`, so
pytest never collects `test_rrule` itself as a test.
"""

# Finite-difference methods (FiniteDifferences.jl's) and finite differences of pytree functions
from ._fdm import FDMethod as FDMethod
from ._fdm import backward_fdm as backward_fdm
from ._fdm import central_fdm as central_fdm
from ._fdm import extrapolate_fdm as extrapolate_fdm
from ._finite_differences import fd_jacobian as fd_jacobian
from ._finite_differences import fd_jvp as fd_jvp
from ._finite_differences import fd_vjp as fd_vjp
from ._fdm import forward_fdm as forward_fdm
from ._finite_differences import to_vec as to_vec

# Testers
from ._testers import RuleReport as RuleReport
from ._testers import test_frule as test_frule
from ._testers import test_rrule as test_rrule
from ._testers import test_scalar as test_scalar

# Tangents for testing
from ._compare import WithTangent as WithTangent
from ._compare import rand_tangent as rand_tangent
from ._compare import test_approx as test_approx
from ._compare import with_tangent as with_tangent
