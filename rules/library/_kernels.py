"""The kernels x^p e^-x and x^p (1 - x)^q of the gamma and beta densities, in log space,
with derivatives in x that are right at the ends of the domain to every order.

They are the slopes of the incomplete gamma and beta functions (p = a - 1, q = b - 1):
d/dx P(a, x) = x^(a-1) e^-x / Gamma(a). Written as exp(p log x - x - c), the slope's own
derivative at x = 0 is 0 * inf (exp's value times p / x): NaN, or 0 where a strong-zero
product rounds it so, while the true second derivative of P(2, x) = 1 - (1 + x) e^-x there is
1. Here d/dx x^p = p x^(p-1) by the kernel again, exactly 0 for p == 0, so every order of
derivative is a kernel with a lower power: finite where the true one is.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import jax.scipy.special as jsp
from jax.custom_derivatives import SymbolicZero

__all__ = ["gamma_kernel", "beta_kernel"]


def _lowered(power: Any, x: Any, edge: float, kernel: Callable[[Any], Any]) -> Any:
    """power * kernel(power - 1), the derivative of (x or 1 - x)^power: exactly 0 where
    power == 0 at the edge (x^0 = 1 is flat; `kernel(-1)` is infinite there). Elsewhere the
    product stays, so its derivative in the power (x^-1 at power 0) is kept."""
    flat = (power == 0) & (x == edge)
    return jnp.where(flat, 0, power * kernel(jnp.where(flat, 1, power) - 1))


def _times_log(value: Any, log: Any, at_edge: Any) -> Any:
    """value * log, with log 1 = 0 at the edge (as JAX's pow: d/dp 0^p is 0 there)."""
    return value * jnp.where(at_edge, 0, log)


@jax.custom_jvp
def gamma_kernel(p: Any, x: Any, c: Any) -> Any:
    """x^p e^(-x - c) for x >= 0, 0^0 = 1. Arrays of one shape and real floating dtype."""
    return jnp.exp(jsp.xlogy(p, x) - x - c)


def _gamma_kernel_jvp(primals: tuple, tangents: tuple) -> tuple:
    p, x, c = primals
    p_dot, x_dot, c_dot = tangents
    y = gamma_kernel(p, x, c)
    y_dot = jnp.zeros_like(y)
    if not isinstance(x_dot, SymbolicZero):
        y_dot += (_lowered(p, x, 0, lambda q: gamma_kernel(q, x, c)) - y) * x_dot
    if not isinstance(p_dot, SymbolicZero):
        y_dot += _times_log(y, jnp.log(jnp.where(x == 0, 1, x)), x == 0) * p_dot
    if not isinstance(c_dot, SymbolicZero):
        y_dot -= y * c_dot
    return y, y_dot


gamma_kernel.defjvp(_gamma_kernel_jvp, symbolic_zeros=True)


@jax.custom_jvp
def beta_kernel(p: Any, q: Any, x: Any, c: Any) -> Any:
    """x^p (1 - x)^q e^-c for 0 <= x <= 1, 0^0 = 1. Arrays of one shape and real floating dtype."""
    return jnp.exp(jsp.xlogy(p, x) + jsp.xlog1py(q, -x) - c)


def _beta_kernel_jvp(primals: tuple, tangents: tuple) -> tuple:
    p, q, x, c = primals
    p_dot, q_dot, x_dot, c_dot = tangents
    y = beta_kernel(p, q, x, c)
    y_dot = jnp.zeros_like(y)
    if not isinstance(x_dot, SymbolicZero):
        slope = _lowered(p, x, 0, lambda p1: beta_kernel(p1, q, x, c)) - _lowered(q, x, 1, lambda q1: beta_kernel(p, q1, x, c))
        y_dot += slope * x_dot
    if not isinstance(p_dot, SymbolicZero):
        y_dot += _times_log(y, jnp.log(jnp.where(x == 0, 1, x)), x == 0) * p_dot
    if not isinstance(q_dot, SymbolicZero):
        y_dot += _times_log(y, jnp.log1p(-jnp.where(x == 1, 0, x)), x == 1) * q_dot
    if not isinstance(c_dot, SymbolicZero):
        y_dot -= y * c_dot
    return y, y_dot


beta_kernel.defjvp(_beta_kernel_jvp, symbolic_zeros=True)
