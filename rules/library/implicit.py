"""Implicit differentiation: solutions of equations, differentiated by the implicit function theorem.

`fixed_point`, `root`, `linear_solve` and `argmin` compute x*(theta) with an iterative solver:
a `lax.while_loop`, which JAX's reverse mode cannot differentiate at all (and which, unrolled,
would keep every iterate for the backward pass). Their pullbacks differentiate the *equation*
instead: with G(x*, theta) = 0, the cotangent of theta is (dG/dtheta)^T u where u solves ONE
linear system (dG/dx)^T u = -x_bar at x*. Memory is O(1) in the number of iterations, and the
gradient is exact at convergence whatever solver found x*.

The callables (`f`, `F`, `matvec`, `loss`) take their parameters through `theta`, a pytree,
or hold them as array leaves (an `equinox.Module`, a `jax.tree_util.Partial`): both are
differentiated. The rest of a callable is static (hashable: module-level functions are best)
and must not close over traced values (see `fixed_point`). Solver cores are jitted with that
static part as a static argument, so repeated eager calls reuse one compilation.

No silent wrong answers: a solver that stops without meeting its tolerance (max_iter reached,
NaN or inf) raises `ConvergenceError` (eagerly; under `jax.jit` a runtime error carrying the
same message), in the forward solve, in the pullback's adjoint solve and in forward mode's
tangent solve, unless `throw=False`.
`full_output=True` returns `(x, SolveInfo(residual, iterations, converged))`.

The adjoint solves are linear solves JAX can transpose (`lax.custom_linear_solve`, their
convergence check inside), so forward mode works too: the lowering transposes the pullback.
Second derivatives (`jax.hessian`, forward over reverse) run the plain solver inside the
rule; its x* is differentiated implicitly as well (a `jax.custom_jvp` whose tangent solves
(dG/dx) x_dot = -(dG/dtheta) theta_dot at x*), not through the loop, whose tangent stops when
the iterates do: so they do not depend on where the solver started, even at x0 = x*.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from .._boundary import conj_tree
from .._errors import format_message
from .._primitive import primitive
from .._projection import ProjectTo
from .._thunks import unthunk
from .._via_ad import _dense, rrule_via_ad
from .._zeros import AbstractZero, NoTangent, ZeroTangent
from ._implicit_common import _A3, _F43, _V3, _W3, _Y4, _Z2, _ZA2
from ._implicit_common import ConvergenceError as ConvergenceError
from ._implicit_common import SolveInfo as SolveInfo
from ._implicit_common import (
    _adjoint_solve,
    _bind,
    _cast_like,
    _check_converged,
    _check_real,
    _contraction,
    _converged,
    _coupled,
    _deq_layer,
    _floor_tol,
    _forward_solve,
    _gmres_loop,
    _implicit_solution,
    _info_without_gradient,
    _is_traced,
    _krylov_loop,
    _logistic_ridge,
    _real_pairs,
    _relative_step,
    _Report,
    _scaled_contraction,
    _spd_matvec,
    _tol,
    _tree_add,
    _tree_neg,
    _tree_sub,
    _x0_cotangent,
)

__all__ = ["fixed_point", "root", "linear_solve", "argmin", "SolveInfo", "ConvergenceError"]

PyTree = Any
_FIX = "raise max_iter, loosen tol"


def _x_cotangent(y_bar: Any, full_output: bool) -> Any:
    """The cotangent of x from the output's: with full_output, y_bar is (x_bar, info_bar)."""
    y_bar = unthunk(y_bar)
    if full_output and not isinstance(y_bar, AbstractZero):
        y_bar = unthunk(y_bar[0])
    return y_bar


def _adjoint_mode(throw: bool, report: _Report, *inputs: Any) -> tuple[bool, _Report | None]:
    """(eager, the report an adjoint solve checks itself against): with concrete inputs the
    pullback checks the returned SolveInfo (a `ConvergenceError`); traced, the solve does."""
    eager = not _is_traced(inputs)
    return eager, (report if throw and not eager else None)


def _finish(x: PyTree, info: SolveInfo, tol: Any, report: _Report, throw: bool, full_output: bool) -> Any:
    """What a solver returns: x, checked unless throw=False, with its SolveInfo if asked."""
    if throw:
        x = _check_converged(x, info, tol, x, report)
    return (x, _info_without_gradient(info)) if full_output else x


# ----- fixed_point --------------------------------------------------------------------------
def _iterate_impl(
    f: Callable, x0: PyTree, theta: PyTree, tol: Any, max_iter: int, floor: float = 1.0
) -> tuple[PyTree, SolveInfo]:
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
        k, _, residual, converged = state
        return (k < max_iter) & ~converged & ~jnp.isnan(residual)

    def body(state):
        k, x, _, _ = state
        x_new = _cast_like(f(x, theta), x)
        step = _tree_sub(x_new, x)
        return k + 1, x_new, _relative_step(step, x_new, floor), _converged(step, x_new, tol, floor)

    init = (jnp.zeros((), jnp.int32), x, jnp.full((), jnp.inf, jnp.result_type(float)), jnp.zeros((), bool))
    k, x_star, residual, converged = jax.lax.while_loop(cond, body, init)
    return x_star, SolveInfo(residual, k, converged)


_iterate = jax.jit(_iterate_impl, static_argnames=("f", "max_iter"))


def _richardson(op: Callable, b: PyTree, tol: Any, *, max_iter: int) -> tuple[PyTree, SolveInfo]:
    """op(v) = b for op = I - M with M contracting: the iteration v <- v + b - op(v) = b + M v."""
    return _iterate_impl(lambda v, b: _tree_add(v, _tree_sub(b, op(v))), b, b, tol, max_iter, floor=0.0)


def _solve_identity_minus(op, rhs, tol, max_iter, adjoint, eager, report):
    """op(u) = rhs, op = I - (df/dx) or its transpose, by Richardson iteration or by GMRES
    (on real pairs: op is only R-linear for complex x); eager and report as `_adjoint_solve`'s."""
    if adjoint == "gmres":
        op_real, rhs_real, back = _real_pairs(op, rhs)
        loop = functools.partial(_gmres_loop, maxiter=max_iter)
        u_real, info = _adjoint_solve(loop, op_real, rhs_real, tol, False, eager, report)
        return back(u_real), info
    return _adjoint_solve(functools.partial(_richardson, max_iter=max_iter), op, rhs, tol, False, eager, report)


@functools.partial(jax.jit, static_argnames=("f", "max_iter", "adjoint", "eager", "report"))
def _fixed_point_adjoint(f, x_star, theta, x_bar, tol, max_iter, adjoint, eager, report):
    """u = x_bar + (df/dx)^T u at x*, then theta_bar = (df/dtheta)^T u (ChainRules' convention).

    u solves (I - (df/dx)^T) u = x_bar: by Richardson iteration, which is the fixed-point
    iteration u <- x_bar + (df/dx)^T u, or by GMRES (see `_adjoint_solve` for eager and report).
    """
    _, f_pullback = rrule_via_ad(f, x_star, theta)

    def op(u):
        return _tree_sub(u, _cast_like(_dense(f_pullback(u)[1], x_star), x_star))

    u, info = _solve_identity_minus(op, x_bar, _floor_tol(tol, x_star), max_iter, adjoint, eager, report)
    return unthunk(f_pullback(u)[2]), info


def _fixed_point_solution(f, x0, params, tol, max_iter, adjoint, tangent_report):
    """x* and its SolveInfo, x* differentiated in forward mode by (I - df/dx) x_dot = (df/dtheta) theta_dot;
    `tangent_report` checks the tangent solve (None: no check)."""

    def solver(x0, params, tol):
        return _iterate(f, x0, params, tol, max_iter)

    def G(x, params):
        return _tree_sub(x, _cast_like(f(x, params), x))

    def tangent_solve(op, rhs, tol):
        return _solve_identity_minus(op, rhs, _floor_tol(tol, rhs), max_iter, adjoint, False, tangent_report)[0]

    return _implicit_solution(solver, G, tangent_solve, x0, params, tol)


def _fixed_point_reports(max_iter: int, adjoint: str) -> tuple[_Report, _Report, _Report]:
    """The reports of the forward solve, the pullback's adjoint solve and forward mode's tangent solve."""
    limit = f"max_iter={max_iter}"
    forward = _Report("fixed_point", "|x_{k+1} - x_k|_inf / (1 + |x_{k+1}|_inf)",
                      f"{_FIX}, or check that f contracts near x* (|df/dx| < 1)", limit)
    if adjoint == "gmres":
        gmres = "(GMRES; iterations are restarts)"
        measures = (f"|u - (df/dx)^T u - x_bar|_2 / |x_bar|_2 {gmres}", f"|v - (df/dx) v - b|_2 / |b|_2 {gmres}")
        fix = _FIX
    else:
        measures = ("|u_{k+1} - u_k|_inf / |u_{k+1}|_inf for u = x_bar + (df/dx)^T u",
                    "|v_{k+1} - v_k|_inf / |v_{k+1}|_inf for v = (df/dtheta) theta_dot + (df/dx) v")
        fix = f"{_FIX}, use adjoint='gmres' (for a slowly contracting f)"
    return (forward, _Report("fixed_point", measures[0], fix, limit, adjoint=True),
            _Report("fixed_point", measures[1], fix, limit, tangent=True))


@primitive(
    examples=[
        (_deq_layer, np.zeros(3), (_W3, _V3)),
        (_contraction, np.zeros(3, np.float32), _V3.astype(np.float32)),
        (_contraction, np.zeros(2, np.complex128), _Z2),
        (jax.tree_util.Partial(_scaled_contraction, np.array(0.8)), np.zeros(3), _V3),
    ]
)
def fixed_point(
    f: Callable,
    x0: PyTree,
    theta: PyTree,
    *,
    tol: float = 1e-12,
    max_iter: int = 1000,
    adjoint: str = "iterate",
    throw: bool = True,
    full_output: bool = False,
) -> PyTree:
    """The fixed point x* = f(x*, theta), by iteration; differentiated implicitly.

    Why a rule: the iteration is a `lax.while_loop`, which JAX's reverse mode cannot
    differentiate at all (an unrolled loop could be, but stores every iterate). The pullback
    solves the adjoint equation u = x_bar + (df/dx)^T u at x* (by the same iteration, or
    GMRES) and returns theta_bar = (df/dtheta)^T u: one linear solve, memory independent of
    the number of iterations.

    Args:
      f: `f(x, theta) -> x`, a contraction in x near x*: a function, or a callable pytree
        (an `equinox.Module`, a `jax.tree_util.Partial`) whose array leaves are
        differentiated like theta (f's cotangent is then a pytree of f's type; NoTangent()
        for a plain function). What is not an array leaf is static: hashable, and a key of
        the jit caches (a module-level function is best). f must not close over traced
        values: a closure is static, so JAX could not differentiate what it captures (it
        would meet the bare while_loop or leak a tracer), and a closure built anew on every
        trace is a new cache entry every time. Pass such values in `theta` or hold them in a
        pytree f; a closure over a tracer raises `StaticArgumentError`. Arrays a closure
        captures concretely are constants.
      x0: the starting iterate (a pytree of arrays). x* does not depend on it: its
        cotangent is `ZeroTangent()`.
      theta: the parameters, any pytree (int leaves are not differentiated).
      tol: stop when |x_{k+1} - x_k|_inf <= tol (1 + |x_{k+1}|_inf), never tighter than 10 eps
        of the dtype; also the tolerance of the adjoint solve (relative). The default is tight
        because the implicit gradient is exact only at x*: its error follows x*'s.
      max_iter: at most this many iterations (forward, and adjoint).
      adjoint: "iterate" (u <- x_bar + (df/dx)^T u, which converges at the forward
        iteration's rate) or "gmres" (GMRES on I - (df/dx)^T, for slowly contracting maps).
      throw: raise `ConvergenceError` when the forward, the adjoint or the tangent solve
        (forward mode, e.g. under `jax.hessian`) stops without meeting tol (max_iter reached,
        or NaN/inf). Under `jax.jit` and `jax.vmap` the check runs on the device and raises
        when the result is computed (if any batch element failed), as a `JaxRuntimeError`
        carrying the same message. False: no check; the last iterate is returned as it is.
      full_output: also return a `SolveInfo`; its residual is
        |x_{k+1} - x_k|_inf / (1 + |x_{k+1}|_inf). Only x is differentiated.

    Returns:
      x*, with f's output structure and dtypes; `(x*, SolveInfo)` with full_output=True.

    Raises:
      ConvergenceError: the iteration did not converge (with throw=True).
      ValueError: f's output is not shaped like x0, or an unknown adjoint.
      StaticArgumentError: f closes over a traced value, or holds an unhashable non-array.

    >>> import jax, jax.numpy as jnp
    >>> from rules.library.implicit import fixed_point
    >>> from rules.library._implicit_common import _contraction  # example problems
    >>> round(float(fixed_point(_contraction, 0.0, 1.0)), 6)   # x = tanh(x) / 2 + 1
    1.44761
    >>> g = jax.grad(lambda t: fixed_point(_contraction, 0.0, t))(1.0)   # 1 / (1 - sech(x*)^2 / 2)
    >>> round(float(g), 6)
    1.110237
    >>> def slow(x, a):
    ...     return 0.999 * x + a                  # x* = 1000 a, reached after ~30000 steps
    >>> x, info = fixed_point(slow, 0.0, 1.0, max_iter=10, throw=False, full_output=True)
    >>> round(float(x), 3), int(info.iterations), bool(info.converged)
    (9.955, 10, False)
    >>> fixed_point(slow, 0.0, 1.0, max_iter=10)
    Traceback (most recent call last):
      ...
    rules.library._implicit_common.ConvergenceError: `fixed_point`: its solver stopped before meeting its tolerance, ...

    See also: `root`, `argmin`, `linear_solve`, `jax.lax.custom_root`, `optimistix.fixed_point`.
    """
    if adjoint not in ("iterate", "gmres"):
        raise ValueError(f"`fixed_point`: adjoint must be 'iterate' or 'gmres'; got {adjoint!r}.")
    bound, arrays = _bind(f, "fixed_point", "f")
    report, _, tangent_report = _fixed_point_reports(max_iter, adjoint)
    x, info = _fixed_point_solution(bound, x0, (arrays, theta), _tol(tol), max_iter, adjoint,
                                    tangent_report if throw else None)
    return _finish(x, info, tol, report, throw, full_output)


@fixed_point.rrule
def fixed_point_rrule(f, x0, theta, *, tol=1e-12, max_iter=1000, adjoint="iterate", throw=True, full_output=False):
    x_star, info = fixed_point(f, x0, theta, tol=tol, max_iter=max_iter, adjoint=adjoint, throw=throw, full_output=True)
    bound, arrays = _bind(f, "fixed_point", "f")
    project_theta = ProjectTo(theta)
    x0_bar = _x0_cotangent(x0)
    _, report, _ = _fixed_point_reports(max_iter, adjoint)

    def fixed_point_pullback(y_bar):
        x_bar = _x_cotangent(y_bar, full_output)
        if isinstance(x_bar, AbstractZero):
            return NoTangent(), bound.cotangent(ZeroTangent(), arrays), x0_bar, project_theta(ZeroTangent())
        x_bar = _cast_like(_dense(x_bar, x_star), x_star)
        params = (arrays, theta)
        eager, solve_report = _adjoint_mode(throw, report, x_bar, x_star, params)
        params_bar, adjoint_info = _fixed_point_adjoint(
            bound, x_star, params, x_bar, _tol(tol), max_iter, adjoint, eager, solve_report
        )
        if throw and eager:
            params_bar = _check_converged(params_bar, adjoint_info, tol, x_star, report)
        arrays_bar, theta_bar = params_bar
        return NoTangent(), bound.cotangent(arrays_bar, arrays), x0_bar, project_theta(theta_bar)

    return ((x_star, info) if full_output else x_star), fixed_point_pullback


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
def _newton(F: Callable, x0: jax.Array, theta: PyTree, tol: Any, max_iter: int) -> tuple[jax.Array, SolveInfo]:
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
        k, _, residual, converged = state
        return (k < max_iter) & ~converged & ~jnp.isnan(residual)

    def body(state):
        k, x, _, _ = state
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
        exact = r0 == 0
        residual = jnp.where(exact, 0.0, _relative_step(t * step, x_new))
        return k + 1, x_new, residual, _converged(t * step, x_new, tol) | exact

    init = (jnp.zeros((), jnp.int32), x0, jnp.full((), jnp.inf, jnp.result_type(float)), jnp.zeros((), bool))
    k, x_star, residual, converged = jax.lax.while_loop(cond, body, init)
    return x_star, SolveInfo(residual, k, converged)


def _root_solution(F, x0, params, tol, max_iter):
    """x* and its SolveInfo, x* differentiated in forward mode by (dF/dx) x_dot = -(dF/dtheta) theta_dot
    (a dense solve, as Newton's steps)."""

    def solver(x0, params, tol):
        return _newton(F, x0, params, tol, max_iter)

    def G(x, params):
        return F(x, params).astype(x.dtype)

    def tangent_solve(op, rhs, tol):
        return jnp.linalg.solve(jax.jacfwd(op)(rhs), rhs)  # op is linear: its Jacobian anywhere

    return _implicit_solution(solver, G, tangent_solve, x0, params, tol)


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
def root(
    F: Callable,
    x0: jax.Array,
    theta: PyTree,
    *,
    tol: float = 1e-12,
    max_iter: int = 50,
    throw: bool = True,
    full_output: bool = False,
) -> jax.Array:
    """A root x* of F(x, theta) = 0, by Newton's method; differentiated implicitly.

    Why a rule: Newton's loop is a `lax.while_loop` (no reverse mode in JAX), and the
    derivative of its iterates is not the root's until it has converged. The pullback solves
    (dF/dx)^T u = -x_bar once, at x*, and returns theta_bar = (dF/dtheta)^T u.

    The forward pass is damped Newton with a dense Jacobian from `jax.jacrev` (which also
    works when F calls primitives that have only reverse rules): meant for small systems
    (up to a few hundred unknowns) started in the basin of the wanted root.

    Args:
      F: `F(x, theta) -> residual`, as many equations as unknowns; a function or a callable
        pytree whose array leaves are differentiated like theta; it must not close over
        traced values (pass parameters in `theta`; see `fixed_point`).
      x0: the starting point, a 1-D real float array; its cotangent is `ZeroTangent()`.
      theta: the parameters, any pytree.
      tol: stop when the Newton step is at most tol (1 + |x|_inf), never tighter than 10 eps.
      max_iter: at most this many Newton steps.
      throw: raise `ConvergenceError` when Newton stops without meeting tol (max_iter
        reached, or NaN/inf, e.g. a singular Jacobian); under `jax.jit` a runtime error with
        the same message (see `fixed_point`). False: no check.
      full_output: also return a `SolveInfo`; its residual is the last step
        |t dx|_inf / (1 + |x|_inf) (0 where F(x) = 0 exactly).

    Returns:
      x*, with F(x*, theta) ~ 0, shaped like x0; `(x*, SolveInfo)` with full_output=True.

    Raises:
      ConvergenceError: Newton's method did not converge (with throw=True).
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
    >>> x, info = root(_cubic, jnp.zeros(1), jnp.array([2.0]), full_output=True)
    >>> bool(info.converged), int(info.iterations) < 10
    (True, True)

    See also: `fixed_point`, `argmin`, `jax.lax.custom_root`, `optimistix.root_find`.
    """
    bound, arrays = _bind(F, "root", "F")
    x0 = _check_vector(x0, "root")
    x, info = _root_solution(bound, x0, (arrays, theta), _tol(tol), max_iter)
    report = _Report("root", "|t dx|_inf / (1 + |x|_inf), the last damped Newton step",
                     f"{_FIX}, or start x0 nearer the root (Newton converges from its basin)", f"max_iter={max_iter}")
    return _finish(x, info, tol, report, throw, full_output)


@root.rrule
def root_rrule(F, x0, theta, *, tol=1e-12, max_iter=50, throw=True, full_output=False):
    x_star, info = root(F, x0, theta, tol=tol, max_iter=max_iter, throw=throw, full_output=True)
    bound, arrays = _bind(F, "root", "F")
    project_theta = ProjectTo(theta)
    x0_bar = _x0_cotangent(x0)

    def root_pullback(y_bar):
        x_bar = _x_cotangent(y_bar, full_output)
        if isinstance(x_bar, AbstractZero):
            return NoTangent(), bound.cotangent(ZeroTangent(), arrays), x0_bar, project_theta(ZeroTangent())
        x_bar = _cast_like(_dense(x_bar, x_star), x_star)
        arrays_bar, theta_bar = _root_adjoint(bound, x_star, (arrays, theta), x_bar)
        return NoTangent(), bound.cotangent(arrays_bar, arrays), x0_bar, project_theta(theta_bar)

    return ((x_star, info) if full_output else x_star), root_pullback


# ----- linear_solve -------------------------------------------------------------------------
@functools.partial(jax.jit, static_argnames=("matvec", "method", "maxiter", "report"))
def _linear_solve_forward(matvec, b, theta, tol, method, maxiter, report):
    """x with A x = b, differentiated as a linear solve; `report` checks the tangent solve's convergence."""
    out = jax.eval_shape(matvec, b, theta)
    b = _cast_like(b, out)
    loop = _krylov_loop(method, b, maxiter)
    matvec_b = lambda v: _cast_like(matvec(v, theta), b)  # noqa: E731
    return _forward_solve(loop, matvec_b, b, _floor_tol(tol, b), method == "cg", report)


@functools.partial(jax.jit, static_argnames=("matvec", "method", "symmetric", "maxiter", "eager", "report"))
def _linear_solve_adjoint(matvec, x, theta, x_bar, tol, method, symmetric, maxiter, eager, report):
    """A^H u = x_bar (ChainRules' convention), then theta_bar = (d(A x)/dtheta)^T (-u)."""
    if symmetric:
        adjoint_op = lambda v: _cast_like(matvec(v, theta), x)  # noqa: E731
    else:
        transpose = jax.linear_transpose(lambda v: _cast_like(matvec(v, theta), x), x)
        adjoint_op = lambda v: conj_tree(transpose(conj_tree(v))[0])  # noqa: E731
    loop = _krylov_loop(method, x_bar, maxiter)
    u, info = _adjoint_solve(loop, adjoint_op, x_bar, _floor_tol(tol, x_bar), method == "cg", eager, report)
    _, matvec_pullback = rrule_via_ad(matvec, x, theta)
    return u, unthunk(matvec_pullback(_tree_neg(u))[2]), info


def _linear_solve_report(method: str, maxiter: int | None, adjoint: bool = False, tangent: bool = False) -> _Report:
    system = "A^H u = x_bar" if adjoint else "A x_dot = b_dot - A_dot x" if tangent else "A x = b"
    fix = "raise maxiter, loosen tol, " + (
        "check that A is Hermitian positive definite (else use method='gmres')" if method == "cg"
        else "check that A is invertible"
    )
    limit = f"maxiter={maxiter}" if maxiter is not None else "the default maxiter, 10 n"
    if method == "gmres":
        limit += "; GMRES counts restarts"
    measure = f"|r|_2 / |rhs|_2 for {system} ({method})"
    return _Report("linear_solve", measure, fix, limit, adjoint=adjoint, tangent=tangent)


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
    throw: bool = True,
    full_output: bool = False,
) -> PyTree:
    """x = A(theta)^-1 b for a matrix-free operator `matvec(x, theta) = A(theta) x`, by CG or GMRES.

    Why a rule: differentiating the Krylov iterations themselves would store every iterate
    and differentiate the solver's rounding; the pullback solves the adjoint system
    A^H u = x_bar once with the transposed operator (`matvec` itself when symmetric, else
    `jax.linear_transpose` of it) and returns b_bar = u, theta_bar = (d(A x)/dtheta)^T (-u).
    JAX's own `cg`/`gmres` differentiate implicitly too (for what the operator closes over);
    here the operator's parameters are an explicit argument with a ChainRules rule, which
    `rrule_via_ad` compositions and the testers see, and the gradients agree with JAX's.
    The solvers are JAX's algorithms (CG; GMRES restarted every min(20, n) steps), written
    here to report their convergence, which JAX's do not.

    Args:
      matvec: `matvec(x, theta) -> A x`, linear in x; a function or a callable pytree whose
        array leaves are differentiated like theta; it must not close over traced values
        (pass parameters in `theta`; see `fixed_point`).
      b: the right-hand side (an array or a pytree of arrays; complex allowed).
      theta: the operator's parameters, any pytree (`()` for none).
      method: "cg" (A Hermitian positive definite) or "gmres" (any invertible A).
      symmetric: A is self-adjoint (A^T = A real, A^H = A complex), so the adjoint solve
        reuses `matvec`; default: True for "cg" (which requires it), False for "gmres".
      tol: relative residual tolerance |A x - b|_2 <= tol |b|_2 (forward and adjoint), never
        tighter than 10 eps. (CG tests its recursively updated residual, GMRES the true one.)
      maxiter: as in `jax.scipy.sparse.linalg.cg` / `gmres` (for GMRES, restarts); default 10 n.
      throw: raise `ConvergenceError` when the forward, the adjoint or the tangent solve
        (forward mode, e.g. under `jax.hessian`) stops without meeting tol (maxiter reached,
        or NaN/inf); under `jax.jit` a runtime error with the same message (see `fixed_point`).
        False: no check.
      full_output: also return a `SolveInfo`; its residual is |r|_2 / |b|_2 and its
        iterations are CG steps or GMRES restarts.

    Returns:
      x, shaped like b; `(x, SolveInfo)` with full_output=True.

    Raises:
      ConvergenceError: the solve did not converge (with throw=True).
      ValueError: an unknown method, or method "cg" with symmetric=False.

    >>> import jax, jax.numpy as jnp
    >>> from rules.library.implicit import linear_solve
    >>> from rules.library._implicit_common import _spd_matvec  # example problems
    >>> a = jnp.array([[1.0, 2.0], [0.0, 1.0]])            # A^T A + I = [[2, 2], [2, 6]]
    >>> linear_solve(_spd_matvec, jnp.array([2.0, 2.0]), a).round(6)
    Array([1., 0.], dtype=float64)
    >>> jax.grad(lambda b: linear_solve(_spd_matvec, b, a)[0])(jnp.array([2.0, 2.0])).round(6)
    Array([ 0.75, -0.25], dtype=float64)
    >>> x, info = linear_solve(_spd_matvec, jnp.array([2.0, 2.0]), a, full_output=True)
    >>> int(info.iterations), bool(info.converged)    # CG: at most n steps in exact arithmetic
    (2, True)

    See also: `jax.scipy.sparse.linalg.cg`, `jax.lax.custom_linear_solve`, `root`, `lineax.linear_solve`.
    """
    if method not in ("cg", "gmres"):
        raise ValueError(f"`linear_solve`: method must be 'cg' or 'gmres'; got {method!r}.")
    if method == "cg" and symmetric is False:
        raise ValueError(
            "`linear_solve`: method='cg' needs a self-adjoint positive definite operator, but "
            "symmetric=False was given; use method='gmres' for a nonsymmetric operator."
        )
    bound, arrays = _bind(matvec, "linear_solve", "matvec")
    tangent_report = _linear_solve_report(method, maxiter, tangent=True) if throw else None
    x, info = _linear_solve_forward(bound, b, (arrays, theta), _tol(tol), method, maxiter, tangent_report)
    return _finish(x, info, tol, _linear_solve_report(method, maxiter), throw, full_output)


@linear_solve.rrule
def linear_solve_rrule(
    matvec, b, theta, *, method="cg", symmetric=None, tol=1e-12, maxiter=None, throw=True, full_output=False
):
    x, info = linear_solve(matvec, b, theta, method=method, symmetric=symmetric, tol=tol, maxiter=maxiter,
                           throw=throw, full_output=True)
    bound, arrays = _bind(matvec, "linear_solve", "matvec")
    project_b, project_theta = ProjectTo(b), ProjectTo(theta)
    symmetric = (method == "cg") if symmetric is None else symmetric
    report = _linear_solve_report(method, maxiter, adjoint=True)

    def linear_solve_pullback(y_bar):
        x_bar = _x_cotangent(y_bar, full_output)
        if isinstance(x_bar, AbstractZero):
            zero = ZeroTangent()
            return NoTangent(), bound.cotangent(zero, arrays), project_b(zero), project_theta(zero)
        x_bar = _cast_like(_dense(x_bar, x), x)
        params = (arrays, theta)
        eager, solve_report = _adjoint_mode(throw, report, x_bar, x, params)
        u, params_bar, adjoint_info = _linear_solve_adjoint(
            bound, x, params, x_bar, _tol(tol), method, symmetric, maxiter, eager, solve_report
        )
        if throw and eager:
            u, params_bar = _check_converged((u, params_bar), adjoint_info, tol, x, report)
        arrays_bar, theta_bar = params_bar
        return NoTangent(), bound.cotangent(arrays_bar, arrays), project_b(u), project_theta(theta_bar)

    return ((x, info) if full_output else x), linear_solve_pullback


# ----- argmin -------------------------------------------------------------------------------
@functools.partial(jax.jit, static_argnames=("loss", "method", "max_iter"))
def _minimise(
    loss: Callable, x0: PyTree, theta: PyTree, tol: Any, method: str, max_iter: int
) -> tuple[PyTree, SolveInfo]:
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
        k, _, _, residual, converged = state
        return (k < max_iter) & ~converged & ~jnp.isnan(residual)

    def body(state):
        k, x, t_prev, _, _ = state
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
        stationary = jnp.all(g == 0)
        residual = jnp.where(stationary, 0.0, _relative_step(t * d, x_new))
        return k + 1, x_new, t, residual, _converged(t * d, x_new, tol) | stationary

    one = jnp.ones((), flat0.dtype)
    inf = jnp.full((), jnp.inf, jnp.result_type(float))
    init = (jnp.zeros((), jnp.int32), flat0, one, inf, jnp.zeros((), bool))
    k, x_star, _, residual, converged = jax.lax.while_loop(cond, body, init)
    return unravel(x_star), SolveInfo(residual, k, converged)


@functools.partial(jax.jit, static_argnames=("loss", "eager", "report"))
def _argmin_adjoint(loss, x_star, theta, x_bar, tol, eager, report):
    """H u = -x_bar by CG (Hessian-vector products), then theta_bar = (d grad_x loss / dtheta)^T u."""

    def grad_x(x, th):
        return jax.grad(loss)(x, th)

    def hvp(v):
        return jax.jvp(lambda x: grad_x(x, theta), (x_star,), (v,))[1]

    loop = _krylov_loop("cg", x_bar, None)
    u, info = _adjoint_solve(loop, hvp, _tree_neg(x_bar), _floor_tol(tol, x_star), True, eager, report)
    _, grad_pullback = rrule_via_ad(grad_x, x_star, theta)
    return unthunk(grad_pullback(u)[2]), info


def _argmin_report(adjoint: bool) -> _Report:
    """The report of the pullback's adjoint solve (adjoint) or of forward mode's tangent solve."""
    measure = "|H u + x_bar|_2 / |x_bar|_2" if adjoint else "|H v - b|_2 / |b|_2"
    return _Report("argmin", f"{measure} (CG on Hessian-vector products)",
                   "loosen tol, or check that x* is a strict local minimiser (H positive definite)",
                   "at most 10 n CG steps", adjoint=adjoint, tangent=not adjoint)


def _argmin_solution(loss, x0, params, tol, method, max_iter, throw):
    """x* and its SolveInfo, x* differentiated in forward mode by H x_dot = -(d grad_x loss / dtheta) theta_dot (CG)."""

    def solver(x0, params, tol):
        return _minimise(loss, x0, params, tol, method, max_iter)

    def G(x, params):
        return jax.grad(loss)(x, params)

    def tangent_solve(op, rhs, tol):
        loop = _krylov_loop("cg", rhs, None)
        report = _argmin_report(adjoint=False) if throw else None
        return _adjoint_solve(loop, op, rhs, _floor_tol(tol, rhs), True, False, report)[0]

    return _implicit_solution(solver, G, tangent_solve, x0, params, tol)


@primitive(
    examples=[
        (_logistic_ridge, np.zeros(3), (_F43, _Y4, np.array(0.5))),
    ]
)
def argmin(
    loss: Callable,
    x0: PyTree,
    theta: PyTree,
    *,
    method: str = "newton",
    tol: float = 1e-12,
    max_iter: int = 1000,
    throw: bool = True,
    full_output: bool = False,
) -> PyTree:
    """x* = argmin_x loss(x, theta), a strict local minimiser; differentiated implicitly.

    Why a rule: the optimiser is a `lax.while_loop` (no reverse mode in JAX; unrolled, it
    would store every iterate). The pullback uses the stationarity condition
    grad_x loss(x*, theta) = 0: it solves H u = -x_bar with CG on Hessian-vector products
    (H, the Hessian in x, is symmetric positive definite at a strict minimiser) and returns
    theta_bar = (d^2 loss / dx dtheta)^T u. This is the bilevel-optimisation gradient.

    Args:
      loss: `loss(x, theta) -> real scalar`, twice differentiable in x; a function or a
        callable pytree whose array leaves are differentiated like theta; it must not close
        over traced values (pass data in `theta`; see `fixed_point`).
      x0: the starting point (a pytree of real float arrays); its cotangent is `ZeroTangent()`.
      theta: the parameters, any pytree.
      method: "newton" (default: dense Hessian of the raveled x solved by Cholesky,
        quadratic convergence, for up to a few hundred unknowns; steps along -grad where the
        Hessian is not positive definite) or "gradient_descent" (no Hessian; linear
        convergence, for larger problems). Both use an Armijo backtracking line search.
      tol: stop when the step is at most tol (1 + |x|_inf) (never tighter than 10 eps); also
        CG's relative tolerance in the pullback (at most 10 n CG steps).
      max_iter: at most this many steps.
      throw: raise `ConvergenceError` when the optimiser or the pullback's (or forward
        mode's) CG stops without meeting tol (max_iter reached, or NaN/inf); under `jax.jit`
        a runtime error with the same message (see `fixed_point`). False: no check.
      full_output: also return a `SolveInfo`; its residual is the last step
        |t d|_inf / (1 + |x|_inf) (0 where the gradient is exactly 0).

    Returns:
      x*, shaped like x0; `(x*, SolveInfo)` with full_output=True.

    Raises:
      ConvergenceError: the optimiser did not converge (with throw=True).
      ValueError: an unknown method, or x0 not real.

    >>> import jax, jax.numpy as jnp
    >>> from rules.library.implicit import argmin
    >>> from rules.library._implicit_common import _quadratic  # example problems
    >>> a = jnp.array([[1.0, 0.0], [0.0, 0.0]])      # loss = x.diag(2, 1).x / 2 - b.x
    >>> argmin(_quadratic, jnp.zeros(2), (a, jnp.array([1.0, -2.0]))).round(6)
    Array([ 0.5, -2. ], dtype=float64)
    >>> jax.grad(lambda b: jnp.sum(argmin(_quadratic, jnp.zeros(2), (a, b))))(jnp.array([1.0, -2.0])).round(6)
    Array([0.5, 1. ], dtype=float64)
    >>> x, info = argmin(_quadratic, jnp.zeros(2), (a, jnp.array([1.0, -2.0])), full_output=True)
    >>> bool(info.converged), int(info.iterations)      # Newton on a quadratic: one step, one check
    (True, 2)

    See also: `root`, `fixed_point`, `linear_solve`, `optimistix.minimise`.
    """
    if method not in ("newton", "gradient_descent"):
        raise ValueError(f"`argmin`: method must be 'newton' or 'gradient_descent'; got {method!r}.")
    _check_real(x0, "argmin")
    bound, arrays = _bind(loss, "argmin", "loss")
    x, info = _argmin_solution(bound, x0, (arrays, theta), _tol(tol), method, max_iter, throw)
    report = _Report("argmin", f"|t d|_inf / (1 + |x|_inf), the last {method} step",
                     f"{_FIX}" + (", or use method='newton'" if method == "gradient_descent" else ""),
                     f"max_iter={max_iter}")
    return _finish(x, info, tol, report, throw, full_output)


@argmin.rrule
def argmin_rrule(loss, x0, theta, *, method="newton", tol=1e-12, max_iter=1000, throw=True, full_output=False):
    x_star, info = argmin(loss, x0, theta, method=method, tol=tol, max_iter=max_iter, throw=throw, full_output=True)
    bound, arrays = _bind(loss, "argmin", "loss")
    project_theta = ProjectTo(theta)
    x0_bar = _x0_cotangent(x0)
    report = _argmin_report(adjoint=True)

    def argmin_pullback(y_bar):
        x_bar = _x_cotangent(y_bar, full_output)
        if isinstance(x_bar, AbstractZero):
            return NoTangent(), bound.cotangent(ZeroTangent(), arrays), x0_bar, project_theta(ZeroTangent())
        x_bar = _cast_like(_dense(x_bar, x_star), x_star)
        params = (arrays, theta)
        eager, solve_report = _adjoint_mode(throw, report, x_bar, x_star, params)
        params_bar, adjoint_info = _argmin_adjoint(bound, x_star, params, x_bar, _tol(tol), eager, solve_report)
        if throw and eager:
            params_bar = _check_converged(params_bar, adjoint_info, tol, x_star, report)
        arrays_bar, theta_bar = params_bar
        return NoTangent(), bound.cotangent(arrays_bar, arrays), x0_bar, project_theta(theta_bar)

    return ((x_star, info) if full_output else x_star), argmin_pullback
