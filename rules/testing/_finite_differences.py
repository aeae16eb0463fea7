"""Finite differences for checking rules: FiniteDifferences.jl's methods, batched with JAX.

A method `m = central_fdm(p, q)` holds a stencil with exact coefficients. `m(f, x)` picks a
step for a scalar function as FiniteDifferences.jl does (the p-th derivative estimated by a
method of p + 2 points around x); `fd_jvp` picks one for its direction, `fd_vjp` and
`fd_jacobian` one per input coordinate. They difference any pytree function through
`to_vec`, evaluating the whole stencil in one jitted call: f is traced once and replayed
under `jax.vmap`, or, for a large batch along one direction, point by point through one
compiled evaluation that reduces on the device. Every call traces f anew (f as it is now);
an evaluation that lowers to a program compiled before reuses that compilation
(`_compiled`), so differencing the same function again compiles nothing. Everything runs in float64, whatever `jax_enable_x64` says
globally. The testers' fast mode (`_fd_inner_jvps`) estimates the p-th derivative with p + 1
points, one evaluation of f fewer on inputs of a million elements.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import operator
from fractions import Fraction
from typing import Any, Callable, NamedTuple

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np

from ._compiled import jit
from ._compare import host_dot

__all__ = [
    # methods
    "FDMethod",
    "central_fdm",
    "forward_fdm",
    "backward_fdm",
    "extrapolate_fdm",
    # pytrees as vectors
    "to_vec",
    # derivatives of pytree functions
    "fd_jvp",
    "fd_vjp",
    "fd_jacobian",
]

PyTree = Any
_EPS = float(np.finfo(np.float64).eps)
_CONDITION = 10.0  # assumed bound on |f^(p)| when no derivative is estimated (adapt=0)
_MAX_STEP_FACTOR = 1000.0  # a chosen step never exceeds this multiple of the default step
# Where the derivative estimate that sets the step is not finite (its points left f's domain),
# its step shrinks by this factor, up to this many times, before the default step is used.
_SHRINK, _SHRINKS = 10.0, 3
# A batch of points along a direction with up to this many elements (points x the larger of
# input and output size) is one vmap of f, padding included, brought to the host and reduced
# there. A larger one is evaluated point by point, each point one call of a compiled
# function that reduces on the device (one for step selection, one for the stencil): they
# compile as fast as the vmap (straight-line code, no loop), evaluate no padding, keep memory
# that of one point and bring back scalars only. On a 2-core CPU this is faster from about
# 1e5 elements (no batch to materialise and copy to the host); below, the vmap saves a
# dispatch per point.
_VMAP_ELEMENTS = 2**17


def _x64(name: str):
    """A context in which float64 exists, whatever the global `jax_enable_x64` says."""
    enable = getattr(jax, "enable_x64", None)
    if enable is not None:
        return enable(True)
    if not jax.config.jax_enable_x64:
        raise RuntimeError(
            f"`{name}` differences in float64, but float64 is disabled in this JAX; call "
            "`jax.config.update('jax_enable_x64', True)` before using finite differences."
        )
    return contextlib.nullcontext()


def _combine(weights: np.ndarray, values: np.ndarray) -> np.ndarray:
    """sum_i w_i values[i], taken relative to values[0] (weights sum to 0 when q >= 1), so
    a function that does not change gives exactly 0. Methods order their points nearest
    first, so values[0] is f at the point nearest x and the differences lose least. A point
    outside f's domain gives NaN quietly (`_in_domain` estimates that entry again)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return np.tensordot(weights, values - values[:1], axes=1)


def _divide(a: Any, b: Any) -> Any:
    """a / b where b may be 0 (a step of 0 from `max_range=0`): inf or nan, no warning."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.true_divide(a, b)


def _representable(x: Any, h: Any) -> np.ndarray:
    """Steps near h that x + step represents exactly, (x + h) - x, entry by entry (h itself
    at an infinite or NaN entry, which is held constant: `_held`)."""
    with np.errstate(invalid="ignore"):
        snapped = (np.asarray(x, np.float64) + h) - x
    return np.where((snapped != 0) & np.isfinite(snapped), snapped, h)


def _held(x: np.ndarray) -> np.ndarray:
    """The input coordinates that are not perturbed: infinite or NaN entries (x + h is x
    again, or NaN), which finite differences treat as constants (derivative 0)."""
    return ~np.isfinite(x)


# Spans (largest |h * grid|) tried, largest first, where a method's stencil left f's domain.
_DOMAIN_SPANS = (1e-2, 1e-4, 1e-6, 1e-8, 1e-10, 1e-12)


def _one_sided(m: FDMethod) -> list[FDMethod]:
    """Methods tried, in order, where a central method's estimate is not finite at a point
    (its stencil left f's domain: `logit` near 0, `sqrt` near 0): the same method with its
    span capped ever shorter (its step rule then sees f on the scale of the boundary's
    distance), then FiniteDifferences.jl's forward and backward methods of its order, the
    same way (a point on the boundary itself). None for a one-sided or custom method, which
    is the user's choice."""
    if m.kind != "central":
        return []
    spans = [r for r in _DOMAIN_SPANS if r < m.max_range]
    return [FDMethod(kind, m.p, m.q, m.adapt, r, m.factor)
            for kind in ("central", "forward", "backward") for r in ([] if kind == "central" else [m.max_range]) + spans]


def _finite_rows(a: np.ndarray) -> np.ndarray:
    """Whether each entry along the first axis is finite in every other axis."""
    return np.isfinite(a).reshape(a.shape[0], -1).all(axis=1) if a.size else np.ones(a.shape[:1], bool)


def _in_domain(m: FDMethod, estimate: Callable[[FDMethod], np.ndarray], held: np.ndarray) -> np.ndarray:
    """`estimate(m)`, an array whose first axis runs over the entries `held` describes, with
    each non-finite entry replaced by the first finite one of `_one_sided(m)`'s methods
    (evaluated only where needed), and each held entry 0."""
    out = np.array(estimate(m), copy=True)
    bad = ~_finite_rows(out) & ~held
    for other in _one_sided(m):
        if not bad.any():
            break
        alt = np.asarray(estimate(other))
        good = bad & _finite_rows(alt)
        out[good] = alt[good]
        bad &= ~good
    out[held] = 0
    return out


# ------------------------------------------------------------------------------------------
# Methods: a grid, exact coefficients, and the choice of step
# ------------------------------------------------------------------------------------------


def _make_grid(kind: str, p: int) -> tuple[int, ...]:
    if kind == "forward":
        return tuple(range(p))
    if kind == "backward":
        return tuple(range(1 - p, 1))
    half = p // 2  # central: symmetric; an even p skips 0, as in FiniteDifferences.jl
    return tuple(g for g in range(-half, half + 1) if p % 2 or g != 0)


def _kind_of(grid: tuple[int, ...]) -> str:
    """The kind of standard grid a custom grid resembles (for its bound estimator)."""
    if all(g >= 0 for g in grid):
        return "forward"
    if all(g <= 0 for g in grid):
        return "backward"
    return "central"


@functools.lru_cache(maxsize=64)
def _exact_coefs(grid: tuple[int, ...], q: int) -> tuple[Fraction, ...]:
    """Solve the Vandermonde system sum_i c_i g_i^k = q! [k == q], k < p, in rationals."""
    p = len(grid)
    rows = [
        [Fraction(g) ** k for g in grid] + [Fraction(math.factorial(q) if k == q else 0)]
        for k in range(p)
    ]
    for col in range(p):  # Gauss-Jordan; distinct grid points make the system regular
        pivot = next(r for r in range(col, p) if rows[r][col] != 0)
        rows[col], rows[pivot] = rows[pivot], rows[col]
        rows[col] = [a / rows[col][col] for a in rows[col]]
        for r in range(p):
            if r != col and rows[r][col] != 0:
                scale = rows[r][col]
                rows[r] = [a - scale * b for a, b in zip(rows[r], rows[col])]
    return tuple(row[-1] for row in rows)


def _nearest_first(grid: Any) -> np.ndarray:
    """The indices of the grid's points ordered by distance from 0 (stable)."""
    return np.argsort(np.abs(np.asarray(grid, dtype=np.float64)), kind="stable")


@dataclasses.dataclass(frozen=True, repr=False)
class FDMethod:
    """A finite-difference method: `p` grid points estimating the `q`-th derivative.

    Build one with `central_fdm`, `forward_fdm`, `backward_fdm` or `FDMethod.from_grid`;
    call it as `m(f, x)`. Attributes: `grid` (integer offsets), `coefs` (float64 weights),
    `exact_coefs` (`Fraction`s), `adapt`, `max_range`, `factor`.

    >>> central_fdm(3, 1).exact_coefs
    (Fraction(-1, 2), Fraction(0, 1), Fraction(1, 2))

    See also: central_fdm, FDMethod.from_grid, extrapolate_fdm, fd_jacobian.
    """

    kind: str
    p: int
    q: int
    adapt: int = 1
    max_range: float = math.inf
    factor: float = 1.0
    custom_grid: tuple[int, ...] | None = dataclasses.field(default=None, compare=False)
    grid: tuple[int, ...] = dataclasses.field(init=False)
    exact_coefs: tuple[Fraction, ...] = dataclasses.field(init=False, compare=False)
    coefs: tuple[float, ...] = dataclasses.field(init=False, compare=False)
    # Derived in __post_init__, private: the stencil's nonzero points (nearest first) and its error model.
    _offsets: np.ndarray = dataclasses.field(init=False, repr=False, compare=False)
    _weights: np.ndarray = dataclasses.field(init=False, repr=False, compare=False)
    _weight_total: float = dataclasses.field(init=False, repr=False, compare=False)
    _roundoff: float = dataclasses.field(init=False, repr=False, compare=False)
    _truncation: float = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self):
        name = "FDMethod.from_grid" if self.kind == "custom" else f"{self.kind}_fdm"
        if self.kind not in ("central", "forward", "backward", "custom"):
            raise ValueError(
                "`FDMethod`: `kind` must be 'central', 'forward', 'backward' or 'custom', got "
                f"{self.kind!r}."
            )
        for arg in ("p", "q", "adapt"):
            value = getattr(self, arg)
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"`{name}`: `{arg}` must be an int, got {value!r}.")
        if self.q < 0:
            raise ValueError(f"`{name}`: the derivative order `q` must be >= 0, got q={self.q}.")
        if self.p <= self.q:
            example = (
                "FDMethod.from_grid((-1, 0, 1), 1)" if self.kind == "custom" else f"{name}({self.q + 2}, {self.q})"
            )
            raise ValueError(
                f"`{name}`: need more grid points than the derivative order (p > q), got "
                f"p={self.p}, q={self.q}; use p >= {self.q + 1}, e.g. {example}."
            )
        if self.adapt < 0:
            raise ValueError(f"`{name}`: `adapt` must be >= 0, got {self.adapt}.")
        if not self.max_range >= 0:
            raise ValueError(f"`{name}`: `max_range` must be >= 0, got {self.max_range!r}.")
        if not 0 < self.factor < math.inf:
            raise ValueError(
                f"`{name}`: `factor` must be positive and finite, got {self.factor!r}."
            )
        if self.kind == "custom":
            grid = self.custom_grid
            if grid is None or len(grid) != self.p:
                raise ValueError(f"`{name}`: a custom method needs its grid of p={self.p} points.")
        else:
            if self.custom_grid is not None:
                raise ValueError(f"`{name}`: only kind 'custom' takes a grid; use FDMethod.from_grid.")
            grid = _make_grid(self.kind, self.p)
        exact = _exact_coefs(grid, self.q)
        set_ = object.__setattr__
        set_(self, "grid", grid)
        set_(self, "exact_coefs", exact)
        set_(self, "coefs", tuple(float(c) for c in exact))
        # Only points with a nonzero weight are ever evaluated, the nearest to x first.
        used = [(g, c) for g, c in zip(grid, exact) if c != 0]
        used = [used[i] for i in _nearest_first([g for g, _ in used])]
        set_(self, "_offsets", np.array([g for g, _ in used], dtype=np.float64))
        set_(self, "_weights", np.array([float(c) for _, c in used]))
        set_(self, "_weight_total", float(sum(c for _, c in used)))  # exactly 0 when q >= 1
        # Error model: roundoff eps |f| sum|c| / h^q, truncation |f^(p)| sum|c g^p| / p! h^(p-q).
        set_(self, "_roundoff", float(sum(abs(c) for _, c in used)))
        truncation = sum(abs(c * Fraction(g) ** self.p) for g, c in used)
        set_(self, "_truncation", float(truncation / math.factorial(self.p)))

    @classmethod
    def from_grid(
        cls, grid: Any, q: int, *, adapt: int = 0, max_range: float = math.inf, factor: float = 1.0
    ) -> FDMethod:
        """A method on a grid of your choice, FiniteDifferences.jl's `FiniteDifferenceMethod(grid, q)`.

        Args:
          grid: distinct integer offsets, in units of the step.
          q: derivative order, < len(grid).
          adapt: levels of derivative estimation used to choose the step; 0 (the default,
            as upstream) uses a fixed guess; >= 1 estimates with a forward, backward or
            central grid, whichever the custom grid's signs resemble.
          max_range, factor: as for `central_fdm`.

        Returns:
          An `FDMethod` of kind "custom".

        >>> m = FDMethod.from_grid([-2, 0, 5], 1)
        >>> m.grid, round(m(jnp.sin, 1.0), 8)  # cos(1.0)
        ((-2, 0, 5), 0.54030231)

        See also: central_fdm, FDMethod.
        """
        try:
            points = tuple(operator.index(g) for g in grid)
        except TypeError:
            raise TypeError(f"`FDMethod.from_grid`: `grid` must hold ints, got {grid!r}.") from None
        if len(set(points)) != len(points):
            raise ValueError(f"`FDMethod.from_grid`: the grid's points must be distinct, got {points}.")
        return cls("custom", len(points), q, adapt, max_range, factor, points)

    def __repr__(self) -> str:
        extras = "".join(
            f", {k}={getattr(self, k)!r}"
            for k, default in (("max_range", math.inf), ("factor", 1.0))
            if getattr(self, k) != default
        )
        coefs = ", ".join(str(c) for c in self.exact_coefs)
        made = f"from_grid({self.grid}, {self.q})" if self.kind == "custom" else f"{self.kind}_fdm({self.p}, {self.q})"
        return f"<FDMethod {made}: grid={self.grid}, coefs=({coefs}), adapt={self.adapt}{extras}>"

    def __call__(self, f: Callable, x: Any, *, step: float | None = None) -> float:
        """Estimate the q-th derivative of the scalar function `f` at the scalar `x`.

        A method with `q = 0` returns `f(x)` itself unless a step is given. With
        `max_range=0` no step is possible and the estimate is not finite (nan), as upstream.

        Args:
          f: a JAX-traceable function from a float64 scalar to a real scalar (an integer
            output counts as a constant).
          x: a Python number or 0-d real array.
          step: the step h; chosen by `estimate_step` when omitted.

        Returns:
          The estimate, a Python float.

        >>> round(central_fdm(5, 1)(jnp.sin, 1.0), 10)  # cos(1.0)
        0.5403023059

        See also: FDMethod.estimate_step, extrapolate_fdm.
        """
        name = f"{self._name}(...)(f, x)"
        with _x64(name):
            if self.q == 0 and step is None:
                return _scalar_value(name, f, x)
            sampler = _scalar_sampler(self, f, x, name, self._batch_size() if step is None else 0)
            step = self._estimate_step(sampler)[0] if step is None else _check_step(name, step)
            return self._apply(sampler, float(_representable(sampler.flat.x_host[0], step)))

    def estimate_step(self, f: Callable, x: Any) -> tuple[float, float]:
        """Choose the step for `m(f, x)` and bound the error of the resulting estimate.

        With `adapt >= 1` the p-th derivative of `f` near `x` is estimated by a method of
        two more points (itself adapted `adapt - 1` times), as in FiniteDifferences.jl; the
        step then minimises roundoff + truncation error, capped by `max_range`.

        Args:
          f: a JAX-traceable function from a float64 scalar to a real scalar.
          x: a Python number or 0-d real array.

        Returns:
          `(step, error_estimate)`, two Python floats.

        >>> step, err = central_fdm(5, 1).estimate_step(jnp.sin, 1.0)
        >>> bool(1e-4 < step < 1e-2 and err < 1e-11)
        True

        See also: FDMethod.__call__.
        """
        name = f"{self._name}(...).estimate_step(f, x)"
        with _x64(name):
            return self._estimate_step(_scalar_sampler(self, f, x, name, self._batch_size()))

    @property
    def _name(self) -> str:
        return "FDMethod.from_grid" if self.kind == "custom" else f"{self.kind}_fdm"

    # -- step selection; `sampler(ts)` returns f and |f| scales at x + ts (one batch) --

    @functools.cached_property
    def _bound_estimator(self) -> FDMethod | None:
        """The method estimating f^(p) for the step: p + 2 points (FiniteDifferences.jl)."""
        return self._bound(2)

    @functools.cached_property
    def _lean_bound_estimator(self) -> FDMethod | None:
        """p + 1 points: one evaluation of f fewer, for the testers' fast mode on large inputs."""
        return self._bound(1)

    def _bound(self, extra: int) -> FDMethod | None:
        if self.adapt == 0:
            return None
        kind = _kind_of(self.grid) if self.kind == "custom" else self.kind
        return FDMethod(kind, self.p + extra, self.p, self.adapt - 1, self.max_range, self.factor)

    def _bound_of(self, lean: bool) -> FDMethod | None:
        return self._lean_bound_estimator if lean else self._bound_estimator

    def _batch_size(self, lean: bool = False) -> int:
        """The largest batch that step selection and the estimate itself evaluate."""
        size, b = len(self._offsets), self._bound_of(lean)
        while b is not None:
            size = max(size, len(b.grid))
            b = b._bound_of(lean)
        return size

    @functools.cached_property
    def _sorted_grid(self) -> np.ndarray:
        """The grid, nearest point to 0 first (the reference of the differences)."""
        return np.asarray(self.grid, dtype=np.float64)[_nearest_first(self.grid)]

    @functools.cached_property
    def _neighbour_weights(self) -> np.ndarray:
        """Weights estimating the q-th derivative at three points of the grid's span from f on
        the grid itself (each solved exactly for the shifted grid), so that one batch of `p`
        points bounds the derivative over a neighbourhood, as in FiniteDifferences.jl: x - h,
        x, x + h for a central grid, x, x + h, x + 2h for a forward one, and x - 2h, x - h, x
        for a backward one. Columns follow `_sorted_grid`."""
        shifts = {"forward": (2, 1, 0), "backward": (0, -1, -2)}.get(_kind_of(self.grid), (1, 0, -1))
        order = _nearest_first(self.grid)
        return np.array(
            [[float(c) for c in _exact_coefs(tuple(g - s for g in self.grid), self.q)] for s in shifts]
        )[:, order]

    @functools.cached_property
    def _default_step(self) -> float:
        """The step for an assumed |f^(p)| of 10 and |f| of 1 (FiniteDifferences.jl's default)."""
        return self._argmin(_EPS * self.factor * self._roundoff, _CONDITION * self._truncation)

    def _argmin(self, c1: Any, c2: Any) -> Any:
        p, q = self.p, self.q
        with np.errstate(divide="ignore", invalid="ignore"):
            return (q / (p - q) * np.true_divide(c1, c2)) ** (1 / p)

    def _choose_step(self, deriv_bound: Any, f_scale: Any) -> tuple[Any, Any]:
        """Minimise the error bound c1 / h^q + c2 h^(p-q) (roundoff + truncation) over h, up
        to `max_range` and 1000 default steps; return h and the bound there. Elementwise on
        arrays (one step per coordinate); where the derivative or the scale of f is 0 or not
        finite, the default step (assumed |f^(p)| = 10, |f| = 1)."""
        deriv_bound, f_scale = np.asarray(deriv_bound, np.float64), np.asarray(f_scale, np.float64)
        known = (deriv_bound > 0) & (deriv_bound < math.inf) & (f_scale > 0) & (f_scale < math.inf)
        f_error = np.where(known, np.spacing(np.where(known, f_scale, 1.0)), _EPS)  # Julia's eps(|f|)
        c1 = f_error * self.factor * self._roundoff
        c2 = np.where(known, deriv_bound, _CONDITION) * self._truncation
        h_max = min(_MAX_STEP_FACTOR * self._default_step, self.max_range / max(abs(g) for g in self.grid))
        h = np.minimum(self._argmin(c1, c2), h_max)
        with np.errstate(divide="ignore", invalid="ignore"):
            bound = c1 / h**self.q + c2 * h ** (self.p - self.q)
        if h.ndim == 0:
            return float(h), float(bound)
        return h, bound

    def _estimate_step(self, sampler: _Sampler, lean: bool = False) -> tuple[float, float]:
        b = self._bound_of(lean)
        if b is None:
            return self._choose_step(0.0, 0.0)
        return self._choose_step(*b._magnitudes(sampler, lean))

    def _magnitudes(self, sampler: _Sampler, lean: bool = False) -> tuple[float, float]:
        """max |q-th derivative| at three points around x, and max |f| seen there. Where
        that is not finite (the points left f's domain: arccos near 1), the step shrinks."""
        step, _ = self._estimate_step(sampler, lean)
        for _ in range(_SHRINKS + 1):
            values, scales = sampler(self._sorted_grid * step)
            derivs = _divide(self._neighbour_weights @ (values - values[0]), step**self.q)
            bound, scale = float(np.max(np.abs(derivs))), float(np.max(scales))
            if math.isfinite(bound) and math.isfinite(scale):
                break
            step /= _SHRINK
        return bound, scale

    def _estimate(self, values: np.ndarray, step: Any) -> Any:
        """The stencil's estimate from f at `_offsets * step` (axis 0 of `values`)."""
        total = _combine(self._weights, values)
        if self._weight_total:  # q = 0: the weights sum to 1
            total = total + self._weight_total * values[0]
        return _divide(total, step**self.q)

    def _apply(self, sampler: _Sampler, step: float) -> float:
        values, _ = sampler(self._offsets * step)
        return float(self._estimate(values, step))

    def _error_exponents(self, count: int) -> list[int]:
        """Powers of h in the error expansion: k - q for each k >= p with sum c g^k != 0."""
        exponents: list[int] = []
        k = self.p
        while len(exponents) < count:
            if sum(c * Fraction(g) ** k for g, c in zip(self.grid, self.exact_coefs)) != 0:
                exponents.append(k - self.q)
            k += 1
        return exponents


def central_fdm(
    p: int, q: int, *, adapt: int = 1, max_range: float = math.inf, factor: float = 1.0
) -> FDMethod:
    """A central method: `p` points symmetric around 0 for the `q`-th derivative.

    Odd `p` uses -(p-1)/2..(p-1)/2; even `p` skips 0 (FiniteDifferences.jl's grid).

    Args:
      p: number of grid points, > q.
      q: derivative order, >= 1.
      adapt: levels of derivative estimation used to choose the step (0: a fixed guess).
      max_range: bound on |h * grid|, to stay inside the domain of f.
      factor: multiplies the assumed roundoff error of f (raise it for noisy f).

    Returns:
      An `FDMethod`.

    >>> central_fdm(5, 1)
    <FDMethod central_fdm(5, 1): grid=(-2, -1, 0, 1, 2), coefs=(1/12, -2/3, 0, 2/3, -1/12), adapt=1>
    >>> round(central_fdm(5, 2)(jnp.exp, 0.0), 8)
    1.0

    See also: forward_fdm, backward_fdm, extrapolate_fdm.
    """
    return FDMethod("central", p, q, adapt, max_range, factor)


def forward_fdm(
    p: int, q: int, *, adapt: int = 1, max_range: float = math.inf, factor: float = 1.0
) -> FDMethod:
    """A forward method: grid 0..p-1, evaluating f only at x and above.

    Args:
      p, q, adapt, max_range, factor: as for `central_fdm`.

    Returns:
      An `FDMethod`.

    >>> forward_fdm(2, 1).coefs
    (-1.0, 1.0)
    >>> round(forward_fdm(5, 1)(jnp.sqrt, 4.0), 8)
    0.25

    See also: central_fdm, backward_fdm.
    """
    return FDMethod("forward", p, q, adapt, max_range, factor)


def backward_fdm(
    p: int, q: int, *, adapt: int = 1, max_range: float = math.inf, factor: float = 1.0
) -> FDMethod:
    """A backward method: grid -(p-1)..0, evaluating f only at x and below.

    Args:
      p, q, adapt, max_range, factor: as for `central_fdm`.

    Returns:
      An `FDMethod`.

    >>> backward_fdm(3, 1).grid
    (-2, -1, 0)
    >>> round(backward_fdm(5, 1)(jnp.log, 2.0), 8)
    0.5

    See also: central_fdm, forward_fdm.
    """
    return FDMethod("backward", p, q, adapt, max_range, factor)


def _check_step(where: str, step: Any) -> float:
    step = float(step)
    if not 0 < step < math.inf:
        raise ValueError(f"`{where}`: `step` must be positive and finite, got {step!r}.")
    return step


# ------------------------------------------------------------------------------------------
# Richardson extrapolation
# ------------------------------------------------------------------------------------------


def extrapolate_fdm(
    m: FDMethod,
    f: Callable,
    x: Any,
    *,
    h0: float | None = None,
    contract: float = 0.125,
    breaktol: float = math.inf,
    rtol: float = 0.0,
    atol: float = 0.0,
    max_eval: int = 10,
) -> tuple[float, float]:
    """Estimate the q-th derivative by Richardson extrapolation of `m` to step 0.

    `m` is applied at steps h0, h0*contract, ..., (`max_eval` of them, one batched
    evaluation of f); a Neville tableau eliminates the powers of h in `m`'s error expansion
    (h^2, h^4, ... for central methods). A row's error estimate is the largest of its change
    from the previous diagonal entry, from the entry to its left, and its roundoff error.
    Rows are walked until the error estimate meets `max(rtol * |estimate|, atol)`, exceeds
    `breaktol` times the best so far, or stops being finite; the estimate with the smallest
    error estimate is returned.

    Args:
      m: a method, e.g. `central_fdm(2, 1)`.
      f: a JAX-traceable function from a float64 scalar to a real scalar.
      x: a Python number or 0-d real array.
      h0: the first step; default `0.1 * max(|x|, 1)`, capped by `m.max_range`.
      contract: the ratio of successive steps, in (0, 1).
      breaktol: stop when the error estimate grows past `breaktol` times the best one.
      rtol, atol: stop once the error estimate is below `max(rtol * |estimate|, atol)`.
      max_eval: the number of steps.

    Returns:
      `(estimate, error_estimate)`, two Python floats.

    >>> estimate, err = extrapolate_fdm(central_fdm(2, 1), jnp.sin, 1.0)
    >>> round(estimate, 12), bool(err < 1e-11)
    (0.540302305868, True)

    See also: central_fdm, FDMethod.estimate_step.
    """
    name = "extrapolate_fdm"
    _check_method(name, m, first_order=False)
    if not 0 < contract < 1:
        raise ValueError(f"`{name}`: `contract` must lie in (0, 1), got {contract!r}.")
    if not isinstance(max_eval, int) or max_eval < 1:
        raise ValueError(f"`{name}`: `max_eval` must be an int >= 1, got {max_eval!r}.")
    with _x64(name):
        sampler = _scalar_sampler(m, f, x, name, 0)
        x0 = float(sampler.flat.x_host[0])
        if h0 is None:
            h0 = min(0.1 * max(abs(x0), 1.0), m.max_range / max(abs(g) for g in m.grid))
        h0 = _check_step(name, h0)
        steps = _representable(x0, h0 * contract ** np.arange(max_eval))
        values, _ = sampler(np.outer(steps, m._offsets).ravel())
        values = values.reshape(max_eval, -1)
        estimates = m._estimate(values.T, steps)
        # The newest row's roundoff reaches the extrapolated value almost unscaled.
        noise = _EPS * m.factor * m._roundoff * np.max(np.abs(values), axis=1) / steps**m.q
    exponents = m._error_exponents(max_eval - 1)
    best, best_err = float(estimates[0]), math.inf
    previous = [estimates[0]]
    for i in range(1, max_eval):
        row = [estimates[i]]
        for k in range(1, i + 1):  # eliminate the h^exponents[k-1] term
            ratio = contract ** -exponents[k - 1]
            row.append(row[k - 1] + (row[k - 1] - previous[k - 1]) / (ratio - 1))
        err = float(max(abs(row[i] - row[i - 1]), abs(row[i] - previous[i - 1]), noise[i]))
        if not math.isfinite(err):
            break
        if err < best_err:
            best, best_err = float(row[i]), err
        if err <= max(rtol * abs(best), atol) or err > breaktol * best_err:
            break
        previous = row
    return best, best_err


# ------------------------------------------------------------------------------------------
# Pytrees as vectors. Complex numbers are interleaved: z -> [re z_0, im z_0, re z_1, ...].
# ------------------------------------------------------------------------------------------


class _Leaf(NamedTuple):
    path: str
    kind: str | None  # "real", "complex", or None: not perturbable, carried unchanged
    shape: tuple[int, ...] | None  # None for leaves that are not numbers
    dtype: np.dtype | None
    value: Any  # the leaf itself, kept for non-perturbable leaves

    @property
    def size(self) -> int:
        if self.kind is None:
            return 0
        assert self.shape is not None  # numbers have a shape
        return math.prod(self.shape) * (2 if self.kind == "complex" else 1)


@dataclasses.dataclass(frozen=True)
class _Layout:
    treedef: Any
    leaves: tuple[_Leaf, ...]

    @property
    def size(self) -> int:
        return sum(leaf.size for leaf in self.leaves)

    def signature(self) -> list[tuple[str, tuple[int, ...] | None, str]]:
        return [(leaf.path, leaf.shape, leaf.kind) for leaf in self.leaves if leaf.kind]

    def without_values(self) -> _Layout:
        return _Layout(self.treedef, tuple(leaf._replace(value=None) for leaf in self.leaves))

    def unflatten(self, v: Any, mode: str, xp: Any = jnp) -> PyTree:
        """Rebuild the tree from `v`; mode "original" (leaf dtypes), "promote" (float64 and
        complex128, other leaves as they were) or "tangent" (float64/complex128, float0
        zeros for non-perturbable numbers, None for other objects)."""
        out, start = [], 0
        for leaf in self.leaves:
            if leaf.kind is None:
                if mode != "tangent":
                    out.append(leaf.value)
                elif leaf.shape is None:
                    out.append(None)
                else:
                    out.append(np.zeros(leaf.shape, jax.dtypes.float0))
                continue
            chunk = v[start : start + leaf.size]
            start += leaf.size
            if leaf.kind == "complex":
                chunk = chunk[0::2] + 1j * chunk[1::2]
            wide = np.complex128 if leaf.kind == "complex" else np.float64
            dtype = leaf.dtype if mode == "original" else wide
            out.append(xp.reshape(chunk, leaf.shape).astype(dtype))
        return jax.tree_util.tree_unflatten(self.treedef, out)


def _describe(path: str, leaf: Any) -> _Leaf:
    if isinstance(leaf, (bool, int)):
        return _Leaf(path, None, (), np.dtype(type(leaf)), leaf)
    if isinstance(leaf, float):
        return _Leaf(path, "real", (), np.dtype(np.float64), None)
    if isinstance(leaf, complex):
        return _Leaf(path, "complex", (), np.dtype(np.complex128), None)
    dtype, shape = getattr(leaf, "dtype", None), getattr(leaf, "shape", None)
    if dtype is None or shape is None:
        return _Leaf(path, None, None, None, leaf)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        kind = "complex"
    elif jnp.issubdtype(dtype, jnp.floating):
        kind = "real"
    else:
        kind = None
    return _Leaf(path, kind, tuple(shape), np.dtype(dtype), leaf if kind is None else None)


def _layout(tree: PyTree) -> _Layout:
    pairs, treedef = jax.tree_util.tree_flatten_with_path(tree)
    return _Layout(treedef, tuple(_describe(jax.tree_util.keystr(p), leaf) for p, leaf in pairs))


def _vector(tree: PyTree) -> jax.Array:
    leaves = jax.tree_util.tree_leaves(tree)
    if not any(isinstance(leaf, jax.core.Tracer) for leaf in leaves):
        # concrete: in NumPy, one transfer (eager jax.numpy compiles a program per operation)
        return jnp.asarray(_concatenated(leaves, np), jnp.float64)
    return _concatenated(leaves, jnp)


def _concatenated(leaves: list, xp: Any) -> Any:
    """The float and complex leaves raveled into one float64 vector, with `xp` (NumPy or
    jax.numpy); complex leaves as interleaved real and imaginary parts."""
    parts = []
    for leaf in leaves:
        kind = _describe("", leaf).kind
        if kind == "complex":
            z = xp.ravel(xp.asarray(leaf, dtype=xp.complex128))
            parts.append(xp.stack([z.real, z.imag], axis=-1).ravel())
        elif kind == "real":
            parts.append(xp.ravel(xp.asarray(leaf, dtype=xp.float64)))
    if len(parts) == 1:
        return parts[0]
    return xp.concatenate(parts) if parts else xp.zeros((0,), xp.float64)


def to_vec(tree: PyTree) -> tuple[jax.Array, Callable[[Any], PyTree]]:
    """Flatten the float and complex leaves of a pytree into one 1-D float64 vector.

    Leaves are taken in `jax.tree_util` order. Complex leaves contribute interleaved real
    and imaginary parts (`[re z0, im z0, re z1, ...]`). Integer, bool and non-numeric
    leaves are not perturbable: they are left out and `from_vec` puts them back unchanged.

    Args:
      tree: any JAX pytree of arrays and Python numbers.

    Returns:
      `(vector, from_vec)`; `from_vec(v)` rebuilds the tree from a vector (a tracer is
      fine, so it works under `jax.jit` and `jax.vmap`) with the original shapes and dtypes;
      Python floats and complexes come back as 0-d float64 and complex128 arrays.

    >>> v, from_vec = to_vec({"w": jnp.ones(2, jnp.float32), "z": 1 + 2j, "n": 3})
    >>> v
    Array([1., 1., 1., 2.], dtype=float64)
    >>> from_vec(2 * v)
    {'n': 3, 'w': Array([2., 2.], dtype=float32), 'z': Array(2.+4.j, dtype=complex128)}

    See also: fd_jacobian, fd_vjp.
    """
    with _x64("to_vec"):
        layout, vector = _layout(tree), _vector(tree)

    def from_vec(v: Any) -> PyTree:
        if np.shape(v) != (layout.size,):
            raise ValueError(
                f"`from_vec`: expected a vector of shape ({layout.size},), as returned by "
                f"`to_vec`, got shape {np.shape(v)}."
            )
        with _x64("from_vec"):
            return layout.unflatten(jnp.asarray(v), "original")

    return vector, from_vec


# ------------------------------------------------------------------------------------------
# Batched evaluation: f(*args) as R^n -> R^m, one compiled call per batch shape
# ------------------------------------------------------------------------------------------


def _check_tuple(name: str, arg: str, value: Any) -> tuple:
    if not isinstance(value, tuple):
        raise TypeError(
            f"`{name}`: `{arg}` must be a tuple with one entry per argument of f, got "
            f"{type(value).__name__}; wrap a single argument as `(x,)`."
        )
    return value


class _Program:
    """The compiled evaluations of one traced f (a jaxpr), with the jaxpr's constants as
    their first argument: a later trace of the same function to the same jaxpr reuses them,
    and the compilations behind them, with its own constants."""

    def __init__(self, jaxpr: Any):
        self.jaxpr = jaxpr
        self.along = jit(self._along)
        self.rows = jit(self._rows)
        self.reduce = jit(self._reduce)
        self.point = jit(self._point)
        self.basis = jit(self._basis)

    def fun(self, consts: list, v: jax.Array) -> jax.Array:
        return jax.extend.core.jaxpr_as_fun(jax.extend.core.ClosedJaxpr(self.jaxpr, consts))(v)[0]

    def _along(self, consts: list, x: jax.Array, d: jax.Array, ts: jax.Array) -> jax.Array:
        """f at x + ts[k] d for every k, in one vmap: shape (len(ts), len(f))."""
        return jax.vmap(lambda v: self.fun(consts, v))(x[None, :] + ts[:, None] * d[None, :])

    def _rows(self, consts: list, x: jax.Array, displacements: jax.Array) -> jax.Array:
        """f at x + displacements[r] for every row r, in one vmap: shape (rows, len(f)). Points
        along a direction and along every basis direction alike, so that a small problem's
        `fd_jvp` and `fd_vjp` share one compiled evaluation (`_shared_rows`)."""
        return jax.vmap(lambda v: self.fun(consts, v))(x[None, :] + displacements)

    def _reduce(self, consts: list, x: jax.Array, d: jax.Array, t: jax.Array, w: jax.Array) -> tuple[jax.Array, jax.Array]:
        """`<w, y>` and `<|w|, |y|>` for y = f(x + t d): step selection needs no more, and
        reading and writing no output-sized array beyond f's own saves a pass over memory."""
        y = self.fun(consts, x + t * d)
        return jnp.sum(w * y), jnp.sum(jnp.abs(w) * jnp.abs(y))

    def _point(
        self, consts: list, x: jax.Array, d: jax.Array, t: jax.Array, w: jax.Array, y0: jax.Array
    ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
        """f at the one point x + t d, reduced on the device: `<w, y>`, `<|w|, |y|>` and
        `<w, y - y0>` (a difference taken before the sum keeps its accuracy), and y itself."""
        y = self.fun(consts, x + t * d)  # sums of products: XLA fuses them with f, dots it does not
        return jnp.sum(w * y), jnp.sum(jnp.abs(w) * jnp.abs(y)), jnp.sum(w * (y - y0)), y

    def _basis(self, consts: list, x: jax.Array, hs: jax.Array, w: jax.Array | None) -> jax.Array:
        """f (or <w, f> and <|w|, |f|>) at x + hs[i, j] * e_j for all i, j: shape
        (len(hs), len(x), len(f) or 2)."""
        k, n = hs.shape
        points = x[None, None, :] + hs[:, :, None] * jnp.eye(n, dtype=x.dtype)[None]

        def call(v):
            y = self.fun(consts, v)
            # sums of products, not `y @ w`: XLA:CPU compiles a dot ~60 ms slower (per f)
            return y if w is None else jnp.stack([jnp.sum(y * w), jnp.sum(jnp.abs(y) * jnp.abs(w))])

        out = jax.vmap(call)(points.reshape(k * n, n))
        return out.reshape(k, n, *out.shape[1:])


class _Flat:
    """`f(*args)` as a function of the float64 vector `to_vec(args)`, evaluated in batches.

    f is traced once per `_Flat`, when first needed, to a jaxpr that every batched
    evaluation replays; `check_output(layout)` runs then, so a bad output fails before any
    work. A new `_Flat` traces f anew (f as it is now); its evaluations reuse a kept
    compilation only where they lower to the same program (`_compiled.compiled`). `x` stays
    on the device; `x_host` is its NumPy copy, made when first asked for.
    """

    def __init__(self, name: str, f: Callable, args: tuple, check_output: Callable | None = None):
        self.name, self.f, self.check_output = name, f, check_output
        self.layout = _layout(_check_tuple(name, "args", args))
        self.x = _vector(args)
        self._program: _Program | None = None

    @property
    def x_host(self) -> np.ndarray:
        if not hasattr(self, "_x_host"):
            self._x_host = np.asarray(self.x)
        return self._x_host

    def _trace(self) -> _Program:
        if self._program is None:
            try:
                closed, shape = jax.make_jaxpr(self._call, return_shape=True)(self.x)
            except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError) as err:
                raise TypeError(
                    f"`{self.name}`: f cannot be traced by JAX, and finite differences evaluate it "
                    f"under jax.jit and jax.vmap (in float64): {type(err).__name__}: "
                    f"{str(err).splitlines()[0]} Write f with jax.numpy, or run NumPy/SciPy code "
                    "through a host callback: `rules.external(fn, result_shape_dtypes)`."
                ) from err
            self._consts, self._out_size = list(closed.consts), shape.shape[0]
            self._program = _Program(closed.jaxpr)
        return self._program

    @property
    def out(self) -> _Layout:
        """The layout of f's output (traces f if it has not been)."""
        self._trace()
        return self._out

    @property
    def out_size(self) -> int:
        """The length of to_vec(f(*args)) (traces f if it has not been)."""
        self._trace()
        return self._out_size

    def _call(self, v: jax.Array) -> jax.Array:
        y = self.f(*self.layout.unflatten(v, "promote"))
        self._out = _layout(y).without_values()
        if self.check_output is not None:
            self.check_output(self._out)
        return _vector(y)

    def along(self, x: jax.Array, d: jax.Array, ts: Any) -> jax.Array:
        return self._trace().along(self._consts, x, d, ts)

    def reduce(self, x: jax.Array, d: jax.Array, t: Any, w: Any) -> tuple:
        return self._trace().reduce(self._consts, x, d, t, w)

    def point(self, x: jax.Array, d: jax.Array, t: Any, w: Any, y0: Any) -> tuple:
        return self._trace().point(self._consts, x, d, t, w, y0)

    def basis(self, x: jax.Array, hs: Any, w: Any) -> jax.Array:
        return self._trace().basis(self._consts, x, hs, w)

    def rows(self, displacements: np.ndarray) -> np.ndarray:
        """f at x + displacements[r] for every row r, on the host: shape (rows, len(f))."""
        return np.asarray(self._trace().rows(self._consts, self.x, displacements))


def _shared_rows(flat: _Flat, points: int) -> int:
    """The rows of the one evaluation that a small problem's step rules and stencils share,
    along every basis direction (`fd_vjp`, `fd_jacobian`, and the testers' exact J x_dot:
    `test_frule` reuses the compilation of `test_rrule`'s exact check of the same function).
    0 (none shared) where that batch would be large."""
    n = flat.x.size
    rows = points * n
    return rows if 0 < rows and rows * max(n, flat.out_size, 1) <= _VMAP_ELEMENTS else 0


class _Sampler:
    """f along a direction d: the scalar t -> <w, f(x + t d)> with its scale
    <|w|, |f(x + t d)|>, and the stencil's combination of f(x + t d).

    Every small batch is padded to at least `size` points, so that step selection and the
    stencil share one compiled evaluation: one vmap of f, padding included, reduced with
    NumPy. A large one (`points * max(len(x), len(f))` above `_VMAP_ELEMENTS`) runs point
    by point, each point one call of a compiled evaluation that reduces on the device. `d=None`
    is a fixed random unit direction and `w=None` a fixed random unit vector of weights (made
    once per size).
    """

    def __init__(self, flat: _Flat, direction: Any, w: Any, size: int):
        self.flat, self.size = flat, size
        self.direction = _random_unit(flat.x.size, seed=1) if direction is None else direction
        self.w = _random_unit(flat.out_size, seed=0) if w is None else w

    def _padded(self, values: np.ndarray) -> np.ndarray:
        out = np.zeros(max(len(values), self.size))
        out[: len(values)] = values
        return out

    def _large(self, n: int) -> bool:
        flat = self.flat
        return max(n, self.size) * max(flat.x.size, flat.out_size) > _VMAP_ELEMENTS

    def _points(self, ts: np.ndarray) -> np.ndarray:
        """f at x + t d for each t, on the host: shape (len(ts), len(f))."""
        flat = self.flat
        ys = flat.along(flat.x, self.direction, self._padded(ts))
        return np.asarray(ys)[: len(ts)]

    def _each(self, ts: np.ndarray):
        """One compiled call per point; yields its device results, y0 being the first y."""
        flat, y0 = self.flat, None
        for t in ts:
            # the first point's difference is never used: any array of f's size serves as y0
            value, scale, diff, y = flat.point(flat.x, self.direction, np.float64(t), self.w,
                                               self.w if y0 is None else y0)
            y0 = y if y0 is None else y0
            yield value, scale, diff, y

    def __call__(self, ts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`(<w, f(x + t d)>, <|w|, |f(x + t d)|>)` for each t in ts: two (len(ts),) arrays."""
        if self._large(len(ts)):
            flat = self.flat
            pairs = jax.device_get([flat.reduce(flat.x, self.direction, np.float64(t), self.w) for t in ts])
            return np.array([v for v, _ in pairs]), np.array([s for _, s in pairs])
        ys, w = self._points(ts), np.asarray(self.w)
        return ys @ w, np.abs(ys) @ np.abs(w)

    def combine(self, offsets: np.ndarray, weights: np.ndarray, step: float) -> np.ndarray:
        """`sum_k weights[k] (f(x + offsets[k] step d) - f(x + offsets[0] step d)) / step`,
        the stencil's derivative along d: one output-sized vector (exactly 0 for an f that
        does not change)."""
        if not self._large(len(offsets)):
            return _divide(_combine(weights, self._points(offsets * step)), step)
        total, y0 = np.zeros(self.flat.out_size), None
        for c, (_, _, _, y) in zip(weights, self._each(offsets * step)):
            if y0 is None:
                y0 = np.asarray(y)
            else:
                total += c * (np.asarray(y) - y0)
        return _divide(total, step)

    def combine_inner(self, offsets: np.ndarray, weights: np.ndarray, step: float) -> float:
        """`<w, combine(offsets, weights, step)>`, the stencil's derivative of t -> <w, f(x +
        t d)>, reduced on the device for a large batch (nothing output-sized comes back)."""
        if not self._large(len(offsets)):
            combined = np.asarray(self.combine(offsets, weights, step), np.float64)
            return host_dot(np.asarray(self.w, np.float64), combined)
        diffs = jax.device_get([diff for _, _, diff, _ in self._each(offsets * step)])
        return float(_divide(np.dot(weights[1:], diffs[1:]), step))


@functools.lru_cache(maxsize=4)
def _random_unit(n: int, seed: int) -> jax.Array:
    """A fixed pseudo-random unit vector of length n, as a float64 device array; cached, so
    repeated calls with the same size cost nothing (call inside `_x64`)."""
    v = np.random.default_rng(seed).standard_normal(n)
    return jnp.asarray(v / max(float(np.linalg.norm(v)), 1e-300), jnp.float64)


def _check_scalar_input(name: str, x: Any) -> None:
    if np.ndim(x) != 0 or np.iscomplexobj(x):
        raise TypeError(
            f"`{name}`: `x` must be a real scalar, got {type(x).__name__} with shape "
            f"{np.shape(x)}; use fd_jvp or fd_jacobian for arrays and complex numbers."
        )


def _scalar_output_check(name: str) -> Callable[[_Layout], None]:
    """A real scalar output, or an integer (bool) one, which counts as a constant."""

    def check_output(out: _Layout) -> None:
        constant = out.size == 0 and all(leaf.kind is None and leaf.shape == () for leaf in out.leaves)
        if not (out.size == 1 or constant) or len(out.leaves) != 1 or out.leaves[0].kind == "complex":
            raise TypeError(
                f"`{name}`: f must return a real scalar, got (path, shape, kind) "
                f"{[(leaf.path, leaf.shape, leaf.kind) for leaf in out.leaves]}; use fd_jacobian "
                "or fd_jvp for array or complex outputs."
            )

    return check_output


def _scalar_sampler(m: FDMethod, f: Callable, x: Any, name: str, size: int) -> _Sampler:
    _check_scalar_input(name, x)
    flat = _Flat(name, f, (float(x),), _scalar_output_check(name))
    # an integer output is a constant: no entries to weigh, every difference is 0
    return _Sampler(flat, np.ones(1), np.ones(flat.out_size), size)


def _scalar_value(name: str, f: Callable, x: Any) -> float:
    """f(x) itself, evaluated as a plain call (the 0-th derivative)."""
    _check_scalar_input(name, x)
    y = f(jnp.asarray(float(x), jnp.float64))
    _scalar_output_check(name)(_layout(y))
    return float(np.asarray(jax.tree_util.tree_leaves(y)[0]).real)


# ------------------------------------------------------------------------------------------
# Derivatives of pytree functions: jvp, vjp, jacobian
# ------------------------------------------------------------------------------------------


def _check_method(name: str, m: Any, first_order: bool = True) -> None:
    if not isinstance(m, FDMethod):
        raise TypeError(f"`{name}`: `m` must be an FDMethod such as central_fdm(5, 1), got {m!r}.")
    if first_order and m.q != 1:
        raise ValueError(
            f"`{name}`: `m` must estimate a first derivative (q=1), got q={m.q}; use e.g. "
            "central_fdm(5, 1)."
        )


def _check_like(name: str, arg: str, expected: _Layout, got: _Layout, of: str) -> None:
    """Require the same perturbable leaves (path, shape, real/complex) as `expected`."""
    want, have = expected.signature(), got.signature()
    if want != have:
        first = next((a, b) for a, b in zip(want + [None], have + [None]) if a != b)
        raise ValueError(
            f"`{name}`: `{arg}` must match {of} leaf by leaf (path, shape, real/complex) "
            f"for every float and complex leaf; first difference: expected {first[0]}, "
            f"got {first[1]}."
        )


def _basis_values(flat: _Flat, offsets: np.ndarray, steps: np.ndarray, w: Any, rows: int) -> np.ndarray:
    """f at x + offsets[i] * steps[j] * e_j for every i and coordinate j, in one batch: shape
    (len(offsets), x.size, len(f)), or with weights w, (len(offsets), x.size, 2) holding
    <w, f> and its scale <|w|, |f|>. A small batch is padded to `rows` offsets (repeating x
    itself), so that the step rule's batches and the stencil's share one compiled evaluation
    (`_shared_rows`, reduced here); a large one is reduced on the device."""
    k, n = len(offsets), flat.x.size
    shared = _shared_rows(flat, rows)
    if shared and rows >= k:
        hs = np.zeros((rows, n))
        hs[:k] = np.outer(offsets, steps)
        ys = flat.rows((hs[:, :, None] * np.eye(n)[None]).reshape(shared, n))[: k * n]
        if w is not None:
            w_host = np.asarray(w)
            ys = np.stack([ys @ w_host, np.abs(ys) @ np.abs(w_host)], axis=-1)
        return ys.reshape(k, n, ys.shape[-1])
    return np.asarray(flat.basis(flat.x, np.outer(offsets, steps), w))[:k]


def _coordinate_steps(m: FDMethod, flat: _Flat, w: Any, rows: int) -> np.ndarray:
    """One step per input coordinate, each chosen by `m`'s step rule for that coordinate on
    its own, as FiniteDifferences.jl's `jacobian` does: `m`'s bound estimator differences f
    (with w, the scalar <w, f>) along every basis direction e_j in one batch, and each
    coordinate's step minimises its own error bound. Without w the derivative's magnitude
    is the largest over f's entries. One shared step along a random direction would be
    too long for the coordinates where f bends most (their weight in the direction is
    ~1/sqrt(n), their f^(p) along it ~n^(-p/2) smaller)."""
    n, b = flat.x.size, m._bound_estimator
    if b is None or n == 0 or flat.out_size == 0:
        return np.full(n, m._choose_step(0.0, 0.0)[0])
    steps = _coordinate_steps(b, flat, w, rows)
    over = (0, 2) if w is None else (0,)
    bound, scale = np.full(n, np.nan), np.full(n, np.nan)
    todo = np.ones(n, bool)
    for _ in range(_SHRINKS + 1):  # coordinates whose points left f's domain try shorter steps
        out = _basis_values(flat, b._sorted_grid, steps, w, rows)
        values, scales = (out, np.abs(out)) if w is None else (out[..., 0], out[..., 1])
        with np.errstate(invalid="ignore", over="ignore"):  # points outside f's domain: shorter steps below
            derivs = np.abs(np.tensordot(b._neighbour_weights, values - values[:1], axes=1))  # (3, n[, len(f)])
        bound = np.where(todo, _divide(np.max(derivs, axis=over), steps**b.q), bound)
        scale = np.where(todo, np.max(scales, axis=over), scale)
        todo = ~(np.isfinite(bound) & np.isfinite(scale))
        if not todo.any():
            break
        steps = np.where(todo, steps / _SHRINK, steps)
    return m._choose_step(bound, scale)[0]


def _basis_steps(m: FDMethod, flat: _Flat, w: Any, step: float | None, rows: int) -> np.ndarray:
    """One step per input coordinate: `step`, or `_coordinate_steps`; made exact for each."""
    if step is not None:
        return _representable(flat.x_host, _check_step(flat.name, step))
    return _representable(flat.x_host, _coordinate_steps(m, flat, w, rows))


def _per_coordinate(m: FDMethod, flat: _Flat, w: Any, step: float | None) -> np.ndarray:
    """`m`'s derivative along every basis direction, each with its own step: shape (x.size,)
    for the scalar <w, f> (with w), else (x.size, y.size)."""
    rows = m._batch_size() if step is None else len(m._offsets)
    steps = _basis_steps(m, flat, w, step, rows)
    values = _basis_values(flat, m._offsets, steps, w, rows)  # (k, x.size, y.size or 2)
    if w is not None:
        return _divide(_combine(m._weights, values[..., 0]), steps)
    return _divide(_combine(m._weights, values), steps[:, None])


def _along_free(d: Any, held: np.ndarray) -> Any:
    """A direction with no component along the held (non-finite) input coordinates."""
    if not held.any():
        return d
    return jnp.asarray(np.where(held, 0.0, np.asarray(d, np.float64)))


def _split(vector: np.ndarray, args: tuple) -> list[tuple[_Layout, np.ndarray]]:
    """Cut the last axis of `vector` into one piece per argument."""
    out, start = [], 0
    for arg in args:
        layout = _layout(arg)
        out.append((layout, vector[..., start : start + layout.size]))
        start += layout.size
    return out


def fd_jvp(
    m: FDMethod, f: Callable, args: tuple, tangents: tuple, *, step: float | None = None
) -> PyTree:
    """Estimate the Jacobian-vector product `J @ x_dot` of `f` at `args`.

    The stencil points `args + h * g_i * tangents` are evaluated in one jitted call of `f`
    in float64 and combined as `sum_i c_i f(args + h g_i tangents) / h`. Unless `step` is
    given, h is chosen by `m`'s step rule for the scalar `t -> <w, to_vec(f(args + t *
    tangents))>`, w a fixed random unit vector, evaluated by the same compiled call;
    `m.max_range` bounds |h * g_i| in units of `tangents`. Small batches are one `vmap` of
    `f`; a large one (points x size above `_VMAP_ELEMENTS`) is a loop on the device over the
    points actually needed, reduced there, so that only the step rule's scalars and the one
    output-sized result come back.

    Args:
      m: a first-derivative method, e.g. `central_fdm(5, 1)`.
      f: a JAX-traceable function of pytrees returning a pytree.
      args: tuple of arguments of `f`.
      tangents: tuple like `args` (the same float and complex leaves; others are ignored).
      step: a fixed step h instead of the automatic one.

    Returns:
      A pytree like `f(*args)` of numpy float64 (complex128 for complex leaves) arrays;
      non-perturbable output leaves give float0 zeros (numbers) or None.

    >>> y_dot = fd_jvp(central_fdm(5, 1), lambda x: x**2, (jnp.array([1.0, 3.0]),),
    ...                (jnp.array([1.0, 1.0]),))
    >>> y_dot.round(8)
    array([2., 6.])

    See also: fd_vjp, fd_jacobian, to_vec.
    """
    (y_dot,) = _fd_jvps("fd_jvp", m, f, args, [tangents], step)
    return y_dot


def _fd_jvps(
    name: str, m: FDMethod, f: Callable, args: tuple, directions: list, step: float | None,
) -> list[PyTree]:
    """`fd_jvp` along several `tangents` at the same `args`: f is traced once and every
    direction reuses the same compiled evaluation (its direction is an argument), so each
    extra direction costs only its evaluations of f, not another trace and compile. Where
    the stencil leaves f's domain (an output entry not finite), the entry is estimated
    again by `_one_sided`'s methods."""
    _check_method(name, m)
    with _x64(name):
        flat = _Flat(name, f, args)
        vectors = []
        for tangents in directions:
            tangent_layout = _layout(_check_tuple(name, "tangents", tangents))
            _check_like(name, "tangents", flat.layout, tangent_layout, "`args`")
            vectors.append(_vector(tangents))
        held = _held(flat.x_host)
        out = []
        for d in vectors:
            d = _along_free(d, held)

            def along(method: FDMethod, d=d) -> np.ndarray:
                size = method._batch_size() if step is None else len(method._offsets)
                sampler = _Sampler(flat, d, None, size)
                h = method._estimate_step(sampler)[0] if step is None else _check_step(name, step)
                return sampler.combine(method._offsets, method._weights, h)

            # the output's entries: one-sided where the central stencil left f's domain
            y_dot = _in_domain(m, along, np.zeros(flat.out_size, bool))
            out.append(flat.out.unflatten(y_dot, "tangent", np))
        return out


def _fd_jvp_by_coordinates(m: FDMethod, f: Callable, args: tuple, tangents: tuple) -> PyTree:
    """`J x_dot` from the Jacobian of f along every input coordinate, each with its own
    step (as `fd_jacobian`), for the testers' exact checks of small problems: more accurate
    than one step along x_dot where the coordinates' scales differ (a point near a
    boundary, where another coordinate is not), and the same compiled evaluation as
    `fd_vjp`'s at that function and point."""
    name = "fd_jvp"
    _check_method(name, m)
    with _x64(name):
        flat = _Flat(name, f, _check_tuple(name, "args", args))
        _check_like(name, "tangents", flat.layout, _layout(_check_tuple(name, "tangents", tangents)), "`args`")
        held = _held(flat.x_host)
        jac = _in_domain(m, lambda method: _per_coordinate(method, flat, None, None), held)  # (x.size, y.size)
        d = np.where(held, 0.0, np.asarray(_vector(tangents), np.float64))
        return flat.out.unflatten(d @ jac, "tangent", np)


def _weights_for(name: str, y_bar: PyTree) -> tuple[jax.Array, Callable[[_Layout], None]]:
    """`to_vec(y_bar)` as weights on f's output, and the check that f's output matches it."""
    w_layout = _layout(y_bar)

    def check_output(out: _Layout) -> None:
        _check_like(name, "y_bar", out, w_layout, "the output of f(*args)")

    return _vector(y_bar), check_output


def _fd_inner_jvps(
    name: str, m: FDMethod, f: Callable, args: tuple, directions: list, y_bar: PyTree
) -> list[float]:
    """`<y_bar, J x_dot>` (the real inner product of `to_vec`s) for each `x_dot` in
    `directions`: the derivative at 0 of the scalar t -> <y_bar, f(args + t x_dot)>, its step
    chosen by `m`'s rule for that scalar. One trace and one compile of f serve every
    direction, and a large batch brings back only scalars: nothing output-sized leaves the
    device."""
    _check_method(name, m)
    with _x64(name):
        w, check_output = _weights_for(name, y_bar)
        flat = _Flat(name, f, args, check_output)
        held = _held(flat.x_host)
        out = []
        for tangents in directions:
            _check_like(name, "tangents", flat.layout, _layout(_check_tuple(name, "tangents", tangents)), "`args`")
            d = _along_free(_vector(tangents), held)

            def inner(method: FDMethod, d=d) -> np.ndarray:
                sampler = _Sampler(flat, d, w, method._batch_size(lean=True))
                h = method._estimate_step(sampler, lean=True)[0]
                return np.array([sampler.combine_inner(method._offsets, method._weights, h)])

            out.append(float(_in_domain(m, inner, np.zeros(1, bool))[0]))
        return out


def fd_jacobian(
    m: FDMethod, f: Callable, *args: Any, step: float | None = None
) -> tuple[np.ndarray, ...]:
    """Estimate the Jacobian of `f` at `args`, one matrix per argument.

    Sizes are in `to_vec` units, so a complex entry counts twice (real, imaginary part).
    All `x.size * len(stencil)` points are evaluated in one jitted `vmap` of `f` in float64.
    Each coordinate gets its own step, as in FiniteDifferences.jl: `step`, or `m`'s step rule
    for f along that coordinate (the largest derivative over f's entries; one more batched
    evaluation of `len(m's bound grid)` points per coordinate), made exact for it.

    Args:
      m: a first-derivative method, e.g. `central_fdm(5, 1)`.
      f: a JAX-traceable function of pytrees returning a pytree.
      *args: the arguments of `f`.
      step: a fixed step h instead of the automatic one.

    Returns:
      A tuple with one numpy float64 matrix of shape `(y.size, x.size)` per argument,
      where `y = to_vec(f(*args))[0]` and `x = to_vec(arg)[0]`.

    >>> (jac,) = fd_jacobian(central_fdm(5, 1), lambda x: x**2, jnp.array([1.0, 3.0]))
    >>> jac.round(8)
    array([[2., 0.],
           [0., 6.]])

    See also: fd_jvp, fd_vjp, to_vec.
    """
    name = "fd_jacobian"
    _check_method(name, m)
    with _x64(name):
        flat = _Flat(name, f, args)
        jac = _in_domain(m, lambda method: _per_coordinate(method, flat, None, step), _held(flat.x_host)).T
    return tuple(part for _, part in _split(jac, args))


def fd_vjp(
    m: FDMethod, f: Callable, y_bar: PyTree, args: tuple, *, step: float | None = None
) -> tuple:
    """Estimate the vector-Jacobian product `J^T y_bar` of `f` at `args`.

    Differences the scalar `l(x) = <to_vec(y_bar), to_vec(f(x))>` (a real inner product)
    along every basis direction of `to_vec(args)`, in one jitted `vmap` of `f` in float64.
    A complex leaf z gets `dl/dRe z + 1j * dl/dIm z` (ChainRules' convention; `jax.vjp`
    with `conj(y_bar)` gives its conjugate). Each coordinate gets its own step: `step`, or
    `m`'s step rule for l along that coordinate (one more batched evaluation), so that an
    ill-conditioned coordinate gets the short step it needs.

    Args:
      m: a first-derivative method, e.g. `central_fdm(5, 1)`.
      f: a JAX-traceable function of pytrees returning a pytree.
      y_bar: a cotangent like `f(*args)` (the same float and complex leaves).
      args: tuple of arguments of `f`.
      step: a fixed step h instead of the automatic one.

    Returns:
      A tuple with one cotangent per argument, in the argument's pytree structure, of numpy
      float64/complex128 arrays; non-perturbable leaves give float0 zeros (numbers) or None.

    >>> (x_bar,) = fd_vjp(central_fdm(5, 1), lambda x: x**2, jnp.array([1.0, 10.0]),
    ...                   (jnp.array([1.0, 3.0]),))
    >>> x_bar.round(8)
    array([ 2., 60.])

    See also: fd_jvp, fd_jacobian, to_vec.
    """
    name = "fd_vjp"
    _check_method(name, m)
    with _x64(name):
        w, check_output = _weights_for(name, y_bar)
        flat = _Flat(name, f, args, check_output)
        x_bar = _in_domain(m, lambda method: _per_coordinate(method, flat, w, step), _held(flat.x_host))
        return tuple(layout.unflatten(part, "tangent", np) for layout, part in _split(x_bar, args))
