"""Shared machinery of `rules.library.implicit`: pytree arithmetic, convergence tests,
argument checks, a real-arithmetic GMRES, and the module-level example problems that
`python -m rules check` differentiates (static callables must be hashable and importable).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from .._errors import StaticArgumentError, format_message
from .._projection import is_differentiable_leaf
from .._zeros import NoTangent, ZeroTangent

PyTree = Any


# ----- helpers --------------------------------------------------------------------------------
def _tree_max_abs(tree: PyTree) -> jax.Array:
    leaves = [jnp.max(jnp.abs(leaf)) for leaf in jax.tree_util.tree_leaves(tree) if jnp.size(leaf)]
    return functools.reduce(jnp.maximum, leaves, jnp.zeros((), jnp.result_type(float)))


def _tree_sub(a: PyTree, b: PyTree) -> PyTree:
    return jax.tree_util.tree_map(jnp.subtract, a, b)


def _tree_add(a: PyTree, b: PyTree) -> PyTree:
    return jax.tree_util.tree_map(jnp.add, a, b)


def _tree_neg(a: PyTree) -> PyTree:
    return jax.tree_util.tree_map(jnp.negative, a)


def _tree_conj(a: PyTree) -> PyTree:
    return jax.tree_util.tree_map(jnp.conj, a)


def _cast_like(tree: PyTree, like: PyTree) -> PyTree:
    return jax.tree_util.tree_map(lambda a, b: jnp.asarray(a, jnp.result_type(b)), tree, like)


def _tol(tol: Any) -> jax.Array:
    """A tolerance as a strongly typed float array: one jit signature, traced or not."""
    return jax.lax.convert_element_type(tol, jnp.result_type(float))


def _floor_tol(tol: Any, tree: PyTree) -> jax.Array:
    """`tol`, but no tighter than the lowest precision among the leaves can reach (10 eps)."""
    dtypes = [jnp.result_type(leaf) for leaf in jax.tree_util.tree_leaves(tree)]
    eps = max((float(jnp.finfo(d).eps) for d in dtypes if jnp.issubdtype(d, jnp.inexact)), default=0.0)
    return jnp.maximum(jnp.asarray(tol, jnp.result_type(float)), 10 * eps)


def _converged(step: PyTree, x: PyTree, tol: jax.Array, floor: float = 1.0) -> jax.Array:
    """The step test |step|_inf <= tol (floor + |x|_inf): mixed absolute/relative for floor 1,
    purely relative for floor 0 (adjoint solves, whose scale is the seed's)."""
    return _tree_max_abs(step) <= tol * (floor + _tree_max_abs(x))


def _x0_cotangent(x0: PyTree) -> Any:
    """x* does not depend on the starting point: ZeroTangent (NoTangent for an int x0)."""
    return ZeroTangent() if any(map(is_differentiable_leaf, jax.tree_util.tree_leaves(x0))) else NoTangent()


def _check_static_callable(fn: Callable, api: str, arg: str) -> None:
    """Refuse a callable that captures traced values: they would be invisible to the rule."""
    captured = []
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            captured.append(cell.cell_contents)
        except ValueError:  # an empty cell
            pass
    if isinstance(fn, functools.partial):
        captured += [fn.args, fn.keywords]
    if hasattr(fn, "__self__"):
        captured.append(fn.__self__)
    if any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves(captured)):
        raise StaticArgumentError(
            format_message(
                f"`{api}`: `{arg}` captures a traced value (it closes over an array that is being "
                "differentiated, jitted or vmapped)",
                expected=f"`{arg}` a function of its arguments only, its parameters passed in `theta`",
                got=f"`{getattr(fn, '__qualname__', type(fn).__name__)}` closing over a JAX tracer",
                fix=f"move the captured arrays into `theta` (any pytree) and read them there; `{arg}` "
                "is a static argument (a cache key, not an input of the rule), so JAX cannot "
                "differentiate the values it captures",
            )
        )


def _check_real(x0: PyTree, api: str) -> None:
    for leaf in jax.tree_util.tree_leaves(x0):
        dtype = jnp.result_type(leaf)
        if not jnp.issubdtype(dtype, jnp.floating):
            raise ValueError(
                format_message(
                    f"`{api}`: the unknowns must be real floating arrays",
                    expected="float16/32/64 leaves in x0",
                    got=f"a leaf of dtype {np.dtype(dtype).name}",
                    fix="start from a float array (complex unknowns: split into real and imaginary parts)",
                )
            )


def _gmres(op: Callable, rhs: PyTree, tol: Any, maxiter: int | None) -> PyTree:
    """Solve op(u) = rhs by GMRES for an R-linear `op` on pytrees (complex leaves as real pairs,
    since a ChainRules pullback is only R-linear in general)."""
    flat, unravel = ravel_pytree(rhs)
    is_complex = jnp.iscomplexobj(flat)
    n = flat.shape[0]

    def to_real(v):
        return jnp.concatenate([jnp.real(v), jnp.imag(v)]) if is_complex else v

    def from_real(r):
        return jax.lax.complex(r[:n], r[n:]) if is_complex else r

    def op_real(r):
        return to_real(ravel_pytree(op(unravel(from_real(r))))[0])

    b = to_real(flat)
    u, _ = jax.scipy.sparse.linalg.gmres(op_real, b, tol=tol, atol=0.0, restart=min(20, max(1, b.shape[0])),
                                         maxiter=maxiter, solve_method="batched")
    return unravel(from_real(u))


# Example callables: module-level, so hashable and the same object on every call.
def _contraction(x, theta):
    """0.5 tanh(x) + theta: a contraction (rate <= 1/2) with a unique fixed point."""
    return 0.5 * jnp.tanh(x) + theta


def _deq_layer(x, theta):
    """A small implicit ("deep equilibrium") layer: x = tanh(W x + b) / 2, a contraction for ||W|| < 2."""
    w, b = theta
    return 0.5 * jnp.tanh(w @ x + b)


def _cubic(x, theta):
    """x^3 + x - theta, elementwise: one real root per entry."""
    return x**3 + x - theta


def _coupled(x, theta):
    """A x + x^3 / 10 - b: a coupled nonlinear system, one root for a diagonally dominant A."""
    a, b = theta
    return a @ x + 0.1 * x**3 - b


def _spd_matvec(x, a):
    """(A^H A + I) x: Hermitian positive definite for every A."""
    return jnp.conj(a).T @ (a @ x) + x


def _shifted_matvec(x, a):
    """(4 I + A) x: nonsymmetric, well conditioned for small A."""
    return 4 * x + a @ x


def _quadratic(x, theta):
    """x^T (A^T A + I) x / 2 - b^T x (real): strictly convex, minimiser (A^T A + I)^-1 b."""
    a, b = theta
    return 0.5 * jnp.sum(x * _spd_matvec(x, a)) - jnp.sum(b * x)


def _logistic_ridge(x, theta):
    """Ridge-regularised logistic regression: features A, labels y in [0, 1], weight lam."""
    a, y, lam = theta
    z = a @ x
    return jnp.sum(jax.nn.softplus(z) - y * z) + 0.5 * lam * jnp.sum(x * x)


_V3 = np.array([0.3, -0.5, 1.2])
_W3 = np.array([[0.3, -0.4, 0.2], [0.1, 0.5, -0.3], [-0.2, 0.25, 0.4]])
_A3 = np.array([[3.0, 0.5, -0.2], [0.4, 2.5, 0.3], [-0.1, 0.6, 2.8]])
_Z2 = np.array([0.3 + 0.2j, -0.4 + 0.1j])
_ZA2 = np.array([[0.5 + 0.3j, -0.2 + 0.1j], [0.3 - 0.4j, 0.1 + 0.6j]])
_F43 = np.array([[0.5, -1.0, 0.3], [1.2, 0.4, -0.7], [-0.3, 0.8, 1.1], [0.9, -0.2, 0.6]])
_Y4 = np.array([1.0, 0.0, 1.0, 0.3])
