"""Elementwise functions of `jax.numpy` and `jax.nn`: rules from partial derivatives.

Each line is ChainRules' `@scalar_rule`: the partials, written with the output `y` where that
is cheaper, keyed on the JAX function itself so that `rules.rrule(jnp.sin, x)` answers as
ChainRules' `rrule(sin, x)` does and `rrule_via_ad` compositions use them. The examples are
what `python -m rules check` verifies each rule on (against finite differences and JAX).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import jax.scipy.special as jsp
import numpy as np

from .._helpers import scalar_rule as _scalar_rule
from .._projection import ProjectTo
from .._registry import frule, register_examples, rrule
from .._thunks import unthunk
from .._zeros import NoTangent, ZeroTangent

# Keyed on the JAX functions themselves (see above): registered on plain functions knowingly.
scalar_rule = functools.partial(_scalar_rule, plain=True)

_LOG2, _LOG10, _SQRT_PI = math.log(2.0), math.log(10.0), math.sqrt(math.pi)

# Example inputs: inside every domain below, away from branch points.
_X = np.array([0.3, 0.55, 0.8])
_X32 = _X.astype(np.float32)
_POS = np.array([0.4, 1.3, 2.5])
_BIG = np.array([1.2, 1.7, 3.0])
_Z = np.array([0.3 + 0.4j, -0.5 + 0.2j])


def _safe_div(a, b):
    """a / b, and 0 where b == 0 (the zero subgradient at a kink)."""
    return jnp.where(b == 0, 0.0, a / jnp.where(b == 0, 1.0, b))


def _ex(*arrays):
    return [tuple(np.asarray(a) for a in arrays)]


# ----- trigonometric ------------------------------------------------------------------------
scalar_rule(jnp.sin, lambda x, y: jnp.cos(x), examples=_ex(_X) + _ex(_X32) + _ex(_Z))
scalar_rule(jnp.cos, lambda x, y: -jnp.sin(x), examples=_ex(_X) + _ex(_Z))
scalar_rule(jnp.tan, lambda x, y: 1 + y * y, examples=_ex(_X) + _ex(_Z))
scalar_rule(jnp.arcsin, lambda x, y: 1 / jnp.sqrt(1 - x * x), examples=_ex(_X))
scalar_rule(jnp.arccos, lambda x, y: -1 / jnp.sqrt(1 - x * x), examples=_ex(_X))
scalar_rule(jnp.arctan, lambda x, y: 1 / (1 + x * x), examples=_ex(_X) + _ex(_Z))
scalar_rule(jnp.arctan2, lambda a, b, y: (b / (a * a + b * b), -a / (a * a + b * b)), examples=_ex(_X, _POS))
scalar_rule(jnp.hypot, lambda a, b, y: (_safe_div(a, y), _safe_div(b, y)), examples=_ex(_X, _POS))
scalar_rule(jnp.sinc, lambda x, y: jnp.where(x == 0, 0.0, (jnp.cos(math.pi * x) - y) / jnp.where(x == 0, 1.0, x)),
            examples=_ex(_X))
scalar_rule(jnp.deg2rad, lambda x, y: math.pi / 180, examples=_ex(_X))
scalar_rule(jnp.rad2deg, lambda x, y: 180 / math.pi, examples=_ex(_X))

# ----- hyperbolic ---------------------------------------------------------------------------
scalar_rule(jnp.sinh, lambda x, y: jnp.cosh(x), examples=_ex(_X) + _ex(_Z))
scalar_rule(jnp.cosh, lambda x, y: jnp.sinh(x), examples=_ex(_X) + _ex(_Z))
scalar_rule(jnp.tanh, lambda x, y: 1 - y * y, examples=_ex(_X) + _ex(_X32) + _ex(_Z))
scalar_rule(jnp.arcsinh, lambda x, y: 1 / jnp.sqrt(x * x + 1), examples=_ex(_X))
scalar_rule(jnp.arccosh, lambda x, y: 1 / jnp.sqrt(x * x - 1), examples=_ex(_BIG))
scalar_rule(jnp.arctanh, lambda x, y: 1 / (1 - x * x), examples=_ex(_X))

# ----- exponentials and logarithms ----------------------------------------------------------
scalar_rule(jnp.exp, lambda x, y: y, examples=_ex(_X) + _ex(_X32) + _ex(_Z))
scalar_rule(jnp.exp2, lambda x, y: y * _LOG2, examples=_ex(_X))
scalar_rule(jnp.expm1, lambda x, y: y + 1, examples=_ex(_X))
scalar_rule(jnp.log, lambda x, y: 1 / x, examples=_ex(_POS) + _ex(_Z))
scalar_rule(jnp.log1p, lambda x, y: 1 / (1 + x), examples=_ex(_X))
scalar_rule(jnp.log2, lambda x, y: 1 / (x * _LOG2), examples=_ex(_POS))
scalar_rule(jnp.log10, lambda x, y: 1 / (x * _LOG10), examples=_ex(_POS))
scalar_rule(jnp.logaddexp, lambda a, b, y: (jnp.exp(a - y), jnp.exp(b - y)), examples=_ex(_X, _POS))
scalar_rule(jnp.logaddexp2, lambda a, b, y: (jnp.exp2(a - y), jnp.exp2(b - y)), examples=_ex(_X, _POS))

# ----- powers and roots ---------------------------------------------------------------------
scalar_rule(jnp.sqrt, lambda x, y: 0.5 / y, examples=_ex(_POS) + _ex(_Z))
scalar_rule(jnp.cbrt, lambda x, y: 1 / (3 * y * y), examples=_ex(_POS))
scalar_rule(jnp.square, lambda x, y: 2 * x, examples=_ex(_X) + _ex(_Z))
scalar_rule(jnp.reciprocal, lambda x, y: -y * y, examples=_ex(_POS) + _ex(_Z))
scalar_rule(
    jnp.power,
    lambda x, p, y: (p * jnp.power(x, p - 1), jnp.where(x == 0, 0.0, y * jnp.log(jnp.where(x == 0, 1.0, x)))),
    examples=_ex(_POS, _X),
)

# ----- arithmetic ---------------------------------------------------------------------------
scalar_rule(jnp.negative, lambda x, y: -1.0, examples=_ex(_X))
scalar_rule(jnp.add, lambda a, b, y: (1.0, 1.0), examples=_ex(_X, _POS))
scalar_rule(jnp.subtract, lambda a, b, y: (1.0, -1.0), examples=_ex(_X, _POS))
scalar_rule(jnp.multiply, lambda a, b, y: (b, a), examples=_ex(_X, _POS) + _ex(_Z, _Z[::-1]))
scalar_rule(jnp.divide, lambda a, b, y: (1 / b, -y / b), examples=_ex(_X, _POS))

# ----- special functions --------------------------------------------------------------------
scalar_rule(jsp.erf, lambda x, y: (2 / _SQRT_PI) * jnp.exp(-x * x), examples=_ex(_X))
scalar_rule(jsp.erfc, lambda x, y: (-2 / _SQRT_PI) * jnp.exp(-x * x), examples=_ex(_X))
scalar_rule(jsp.erfinv, lambda x, y: (_SQRT_PI / 2) * jnp.exp(y * y), examples=_ex(_X))
scalar_rule(jsp.gammaln, lambda x, y: jsp.digamma(x), examples=_ex(_POS))
scalar_rule(jsp.expit, lambda x, y: y * (1 - y), examples=_ex(_X))
scalar_rule(jsp.logit, lambda x, y: 1 / (x * (1 - x)), examples=_ex(_X))

# ----- jax.nn activations -------------------------------------------------------------------
scalar_rule(jax.nn.sigmoid, lambda x, y: y * (1 - y), examples=_ex(_X) + _ex(_X32))
scalar_rule(jax.nn.softplus, lambda x, y: jax.nn.sigmoid(x), examples=_ex(_X))
scalar_rule(jax.nn.log_sigmoid, lambda x, y: jax.nn.sigmoid(-x), examples=_ex(_X))
scalar_rule(jax.nn.silu, lambda x, y: jax.nn.sigmoid(x) * (1 + x * (1 - jax.nn.sigmoid(x))), examples=_ex(_X))
scalar_rule(jax.nn.elu, lambda x, y: jnp.where(x > 0, 1.0, y + 1), examples=_ex(_X - 0.5))


# ----- abs: 0 at 0, and the complex case ----------------------------------------------------
# abs is not holomorphic, so it is written out: for complex z, x_bar = real(y_bar) * z / |z|,
# and at 0 the zero subgradient replaces JAX's NaN (complex) / sign convention.
def _unit(x):
    y = jnp.abs(x)
    safe = jnp.where(y == 0, 1, y)
    return jnp.where(y == 0, 0, x / safe).astype(jnp.result_type(x))


@frule.register(jnp.abs, plain=True)
def abs_frule(tangents, x):
    _, x_dot = tangents
    y = jnp.abs(x)
    if isinstance(x_dot, (NoTangent, ZeroTangent)):
        return y, ZeroTangent()
    return y, jnp.real(jnp.conj(_unit(x)) * x_dot).astype(y.dtype)


@rrule.register(jnp.abs, plain=True)
def abs_rrule(x):
    project_x = ProjectTo(x)
    unit = _unit(x)

    def abs_pullback(y_bar):
        return NoTangent(), project_x(jnp.real(unthunk(y_bar)) * unit)

    return jnp.abs(x), abs_pullback


register_examples(jnp.abs, _ex(_X - 0.5) + _ex(_Z))


# ----- sign: derivative zero ----------------------------------------------------------------
@frule.register(jnp.sign, plain=True)
def sign_frule(tangents, x):
    return jnp.sign(x), ZeroTangent()


@rrule.register(jnp.sign, plain=True)
def sign_rrule(x):
    def sign_pullback(y_bar):
        return NoTangent(), ZeroTangent()

    return jnp.sign(x), sign_pullback


register_examples(jnp.sign, _ex(_X - 0.5))
