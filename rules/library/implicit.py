"""Implicit differentiation: solutions of equations, differentiated by the implicit function theorem.

`fixed_point`, `root`, `linear_solve` and `argmin` compute x*(theta) with an iterative solver:
a `lax.while_loop`, which JAX's reverse mode cannot differentiate at all (and which, unrolled,
would keep every iterate for the backward pass). Their pullbacks differentiate the *equation*
instead: with G(x*, theta) = 0, the cotangent of theta is (dG/dtheta)^T u where u solves ONE
linear system (dG/dx)^T u = -x_bar at x*. Memory is O(1) in the number of iterations, and the
gradient is exact at convergence whatever solver found x*.

The callables (`f`, `F`, `matvec`, `loss`) are static arguments: hashable (module-level
functions are best), taking their parameters through `theta`, a pytree; they must not close
over traced values (see `fixed_point`). Solver cores are jitted with the callable static, so
repeated eager calls reuse one compilation.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from .._errors import format_message
from .._primitive import primitive
from .._projection import ProjectTo
from .._thunks import unthunk
from .._via_ad import _dense, rrule_via_ad
from .._zeros import NoTangent
from ._implicit_common import (
    _A3,
    _F43,
    _V3,
    _W3,
    _Y4,
    _Z2,
    _ZA2,
    _cast_like,
    _check_real,
    _check_static_callable,
    _contraction,
    _converged,
    _coupled,
    _deq_layer,
    _floor_tol,
    _gmres,
    _logistic_ridge,
    _spd_matvec,
    _tol,
    _tree_add,
    _tree_conj,
    _tree_neg,
    _tree_sub,
    _x0_cotangent,
)

__all__ = ["fixed_point", "root", "linear_solve", "argmin"]

PyTree = Any


# ----- fixed_point --------------------------------------------------------------------------
def _iterate_impl(f: Callable, x0: PyTree, theta: PyTree, tol: Any, max_iter: int, floor: float = 1.0) -> PyTree:
    shapes = jax.eval_shape(f, x0, theta)
    x_tree, f_tree = jax.tree_util.tree_structure(x0), jax.tree_util.tree_structure(shapes)
    x_shapes = [np.shape(leaf) for leaf in jax.tree_util.tree_leaves(x0)]
    f_shapes = [tuple(s.shape) for s in jax.tree_util.tree_leaves(shapes)]
    if x_tree != f_tree or x_shapes != f_shapes:
        raise ValueError(
            format_message(
                "`fixed_point(f, x0, theta)`: f(x, theta) must return a value shaped like x",
                expected=f"structure {x_tree} with shapes {x_shapes}",
                got=f"structure {f_tree} with shapes {f_shapes}",
                fix="make f map an iterate to an iterate of the same structure and shapes",
            )
        )
    x = jax.tree_util.tree_map(lambda leaf, s: jnp.asarray(leaf, s.dtype), x0, shapes)
    tol = _floor_tol(tol, x)

    def cond(state):
        k, _, done = state
        return (k < max_iter) & ~done

    def body(state):
        k, x, _ = state
        x_new = _cast_like(f(x, theta), x)
        return k + 1, x_new, _converged(_tree_sub(x_new, x), x_new, tol, floor)

    _, x_star, _ = jax.lax.while_loop(cond, body, (jnp.zeros((), jnp.int32), x, jnp.zeros((), bool)))
    return x_star


_iterate = jax.jit(_iterate_impl, static_argnames=("f", "max_iter"))


@functools.partial(jax.jit, static_argnames=("f", "max_iter", "adjoint"))
def _fixed_point_adjoint(f, x_star, theta, x_bar, tol, max_iter, adjoint):
    """u = x_bar + (df/dx)^T u at x*, then theta_bar = (df/dtheta)^T u (ChainRules' convention)."""
    _, f_pullback = rrule_via_ad(f, x_star, theta)

    def adjoint_x(u):
        return _cast_like(_dense(f_pullback(u)[1], x_star), x_star)

    if adjoint == "gmres":
        u = _gmres(lambda v: _tree_sub(v, adjoint_x(v)), x_bar, _floor_tol(tol, x_star), max_iter)
    else:
        u = _iterate_impl(lambda v, b: _tree_add(b, adjoint_x(v)), x_bar, x_bar, tol, max_iter, floor=0.0)
    return unthunk(f_pullback(u)[2])


@primitive(
    examples=[
        (_deq_layer, np.zeros(3), (_W3, _V3)),
        (_contraction, np.zeros(3, np.float32), _V3.astype(np.float32)),
        (_contraction, np.zeros(2, np.complex128), _Z2),
    ]
)
def fixed_point(
    f: Callable, x0: PyTree, theta: PyTree, *, tol: float = 1e-12, max_iter: int = 1000, adjoint: str = "iterate"
) -> PyTree:
    """The fixed point x* = f(x*, theta), by iteration; differentiated implicitly.

    Why a rule: the iteration is a `lax.while_loop`, which JAX's reverse mode cannot
    differentiate at all (an unrolled loop could be, but stores every iterate). The pullback
    solves the adjoint equation u = x_bar + (df/dx)^T u at x* (by the same iteration, or
    GMRES) and returns theta_bar = (df/dtheta)^T u: one linear solve, memory independent of
    the number of iterations.

    Args:
      f: `f(x, theta) -> x`, a contraction in x near x*. A static argument: hashable (a
        module-level function is best). It must not close over traced values: f is a key of
        the lowering's cache, not an input of the rule, so JAX cannot differentiate what it
        captures (it would meet the bare while_loop or leak a tracer), and a closure built
        anew on every trace is a new cache entry every time. Pass such values in `theta`; a
        closure over a tracer raises `StaticArgumentError`.
      x0: the starting iterate (a pytree of arrays). x* does not depend on it: its
        cotangent is `ZeroTangent()`.
      theta: the parameters, any pytree (int leaves are not differentiated).
      tol: stop when |x_{k+1} - x_k|_inf <= tol (1 + |x_{k+1}|_inf), never tighter than 10 eps
        of the dtype; also the tolerance of the adjoint solve. The default is tight because
        the implicit gradient is exact only at x*: its error follows x*'s.
      max_iter: at most this many iterations (forward, and adjoint).
      adjoint: "iterate" (u <- x_bar + (df/dx)^T u, which converges at the forward
        iteration's rate) or "gmres" (GMRES on I - (df/dx)^T, for slowly contracting maps).

    Returns:
      x*, with f's output structure and dtypes.

    >>> import jax, jax.numpy as jnp
    >>> from rules.library.implicit import fixed_point
    >>> from rules.library._implicit_common import _contraction  # example problems
    >>> round(float(fixed_point(_contraction, 0.0, 1.0)), 6)   # x = tanh(x) / 2 + 1
    1.44761
    >>> g = jax.grad(lambda t: fixed_point(_contraction, 0.0, t))(1.0)   # 1 / (1 - sech(x*)^2 / 2)
    >>> round(float(g), 6)
    1.110237

    See also: `root`, `argmin`, `linear_solve`, `jax.lax.custom_root`.
    """
    _check_static_callable(f, "fixed_point", "f")
    if adjoint not in ("iterate", "gmres"):
        raise ValueError(f"`fixed_point`: adjoint must be 'iterate' or 'gmres'; got {adjoint!r}.")
    return _iterate(f, x0, theta, _tol(tol), max_iter)


@fixed_point.rrule
def fixed_point_rrule(f, x0, theta, *, tol=1e-12, max_iter=1000, adjoint="iterate"):
    x_star = fixed_point(f, x0, theta, tol=tol, max_iter=max_iter, adjoint=adjoint)
    project_theta = ProjectTo(theta)
    x0_bar = _x0_cotangent(x0)

    def fixed_point_pullback(x_bar):
        x_bar = _cast_like(_dense(unthunk(x_bar), x_star), x_star)
        theta_bar = _fixed_point_adjoint(f, x_star, theta, x_bar, _tol(tol), max_iter, adjoint)
        return NoTangent(), NoTangent(), x0_bar, project_theta(theta_bar)

    return x_star, fixed_point_pullback


# ----- root ---------------------------------------------------------------------------------
def _check_vector(x0: Any, api: str) -> jax.Array:
    x0 = jnp.asarray(x0)
    if x0.ndim != 1:
        raise ValueError(
            format_message(
                f"`{api}`: x0 must be a 1-D array of unknowns",
                expected="shape (n,)", got=f"shape {x0.shape}",
                fix="ravel the unknowns into one vector (e.g. `jax.flatten_util.ravel_pytree`)",
            )
        )
    _check_real(x0, api)
    return x0


@functools.partial(jax.jit, static_argnames=("F", "max_iter"))
def _newton(F: Callable, x0: jax.Array, theta: PyTree, tol: Any, max_iter: int) -> jax.Array:
    """Damped Newton: the full step near the root; halved while |F|^2 does not decrease enough."""
    out = jax.eval_shape(F, x0, theta)
    if out.shape != x0.shape:
        raise ValueError(
            format_message(
                "`root(F, x0, theta)`: F(x, theta) must return a vector shaped like x",
                expected=f"shape {x0.shape}", got=f"shape {out.shape}",
                fix="F must be a square system: as many equations as unknowns",
            )
        )
    x0 = x0.astype(jnp.result_type(x0, out.dtype))
    tol = _floor_tol(tol, x0)

    def sq_residual(x):
        return jnp.sum(F(x, theta) ** 2)

    def cond(state):
        k, _, done = state
        return (k < max_iter) & ~done

    def body(state):
        k, x, _ = state
        fx = F(x, theta).astype(x.dtype)
        step = jnp.linalg.solve(jax.jacrev(F)(x, theta).astype(x.dtype), -fx)
        r0 = jnp.sum(fx**2)

        def too_long(s):
            t, r = s
            return (r > (1 - 1e-4 * t) * r0) & (t > 1e-3)

        def halve(s):
            t, _ = s
            return 0.5 * t, sq_residual(x + 0.5 * t * step)

        t, _ = jax.lax.while_loop(too_long, halve, (jnp.ones((), x.dtype), sq_residual(x + step)))
        x_new = x + t * step
        return k + 1, x_new, _converged(t * step, x_new, tol) | (r0 == 0)

    _, x_star, _ = jax.lax.while_loop(cond, body, (jnp.zeros((), jnp.int32), x0, jnp.zeros((), bool)))
    return x_star


@functools.partial(jax.jit, static_argnames=("F",))
def _root_adjoint(F, x_star, theta, x_bar):
    """(dF/dx)^T u = -x_bar at x*, then theta_bar = (dF/dtheta)^T u."""
    jac = jax.jacrev(F)(x_star, theta).astype(x_star.dtype)
    u = jnp.linalg.solve(jac.T, -x_bar)
    _, F_pullback = rrule_via_ad(F, x_star, theta)
    return unthunk(F_pullback(u)[2])


@primitive(
    examples=[
        (_coupled, np.zeros(3), (_A3, _V3)),
    ]
)
def root(F: Callable, x0: jax.Array, theta: PyTree, *, tol: float = 1e-12, max_iter: int = 50) -> jax.Array:
    """A root x* of F(x, theta) = 0, by Newton's method; differentiated implicitly.

    Why a rule: Newton's loop is a `lax.while_loop` (no reverse mode in JAX), and the
    derivative of its iterates is not the root's until it has converged. The pullback solves
    (dF/dx)^T u = -x_bar once, at x*, and returns theta_bar = (dF/dtheta)^T u.

    The forward pass is damped Newton with a dense Jacobian from `jax.jacrev` (which also
    works when F calls primitives that have only reverse rules): meant for small systems
    (up to a few hundred unknowns) started in the basin of the wanted root.

    Args:
      F: `F(x, theta) -> residual`, as many equations as unknowns; a static, hashable
        callable that must not close over traced values (pass parameters in `theta`; see
        `fixed_point`).
      x0: the starting point, a 1-D real float array; its cotangent is `ZeroTangent()`.
      theta: the parameters, any pytree.
      tol: stop when the Newton step is at most tol (1 + |x|_inf), never tighter than 10 eps.
      max_iter: at most this many Newton steps.

    Returns:
      x*, with F(x*, theta) ~ 0, shaped like x0.

    Raises:
      ValueError: x0 is not a 1-D real vector, or F's output is not shaped like x0.

    >>> import jax, jax.numpy as jnp
    >>> from rules.library.implicit import root
    >>> from rules.library._implicit_common import _cubic  # example problems
    >>> x = root(_cubic, jnp.zeros(1), jnp.array([2.0]))     # x^3 + x = 2
    >>> round(float(x[0]), 8)
    1.0
    >>> dx = jax.grad(lambda t: root(_cubic, jnp.zeros(1), t)[0])(jnp.array([2.0]))   # 1 / (3 x^2 + 1)
    >>> round(float(dx[0]), 8)
    0.25

    See also: `fixed_point`, `argmin`, `jax.lax.custom_root`.
    """
    _check_static_callable(F, "root", "F")
    return _newton(F, _check_vector(x0, "root"), theta, _tol(tol), max_iter)


@root.rrule
def root_rrule(F, x0, theta, *, tol=1e-12, max_iter=50):
    x_star = root(F, x0, theta, tol=tol, max_iter=max_iter)
    project_theta = ProjectTo(theta)
    x0_bar = _x0_cotangent(x0)

    def root_pullback(x_bar):
        x_bar = _cast_like(_dense(unthunk(x_bar), x_star), x_star)
        return NoTangent(), NoTangent(), x0_bar, project_theta(_root_adjoint(F, x_star, theta, x_bar))

    return x_star, root_pullback


# ----- linear_solve -------------------------------------------------------------------------
def _krylov(op: Callable, b: PyTree, tol: Any, method: str, maxiter: int | None) -> PyTree:
    tol = _floor_tol(tol, b)
    if method == "cg":
        return jax.scipy.sparse.linalg.cg(op, b, tol=tol, atol=0.0, maxiter=maxiter)[0]
    size = sum(np.size(leaf) for leaf in jax.tree_util.tree_leaves(b))
    return jax.scipy.sparse.linalg.gmres(op, b, tol=tol, atol=0.0, restart=min(20, max(1, size)),
                                         maxiter=maxiter, solve_method="batched")[0]


@functools.partial(jax.jit, static_argnames=("matvec", "method", "maxiter"))
def _linear_solve_forward(matvec, b, theta, tol, method, maxiter):
    out = jax.eval_shape(matvec, b, theta)
    b = _cast_like(b, out)
    return _krylov(lambda v: _cast_like(matvec(v, theta), b), b, tol, method, maxiter)


@functools.partial(jax.jit, static_argnames=("matvec", "method", "symmetric", "maxiter"))
def _linear_solve_adjoint(matvec, x, theta, x_bar, tol, method, symmetric, maxiter):
    """A^H u = x_bar (ChainRules' convention), then theta_bar = (d(A x)/dtheta)^T (-u)."""
    if symmetric:
        adjoint_op = lambda v: _cast_like(matvec(v, theta), x)  # noqa: E731
    else:
        transpose = jax.linear_transpose(lambda v: _cast_like(matvec(v, theta), x), x)
        adjoint_op = lambda v: _tree_conj(transpose(_tree_conj(v))[0])  # noqa: E731
    u = _krylov(adjoint_op, x_bar, tol, method, maxiter)
    _, matvec_pullback = rrule_via_ad(matvec, x, theta)
    return u, unthunk(matvec_pullback(_tree_neg(u))[2])


@primitive(
    examples=[
        (_spd_matvec, _V3, _W3),
        (_spd_matvec, _Z2, _ZA2),
    ]
)
def linear_solve(
    matvec: Callable,
    b: PyTree,
    theta: PyTree,
    *,
    method: str = "cg",
    symmetric: bool | None = None,
    tol: float = 1e-12,
    maxiter: int | None = None,
) -> PyTree:
    """x = A(theta)^-1 b for a matrix-free operator `matvec(x, theta) = A(theta) x`, by CG or GMRES.

    Why a rule: differentiating the Krylov iterations themselves would store every iterate
    and differentiate the solver's rounding; the pullback solves the adjoint system
    A^H u = x_bar once with the transposed operator (`matvec` itself when symmetric, else
    `jax.linear_transpose` of it) and returns b_bar = u, theta_bar = (d(A x)/dtheta)^T (-u).
    JAX's own `cg`/`gmres` differentiate implicitly too (for what the operator closes over);
    here the operator's parameters are an explicit argument with a ChainRules rule, which
    `rrule_via_ad` compositions and the testers see, and the gradients agree with JAX's.

    Args:
      matvec: `matvec(x, theta) -> A x`, linear in x; a static, hashable callable that must
        not close over traced values (pass parameters in `theta`; see `fixed_point`).
      b: the right-hand side (an array or a pytree of arrays; complex allowed).
      theta: the operator's parameters, any pytree (`()` for none).
      method: "cg" (A Hermitian positive definite) or "gmres" (any invertible A).
      symmetric: A is self-adjoint (A^T = A real, A^H = A complex), so the adjoint solve
        reuses `matvec`; default: True for "cg" (which requires it), False for "gmres".
      tol: relative residual tolerance |A x - b| <= tol |b| (forward and adjoint), never
        tighter than 10 eps.
      maxiter: as in `jax.scipy.sparse.linalg.cg` / `gmres` (for GMRES, restarts).

    Returns:
      x, shaped like b.

    Raises:
      ValueError: an unknown method, or method "cg" with symmetric=False.

    >>> import jax, jax.numpy as jnp
    >>> from rules.library.implicit import linear_solve
    >>> from rules.library._implicit_common import _spd_matvec  # example problems
    >>> a = jnp.array([[1.0, 2.0], [0.0, 1.0]])            # A^T A + I = [[2, 2], [2, 6]]
    >>> linear_solve(_spd_matvec, jnp.array([2.0, 2.0]), a).round(6)
    Array([1., 0.], dtype=float64)
    >>> jax.grad(lambda b: linear_solve(_spd_matvec, b, a)[0])(jnp.array([2.0, 2.0])).round(6)
    Array([ 0.75, -0.25], dtype=float64)

    See also: `jax.scipy.sparse.linalg.cg`, `jax.lax.custom_linear_solve`, `root`.
    """
    _check_static_callable(matvec, "linear_solve", "matvec")
    if method not in ("cg", "gmres"):
        raise ValueError(f"`linear_solve`: method must be 'cg' or 'gmres'; got {method!r}.")
    if method == "cg" and symmetric is False:
        raise ValueError(
            "`linear_solve`: method='cg' needs a self-adjoint positive definite operator, but "
            "symmetric=False was given; use method='gmres' for a nonsymmetric operator."
        )
    return _linear_solve_forward(matvec, b, theta, _tol(tol), method, maxiter)


@linear_solve.rrule
def linear_solve_rrule(matvec, b, theta, *, method="cg", symmetric=None, tol=1e-12, maxiter=None):
    x = linear_solve(matvec, b, theta, method=method, symmetric=symmetric, tol=tol, maxiter=maxiter)
    project_b, project_theta = ProjectTo(b), ProjectTo(theta)
    symmetric = (method == "cg") if symmetric is None else symmetric

    def linear_solve_pullback(x_bar):
        x_bar = _cast_like(_dense(unthunk(x_bar), x), x)
        u, theta_bar = _linear_solve_adjoint(matvec, x, theta, x_bar, _tol(tol), method, symmetric, maxiter)
        return NoTangent(), NoTangent(), project_b(u), project_theta(theta_bar)

    return x, linear_solve_pullback


# ----- argmin -------------------------------------------------------------------------------
@functools.partial(jax.jit, static_argnames=("loss", "method", "max_iter"))
def _minimise(loss: Callable, x0: PyTree, theta: PyTree, tol: Any, method: str, max_iter: int) -> PyTree:
    """Newton (dense Hessian, Cholesky) or gradient descent, both with Armijo backtracking."""
    flat0, unravel = ravel_pytree(x0)
    tol = _floor_tol(tol, flat0)

    def value(x):
        return loss(unravel(x), theta)

    grad = jax.grad(value)

    def direction(x, g):
        if method == "gradient_descent":
            return -g
        chol = jax.lax.linalg.cholesky(jax.jacfwd(grad)(x))  # NaN unless H is positive definite
        half = jax.lax.linalg.triangular_solve(chol, -g[:, None], left_side=True, lower=True)
        d = jax.lax.linalg.triangular_solve(chol, half, left_side=True, lower=True, transpose_a=True)[:, 0]
        return jnp.where(jnp.all(jnp.isfinite(d)), d, -g)  # H not positive definite: -g

    def cond(state):
        k, _, _, done = state
        return (k < max_iter) & ~done

    def body(state):
        k, x, t_prev, _ = state
        g = grad(x)
        d = direction(x, g)
        f0, slope = value(x), jnp.dot(g, d)

        def too_long(s):
            t, fx = s
            return ~(fx <= f0 + 1e-4 * t * slope) & (t > 1e-12)

        def halve(s):
            t, _ = s
            return 0.5 * t, value(x + 0.5 * t * d)

        t0 = jnp.ones_like(t_prev) if method == "newton" else jnp.minimum(2 * t_prev, 1e6)
        t, _ = jax.lax.while_loop(too_long, halve, (t0, value(x + t0 * d)))
        x_new = x + t * d
        return k + 1, x_new, t, _converged(t * d, x_new, tol) | jnp.all(g == 0)

    one = jnp.ones((), flat0.dtype)
    _, x_star, _, _ = jax.lax.while_loop(cond, body, (jnp.zeros((), jnp.int32), flat0, one, jnp.zeros((), bool)))
    return unravel(x_star)


@functools.partial(jax.jit, static_argnames=("loss",))
def _argmin_adjoint(loss, x_star, theta, x_bar, tol):
    """H u = -x_bar by CG (Hessian-vector products), then theta_bar = (d grad_x loss / dtheta)^T u."""

    def grad_x(x, th):
        return jax.grad(loss)(x, th)

    def hvp(v):
        return jax.jvp(lambda x: grad_x(x, theta), (x_star,), (v,))[1]

    u, _ = jax.scipy.sparse.linalg.cg(hvp, _tree_neg(x_bar), tol=_floor_tol(tol, x_star), atol=0.0)
    _, grad_pullback = rrule_via_ad(grad_x, x_star, theta)
    return unthunk(grad_pullback(u)[2])


@primitive(
    examples=[
        (_logistic_ridge, np.zeros(3), (_F43, _Y4, np.array(0.5))),
    ]
)
def argmin(
    loss: Callable, x0: PyTree, theta: PyTree, *, method: str = "newton", tol: float = 1e-12, max_iter: int = 1000
) -> PyTree:
    """x* = argmin_x loss(x, theta), a strict local minimiser; differentiated implicitly.

    Why a rule: the optimiser is a `lax.while_loop` (no reverse mode in JAX; unrolled, it
    would store every iterate). The pullback uses the stationarity condition
    grad_x loss(x*, theta) = 0: it solves H u = -x_bar with CG on Hessian-vector products
    (H, the Hessian in x, is symmetric positive definite at a strict minimiser) and returns
    theta_bar = (d^2 loss / dx dtheta)^T u. This is the bilevel-optimisation gradient.

    Args:
      loss: `loss(x, theta) -> real scalar`, twice differentiable in x; a static, hashable
        callable that must not close over traced values (pass data in `theta`; see
        `fixed_point`).
      x0: the starting point (a pytree of real float arrays); its cotangent is `ZeroTangent()`.
      theta: the parameters, any pytree.
      method: "newton" (default: dense Hessian of the raveled x solved by Cholesky,
        quadratic convergence, for up to a few hundred unknowns; steps along -grad where the
        Hessian is not positive definite) or "gradient_descent" (no Hessian; linear
        convergence, for larger problems). Both use an Armijo backtracking line search.
      tol: stop when the step is at most tol (1 + |x|_inf) (never tighter than 10 eps); also
        CG's relative tolerance in the pullback.
      max_iter: at most this many steps.

    Returns:
      x*, shaped like x0.

    Raises:
      ValueError: an unknown method, or x0 not real.

    >>> import jax, jax.numpy as jnp
    >>> from rules.library.implicit import argmin
    >>> from rules.library._implicit_common import _quadratic  # example problems
    >>> a = jnp.array([[1.0, 0.0], [0.0, 0.0]])      # loss = x.diag(2, 1).x / 2 - b.x
    >>> argmin(_quadratic, jnp.zeros(2), (a, jnp.array([1.0, -2.0]))).round(6)
    Array([ 0.5, -2. ], dtype=float64)
    >>> jax.grad(lambda b: jnp.sum(argmin(_quadratic, jnp.zeros(2), (a, b))))(jnp.array([1.0, -2.0])).round(6)
    Array([0.5, 1. ], dtype=float64)

    See also: `root`, `fixed_point`, `linear_solve`.
    """
    _check_static_callable(loss, "argmin", "loss")
    if method not in ("newton", "gradient_descent"):
        raise ValueError(f"`argmin`: method must be 'newton' or 'gradient_descent'; got {method!r}.")
    _check_real(x0, "argmin")
    return _minimise(loss, x0, theta, _tol(tol), method, max_iter)


@argmin.rrule
def argmin_rrule(loss, x0, theta, *, method="newton", tol=1e-12, max_iter=1000):
    x_star = argmin(loss, x0, theta, method=method, tol=tol, max_iter=max_iter)
    project_theta = ProjectTo(theta)
    x0_bar = _x0_cotangent(x0)

    def argmin_pullback(x_bar):
        x_bar = _cast_like(_dense(unthunk(x_bar), x_star), x_star)
        return NoTangent(), NoTangent(), x0_bar, project_theta(_argmin_adjoint(loss, x_star, theta, x_bar, _tol(tol)))

    return x_star, argmin_pullback
