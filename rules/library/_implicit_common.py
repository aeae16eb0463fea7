"""Shared machinery of `rules.library.implicit`: pytree arithmetic, convergence tests and
reports (`SolveInfo`, `ConvergenceError` and the check that raises it, eagerly or at run time
under a trace), callable pytrees split into a static part and arrays, argument checks, CG and
GMRES that report convergence, and the module-level example problems that
`python -m rules check` differentiates (static callables must be hashable and importable).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from .._errors import StaticArgumentError, format_message
from .._projection import ArrayTypes, ProjectTo, is_differentiable_leaf
from .._zeros import AbstractZero, NoTangent, ZeroTangent

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
    purely relative for floor 0 (adjoint solves, whose scale is the seed's); never for an
    infinite x (an inf step would pass a test relative to it)."""
    scale = _tree_max_abs(x)
    return (_tree_max_abs(step) <= tol * (floor + scale)) & jnp.isfinite(scale)


def _relative_step(step: PyTree, x: PyTree, floor: float = 1.0) -> jax.Array:
    """|step|_inf / (floor + |x|_inf): the quantity `_converged` compares with tol (NaN stays NaN)."""
    size, scale = _tree_max_abs(step), floor + _tree_max_abs(x)
    return jnp.where(size == 0, jnp.zeros_like(size), size / scale)


def _ratio(num: jax.Array, den: jax.Array) -> jax.Array:
    """num / den, and 0 where both are 0 (a zero right-hand side is solved exactly)."""
    return jnp.where(num == 0, jnp.zeros_like(num), num / jnp.where(den == 0, jnp.ones_like(den), den))


# ----- convergence: reports, and the check behind throw=True ---------------------------------
class SolveInfo(NamedTuple):
    """How an implicit solver's iteration ended (what `full_output=True` returns beside x).

    Attributes:
      residual: the measure the solver compared with its tolerance when it stopped (each
        solver's docstring says which); NaN if the iterates stopped being finite.
      iterations: the number of iterations taken (int32; for GMRES, restarts).
      converged: whether the residual met the tolerance (bool).

    Under `jax.vmap` each field has the batch's leading axes. No field carries a gradient.

    See also: `rules.library.implicit.fixed_point` (an example), `ConvergenceError`.
    """

    residual: jax.Array
    iterations: jax.Array
    converged: jax.Array


class ConvergenceError(RuntimeError):
    """An implicit solver stopped before meeting its tolerance; its result would be silently wrong.

    Raised as is by eager calls. Under `jax.jit` the check runs on the device and the error
    reaches Python as a `jax.errors.JaxRuntimeError` (sometimes a `ValueError`) whose message
    ends with this one. Not a `rules.RuleError`: no rule is broken; the numbers did not converge.

    See also: `SolveInfo`, the `throw` and `full_output` arguments of the implicit solvers.
    """


@dataclasses.dataclass(frozen=True)
class _Report:
    """Static text for a ConvergenceError: which solver, which solve, what its residual measures."""

    api: str
    measure: str
    fix: str
    limit: str = ""
    adjoint: bool = False
    tangent: bool = False  # the tangent solve of forward mode (see `_implicit_solution`)

    def message(self, residual: Any, iterations: Any, tol: Any, failed: Any = True) -> str:
        failed = np.asarray(failed, bool)
        residual, iterations, tol = (np.broadcast_to(np.asarray(a), failed.shape) for a in (residual, iterations, tol))
        first = np.unravel_index(int(np.argmax(failed)), failed.shape) if failed.ndim else ()
        r, k, t = float(residual[first]), int(iterations[first]), float(tol[first])
        got = f"residual {r:.3g} after {k} iterations" + (f" ({self.limit})" if self.limit else "")
        if not np.isfinite(r):
            got += ": the iterates are not finite (NaN or inf)"
        if failed.ndim:
            got += f"; {int(failed.sum())} of {failed.size} batch elements failed (the first is shown)"
        if self.tangent:
            solve, result = "the tangent solve of its forward-mode derivative", "derivative"
        elif self.adjoint:
            solve, result = "the adjoint solve of its pullback", "gradient"
        else:
            solve, result = "its solver", "result"
        return format_message(
            f"`{self.api}`: {solve} stopped before meeting its tolerance, so the {result} would be silently wrong",
            expected=f"residual <= tol = {t:.3g}, the residual being {self.measure}",
            got=got,
            fix=f"{self.fix}, or pass throw=False to accept the unconverged {result}"
            + ("" if self.adjoint or self.tangent else " (full_output=True then reports residual, iterations, converged)"),
        )


def _raise_on_host(report: _Report, failed, residual, iterations, tol):
    failed = np.asarray(failed)
    if failed.any():
        raise ConvergenceError(report.message(residual, iterations, tol, failed))
    return np.zeros(failed.shape, np.int32)


def _is_traced(tree: PyTree) -> bool:
    return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves(tree))


def _check_converged(result: PyTree, info: SolveInfo, tol: Any, like: PyTree, report: _Report) -> PyTree:
    """`result`, once `info` says the solve converged: eagerly, else raise `ConvergenceError`;
    under a trace, `result` passes through a `lax.cond` whose failure branch calls back to the
    host to raise (equinox's `error_if`, with public JAX APIs). `tol` is the solver's, floored
    for the dtypes of `like` (in the message only: the solver floored it already).

    Traced: the failure branch's output depends on the callback's, so the check lives as long
    as `result` is used (it is dead code otherwise, like the result). No callback runs on
    success; under `jax.vmap` the cond becomes a select, and one callback per call sees the
    whole batch (raising if any element failed). The callback's inputs carry no tangent
    (`stop_gradient`), so forward and reverse mode pass through the check.
    """
    if not _is_traced((info, tol)):
        if not bool(np.all(info.converged)):
            failed = ~np.asarray(info.converged)
            raise ConvergenceError(report.message(info.residual, info.iterations, _floor_tol(tol, like), failed))
        return result

    def unconverged(result, failed, residual, iterations, tol):
        token = jax.pure_callback(
            functools.partial(_raise_on_host, report), jax.ShapeDtypeStruct((), jnp.int32),
            failed, residual, iterations, tol, vmap_method="broadcast_all",
        )
        return jax.tree_util.tree_map(lambda leaf: leaf + token.astype(jnp.result_type(leaf)), result)

    def converged(result, *_):
        return result

    stop = jax.lax.stop_gradient
    failed, tol = ~info.converged, stop(_floor_tol(tol, like))
    return jax.lax.cond(failed, unconverged, converged, result, failed, stop(info.residual), info.iterations, tol)


def _info_without_gradient(info: SolveInfo) -> SolveInfo:
    return SolveInfo(jax.lax.stop_gradient(info.residual), info.iterations, info.converged)


def _x0_cotangent(x0: PyTree) -> Any:
    """x* does not depend on the starting point: ZeroTangent (NoTangent for an int x0)."""
    return ZeroTangent() if any(map(is_differentiable_leaf, jax.tree_util.tree_leaves(x0))) else NoTangent()


# ----- callables: a static part and arrays --------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _Bound:
    """A callable pytree without its arrays: hashable (a jit static argument and cache key).

    `bound(x, (arrays, theta)) == f(x, theta)`: the solvers treat f's arrays as parameters
    beside theta, so they are inputs of every jitted core (not baked-in constants) and the
    adjoint solve differentiates them like theta. A plain function has no arrays.
    """

    treedef: Any
    static: tuple  # f's leaves, None where an array goes

    def __call__(self, x: PyTree, params: tuple) -> PyTree:
        arrays, theta = params
        it = iter(arrays)
        leaves = [next(it) if leaf is None else leaf for leaf in self.static]
        return jax.tree_util.tree_unflatten(self.treedef, leaves)(x, theta)

    def cotangent(self, arrays_bar: Any, like: list) -> Any:
        """f's cotangent from its arrays' cotangents: NoTangent() for a callable without
        differentiable arrays, else a pytree of f's type (NoTangent() in its static places)."""
        if not any(map(is_differentiable_leaf, like)):
            return NoTangent()
        if isinstance(arrays_bar, AbstractZero):
            return ZeroTangent()
        it = iter(ProjectTo(like)(list(arrays_bar)))
        leaves = [next(it) if leaf is None else NoTangent() for leaf in self.static]
        return jax.tree_util.tree_unflatten(self.treedef, leaves)


def _bind(fn: Callable, api: str, arg: str) -> tuple[_Bound, list]:
    """Split a callable pytree (a function, an `equinox.Module`, a `jax.tree_util.Partial`)
    into its static part and its array leaves (tracers included)."""
    leaves, treedef = jax.tree_util.tree_flatten(fn)
    arrays = [leaf for leaf in leaves if isinstance(leaf, ArrayTypes)]
    static = tuple(None if isinstance(leaf, ArrayTypes) else leaf for leaf in leaves)
    for leaf in static:
        if leaf is not None:
            _check_static_callable(leaf, api, arg)
    bound = _Bound(treedef, static)
    try:
        hash(bound)
    except TypeError:
        bad = next(leaf for leaf in static if not _hashable(leaf))
        raise StaticArgumentError(
            format_message(
                f"`{api}`: `{arg}` holds a value that is neither an array nor hashable",
                expected=f"`{arg}` a function, or a pytree whose leaves are arrays or hashable objects",
                got=f"a leaf of type {type(bad).__name__}",
                fix="make that field an array, a hashable object, or a static field of the pytree",
            )
        ) from None
    return bound, arrays


def _hashable(x: Any) -> bool:
    try:
        hash(x)
    except TypeError:
        return False
    return True


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
                fix=f"move the captured arrays into `theta` (any pytree) and read them there, or make "
                f"`{arg}` a pytree that holds them (an `equinox.Module`, a `jax.tree_util.Partial`); "
                "a closure is a static argument (a cache key, not an input of the rule), so JAX "
                "cannot differentiate the values it captures",
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


# ----- Krylov solvers that report convergence ----------------------------------------------
# JAX's `cg`/`gmres` return no convergence information; these loops follow the same algorithms
# (CG; restarted GMRES, the true residual tested after each restart) and return a SolveInfo.
# A loop is `loop(op, b, tol) -> (x, info)`; `_forward_solve` and `_adjoint_solve` wrap one.
def _vdot_real(a: PyTree, b: PyTree) -> jax.Array:
    pairs = zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b))
    return sum(jnp.sum(jnp.real(jnp.conj(x) * y)) for x, y in pairs)


def _axpy(alpha: jax.Array, x: PyTree, y: PyTree) -> PyTree:
    """alpha x + y, in y's dtypes."""
    return jax.tree_util.tree_map(lambda xi, yi: yi + (alpha * xi).astype(yi.dtype), x, y)


def _cg_loop(op: Callable, b: PyTree, tol: Any, *, maxiter: int) -> tuple[PyTree, SolveInfo]:
    """Conjugate gradients (op Hermitian positive definite): stops when |r|_2 <= tol |b|_2, r the
    recursively updated residual (as JAX's `cg`); `SolveInfo.residual` is |r|_2 / |b|_2."""
    bb = _vdot_real(b, b)
    bound = jnp.square(tol) * bb

    def cond(state):
        _, _, _, gamma, k = state
        return (gamma > bound) & (k < maxiter)

    def body(state):
        x, r, p, gamma, k = state
        q = op(p)
        alpha = gamma / _vdot_real(p, q)
        x, r = _axpy(alpha, p, x), _axpy(-alpha, q, r)
        gamma_new = _vdot_real(r, r)
        return x, r, _axpy(gamma_new / gamma, p, r), gamma_new, k + 1

    zero = jax.tree_util.tree_map(jnp.zeros_like, b)
    x, _, _, gamma, k = jax.lax.while_loop(cond, body, (zero, b, b, bb, jnp.zeros((), jnp.int32)))
    return x, SolveInfo(_ratio(jnp.sqrt(gamma), jnp.sqrt(bb)), k, gamma <= bound)


def _gmres_loop(op: Callable, b: PyTree, tol: Any, *, maxiter: int) -> tuple[PyTree, SolveInfo]:
    """Restarted GMRES(m), m = min(20, n), for a C-linear op on pytrees (raveled): the Arnoldi
    basis by classical Gram-Schmidt applied twice, the small least-squares problem by `lstsq`.
    Stops when the true residual |b - op(x)|_2 <= tol |b|_2, tested after each restart (as JAX's
    batched `gmres`); `SolveInfo.residual` is that ratio, `iterations` counts restarts."""
    flat, unravel = ravel_pytree(b)
    n = flat.shape[0]
    m = min(20, max(1, n))
    b_norm = jnp.linalg.norm(flat)
    bound = tol * b_norm

    def op_flat(v):
        return ravel_pytree(op(unravel(v)))[0]

    def arnoldi(j, basis):
        v, h = basis
        w = op_flat(v[j])
        for _ in range(2):
            c = v.conj() @ w  # rows of v past j are still zero
            w = w - c @ v
            h = h.at[:, j].add(c)
        w_norm = jnp.linalg.norm(w)
        h = h.at[j + 1, j].set(w_norm.astype(h.dtype))
        return v.at[j + 1].set(w / jnp.where(w_norm == 0, 1, w_norm).astype(w.dtype)), h

    def restart(state):
        x, r, r_norm, k = state
        v = jnp.zeros((m + 1, n), flat.dtype).at[0].set(r / jnp.where(r_norm == 0, 1, r_norm).astype(flat.dtype))
        v, h = jax.lax.fori_loop(0, m, arnoldi, (v, jnp.zeros((m + 1, m), flat.dtype)))
        y = jnp.linalg.lstsq(h, jnp.zeros(m + 1, flat.dtype).at[0].set(r_norm.astype(flat.dtype)))[0]
        x = x + y @ v[:m]
        r = flat - op_flat(x)
        return x, r, jnp.linalg.norm(r), k + 1

    def cond(state):
        _, _, r_norm, k = state
        return (r_norm > bound) & (k < maxiter)

    init = (jnp.zeros_like(flat), flat, b_norm, jnp.zeros((), jnp.int32))
    x, _, r_norm, k = jax.lax.while_loop(cond, restart, init)
    return unravel(x), SolveInfo(_ratio(r_norm, b_norm), k, r_norm <= bound)


def _krylov_loop(method: str, b: PyTree, maxiter: int | None) -> Callable:
    """The loop of "cg" or "gmres" for right-hand sides shaped like b; maxiter defaults to 10 n."""
    if maxiter is None:
        maxiter = 10 * sum(np.size(leaf) for leaf in jax.tree_util.tree_leaves(b))
    return functools.partial(_cg_loop if method == "cg" else _gmres_loop, maxiter=maxiter)


def _transpose_symmetric(b: PyTree, symmetric: bool) -> bool:
    """`custom_linear_solve`'s `symmetric`: A^T = A, so a Hermitian A on complex b is not."""
    return symmetric and not any(jnp.iscomplexobj(leaf) for leaf in jax.tree_util.tree_leaves(b))


def _zero_tangent(x: jax.Array) -> Any:
    return jnp.zeros_like(x) if jnp.issubdtype(x.dtype, jnp.inexact) else np.zeros(np.shape(x), jax.dtypes.float0)


def _forward_solve(
    loop: Callable, op: Callable, b: PyTree, tol: Any, symmetric: bool, report: _Report | None = None
) -> tuple[PyTree, SolveInfo]:
    """`loop(op, b, tol) -> (x, info)` with x differentiated as `lax.custom_linear_solve` (forward
    and reverse, to any order, as JAX's `cg`/`gmres`); info has no derivative. The tangent
    solve checks its convergence against `report` (none for None), as `_adjoint_solve`'s does.

    Not `custom_linear_solve(..., has_aux=True)`: under `jax.jacfwd` its batching rule batches
    the aux of a transposable solve, which would batch the convergence check and x with it.
    What op closes over becomes explicit arguments (`consts`), so that the jvp rule, which
    JAX may trace after the enclosing jit, captures no tracer.
    """
    closed, out_shape = jax.make_jaxpr(op, return_shape=True)(b)
    out_tree = jax.tree_util.tree_structure(out_shape)

    def op_of(consts):
        def matvec(v):
            out = jax.core.eval_jaxpr(closed.jaxpr, consts, *jax.tree_util.tree_leaves(v))
            return jax.tree_util.tree_unflatten(out_tree, out)

        return matvec

    @jax.custom_jvp
    def solve(b, tol, consts):
        return loop(op_of(consts), b, tol)

    @solve.defjvp
    def solve_jvp(primals, tangents):
        b, tol, consts = primals
        b_dot, _, consts_dot = tangents
        x, info = solve(b, tol, consts)
        a_dot_x = jax.jvp(lambda c: op_of(c)(x), (consts,), (consts_dot,))[1]

        def solve_x(matvec, rhs):
            x, info = loop(matvec, rhs, tol)
            return x if report is None else _check_converged(x, info, tol, x, report)

        x_dot = jax.lax.custom_linear_solve(op_of(consts), _tree_sub(b_dot, a_dot_x), solve_x, solve_x,
                                            symmetric=_transpose_symmetric(b, symmetric))
        return (x, info), (x_dot, jax.tree_util.tree_map(_zero_tangent, info))

    return solve(b, tol, list(closed.consts))


def _adjoint_solve(
    loop: Callable, op: Callable, rhs: PyTree, tol: Any, symmetric: bool, eager: bool, report: _Report | None
) -> tuple[PyTree, SolveInfo | None]:
    """The linear solve of a pullback, op(u) = rhs, linear in rhs.

    eager (concrete inputs): `loop`'s (u, info), for the caller to check. Traced: (u, None),
    u from a `lax.custom_linear_solve` whose solve checks its own convergence against `report`
    (no check for None): so the pullback stays transposable (forward mode through its
    transpose) and differentiable, while the check runs on the device.
    """
    if eager:
        return loop(op, rhs, tol)

    def solve(matvec, b):
        u, info = loop(matvec, b, tol)
        return u if report is None else _check_converged(u, info, tol, u, report)

    return jax.lax.custom_linear_solve(op, rhs, solve, solve, symmetric=_transpose_symmetric(rhs, symmetric)), None


def _implicit_solution(
    solver: Callable, G: Callable, tangent_solve: Callable, x0: PyTree, params: PyTree, tol: jax.Array
) -> tuple[PyTree, SolveInfo]:
    """`solver(x0, params, tol) -> (x*, info)`, x* differentiated in forward mode as the
    solution of G(x*, params) = 0 (the implicit function theorem): x_dot solves
    (dG/dx) x_dot = -(dG/dparams) params_dot at x*, by `tangent_solve(op, rhs, tol)`, a solve
    JAX can transpose (so reverse mode through it works too). x0, tol and info have no derivative.

    Without it JAX differentiates the solver's while_loop, whose tangent iterates only as long
    as the primal does: wrong when x0 is x* (one step). That is what runs under `jax.hessian`,
    where a rule's own forward pass calls the plain solver (`rules._lowering.bypass_in_own_rule`).
    The callables must not close over traced values (the solvers' static parts do not).
    Concrete inputs (an eager call: nothing to differentiate) run the solver alone.
    """
    if not _is_traced((x0, params, tol)):
        return solver(x0, params, tol)

    @jax.custom_jvp
    def solve(x0, params, tol):
        return solver(x0, params, tol)

    @solve.defjvp
    def solve_jvp(primals, tangents):
        x0, params, tol = primals
        x_star, info = solve(x0, params, tol)
        g_dot = jax.jvp(lambda p: G(x_star, p), (params,), (tangents[1],))[1]

        def op(v):
            return jax.jvp(lambda x: G(x, params), (x_star,), (v,))[1]

        x_dot = tangent_solve(op, _tree_neg(g_dot), tol)
        return (x_star, info), (x_dot, jax.tree_util.tree_map(_zero_tangent, info))

    return solve(x0, params, tol)


def _real_pairs(op: Callable, rhs: PyTree) -> tuple[Callable, jax.Array, Callable]:
    """An R-linear `op` on pytrees as a real-linear map of real vectors (complex leaves as real
    pairs, since a ChainRules pullback is only R-linear in general): (op_real, rhs_real, back)."""
    flat, unravel = ravel_pytree(rhs)
    is_complex = jnp.iscomplexobj(flat)
    n = flat.shape[0]

    def to_real(v):
        return jnp.concatenate([jnp.real(v), jnp.imag(v)]) if is_complex else v

    def from_real(r):
        return unravel(jax.lax.complex(r[:n], r[n:]) if is_complex else r)

    def op_real(r):
        return to_real(ravel_pytree(op(from_real(r)))[0])

    return op_real, to_real(flat), from_real


# Example callables: module-level, so hashable and the same object on every call.
def _contraction(x, theta):
    """0.5 tanh(x) + theta: a contraction (rate <= 1/2) with a unique fixed point."""
    return 0.5 * jnp.tanh(x) + theta


def _deq_layer(x, theta):
    """A small implicit ("deep equilibrium") layer: x = tanh(W x + b) / 2, a contraction for ||W|| < 2."""
    w, b = theta
    return 0.5 * jnp.tanh(w @ x + b)


def _scaled_contraction(a, x, theta):
    """a tanh(x) + theta, a contraction for |a| < 1; `jax.tree_util.Partial(_scaled_contraction, a)`
    is a callable pytree whose array `a` is differentiated."""
    return a * jnp.tanh(x) + theta


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
