"""Rules for `jax.scipy.special`'s own functions at their edges: betainc, gammainc, i0, ...

The functions: betainc, betaln, gammainc, gammaincc, i0, i1, i0e, i1e.

Keyed on JAX's functions themselves (as `rules.library.elementwise`'s), so that
`rules.rrule(jsp.betainc, ...)` answers and `rules.primitive(jsp.betainc)` (the drop-in
`rules.library.jax.scipy.special.betainc`) uses them; the values are JAX's, computed in JAX
(no host call, unlike `rules.library.special`'s SciPy functions). Each is one `scalar_rule`:
its frule is the lowering, which JAX transposes for reverse mode.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import jax.scipy.special as jsp
import numpy as np

from .._helpers import scalar_rule
from .._notimplemented import not_implemented
from .._primitive import primitive
from .._registry import register_examples
from .._thunks import thunk
from ._kernels import beta_kernel, gamma_kernel

__all__: list[str] = []  # rules only, on jax.scipy.special's functions

_X = np.array([0.7, 1.9, 3.1])


def _like(y: Any, *args: Any) -> list:
    """The arguments in the output's dtype, broadcast to its shape."""
    return [jnp.broadcast_to(jnp.asarray(a, y.dtype), y.shape) for a in args]


# ----- betaln: d/da = digamma(a) - digamma(a + b), d/db likewise ---------------------------------
# JAX 0.10 differentiates its own series for log B(a, b): its second derivatives are wrong
# wherever a = b (0.5, 1, 10, 1000: 100-200% off) and its first ones lose accuracy (2.6e-7
# relative at (8, 9) in float64). The values stay JAX's: JAX 0.10's are 2e-8 to 5e-8 off where
# the larger shape is past about 8 with the smaller not close to it ((8, 9), (3, 12), (0.3, 20);
# JAX 0.12's are right), so finite differences of those values differ from the true slope there.
@jax.jit  # one program: op by op, the 30 shifts took 60 ms of an eager gradient
def _digamma_difference(a, b):
    """psi(a) - psi(a + b) for a, b > 0, without its cancellation where b << a (as two
    digammas: 1.7e-3 off at (1e12, 2) in float64, 1.4e-3 at (1e4, 1) in float32; and so its
    derivatives, the Hessian's). Below a = m, psi(x) = psi(x + 1) - 1/x shifts a by m: the
    differences b / ((a + k) (a + b + k)) all have one sign. From m on, psi's asymptotic series
    to x^-8, each difference of powers written as a multiple of b (its first omitted term is
    below 1e-18 of the result there)."""
    m = 10 if jnp.finfo(a.dtype).eps > 1e-10 else 30
    low = a < m
    shifted = jnp.zeros_like(a)
    for k in range(m):
        shifted = shifted + jnp.where(low, b / (a + k) / (a + b + k), 0)
    x = jnp.where(low, a + m, a)
    c = x + b
    d1 = b / x / c  # 1/x - 1/c
    x2, c2 = 1 / (x * x), 1 / (c * c)
    d2 = d1 * (1 / x + 1 / c)  # 1/x^2 - 1/c^2
    d4 = d2 * (x2 + c2)
    d6 = d2 * (x2 * x2 + x2 * c2 + c2 * c2)
    d8 = d4 * (x2 * x2 + c2 * c2)
    return -jnp.log1p(b / x) - d1 / 2 - d2 / 12 + d4 / 120 - d6 / 252 + d8 / 240 - shifted


def _betaln_partials(a, b, y):
    a, b = _like(y, a, b)
    return _digamma_difference(a, b), _digamma_difference(b, a)


scalar_rule(jsp.betaln, _betaln_partials, plain=True)
register_examples(jsp.betaln, [(np.array([1.0, 0.5, 10.0, 2.0]), np.array([1.0, 0.5, 10.0, 3.0])),
                               (np.array([1.5, 4.0]), np.array([2.5, 4.0], np.float32))])
_betaln = primitive(jsp.betaln)  # for the rules below, rules.library.stats and the drop-in namespace


# ----- betainc: d/dx = x^(a-1) (1-x)^(b-1) / B(a, b) ----------------------------------------------
def _betainc_partials(a, b, x, y):
    a, b, x = _like(y, a, b, x)
    slope = beta_kernel(a - 1, b - 1, x, _betaln(a, b))  # right at x = 0 and 1 to every order
    missing = "`jax.scipy.special.betainc`: the derivatives with respect to a and b are not implemented (JAX has none)"
    return not_implemented(missing), not_implemented(missing), slope


scalar_rule(jsp.betainc, _betainc_partials, plain=True)
register_examples(jsp.betainc, [(np.array([1, 2, 3]), np.array([1, 1, 4]), np.array([0.2, 0.5, 0.7])),
                                 (np.array([2, 1]), np.array([3, 2]), np.array([0.4, 0.6], np.float32))])


# ----- gammainc, gammaincc: d/dx = +-x^(a-1) e^(-x) / Gamma(a) ------------------------------------
def _gammainc_partials(sign: float, f: Callable) -> Callable:
    def partials(a, x, y):
        a, x = _like(y, a, x)
        slope = sign * gamma_kernel(a - 1, x, jsp.gammaln(a))  # right at x = 0 to every order
        # JAX's own d/da (igamma_grad_a) has no derivative, in a or in x: a thunk, computed
        # only where a moves, so that jax.hessian in x alone never differentiates it
        by_a = thunk(lambda: jax.jvp(lambda a: f(a, x), (a,), (jnp.ones_like(a),))[1])
        return by_a, slope

    return partials


scalar_rule(jsp.gammainc, _gammainc_partials(1.0, jsp.gammainc), plain=True)
scalar_rule(jsp.gammaincc, _gammainc_partials(-1.0, jsp.gammaincc), plain=True)
for _f in (jsp.gammainc, jsp.gammaincc):
    register_examples(_f, [(np.array([1.0, 2.5, 4.0]), _X), (np.array([1.5, 3.0]), np.array([0.5, 2.0], np.float32))])


# ----- i0, i1, i0e, i1e -----------------------------------------------------------------------------
# I_1'(x) = sum_k (2k + 1) (x/2)^(2k) / (2 k! (k + 1)!): its terms to x^8, used below 0.05 in
# float64 and 0.5 in float32. The first omitted term, 6.2e-8 x^10, is below 2e-20 (2e-10) of
# 1/2 there; above, the quotient's derivatives cancel to ~eps / x^2 of theirs (6e-14, 3e-7).
_I1_SERIES = (1 / 2, 3 / 16, 5 / 384, 7 / 18432, 9 / 1474560)


@functools.partial(jax.jit, static_argnames="scaled")
def _i1_slope(x, scaled: bool):
    """I_1'(x) = e^|x| (i0e(x) - i1e(x) / x), or e^(-|x|) I_1'(x) (`scaled`): by its series for
    small |x| (1/2 at 0), where the quotient's own derivatives (the second and third of I_1)
    cancel (float32 at 2e-4: 480% off with the series below 1e-4 only). The series is not
    multiplied by e^|x| e^-|x|, whose derivatives cancel to eps of 1/2."""
    x = jnp.asarray(x)
    near = jnp.abs(x) < (0.5 if jnp.finfo(x.dtype).eps > 1e-10 else 0.05)
    safe = jnp.where(near, jnp.ones_like(x), x)
    xs = jnp.where(near, x, jnp.zeros_like(x))
    t, series = xs * xs, jnp.zeros_like(xs)
    for c in reversed(_I1_SERIES):
        series = c + t * series
    quotient = jsp.i0e(safe) - jsp.i1e(safe) / safe
    if scaled:
        return jnp.where(near, jnp.exp(-jnp.abs(xs)) * series, quotient)
    return jnp.where(near, series, jnp.exp(jnp.abs(safe)) * quotient)


scalar_rule(jsp.i0, lambda x, y: jsp.i1(jnp.asarray(x, y.dtype)), plain=True)
# I_1' = I_0 - I_1 / x = e^|x| (i0e(x) - i1e(x) / x): the difference of the scaled functions is
# finite where I_0 and I_1 overflow (JAX: inf - inf = NaN), and 1/2 at 0
scalar_rule(jsp.i1, lambda x, y: _i1_slope(jnp.asarray(x, y.dtype), scaled=False), plain=True)
# i0e' = i1e - sign(x) i0e (at 0 the zero subgradient, as `abs`'s); i1e' = e^-|x| I_1' - sign(x) i1e
scalar_rule(jsp.i0e, lambda x, y: jsp.i1e(x) - jnp.sign(x) * y, plain=True)
scalar_rule(jsp.i1e, lambda x, y: _i1_slope(jnp.asarray(x, y.dtype), scaled=True) - jnp.sign(x) * y, plain=True)
for _f in (jsp.i0, jsp.i1, jsp.i0e, jsp.i1e):
    register_examples(_f, [(np.array([-2.0, 1e-3, 0.7, 30.0]),), (np.array([-1.5, 0.4, 8.0], np.float32),)])
