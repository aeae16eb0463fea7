"""FiniteDifferences.jl's methods: a grid, exact coefficients, the choice of step, extrapolation.

A method `m = central_fdm(p, q)` holds a stencil with exact coefficients. `m(f, x)` picks a
step for a scalar function as FiniteDifferences.jl does (the p-th derivative estimated by a
method of p + 2 points around x) and evaluates the stencil; `extrapolate_fdm` refines an
estimate by Richardson extrapolation. Differencing pytree functions with these methods
(`fd_jvp`, `fd_vjp`, `fd_jacobian`, `to_vec`) is `_finite_differences`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import operator
from fractions import Fraction
from typing import TYPE_CHECKING, Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

if TYPE_CHECKING:
    from ._finite_differences import _Sampler

__all__ = ["FDMethod", "central_fdm", "forward_fdm", "backward_fdm", "extrapolate_fdm"]


def _scalar(name: str) -> Callable:
    """`_finite_differences`'s `_scalar_sampler` or `_scalar_value`: a method evaluates a scalar
    f by the same batched evaluator as the pytree differences (imported when first called:
    that module imports this one)."""
    from . import _finite_differences

    return getattr(_finite_differences, name)


_EPS = float(np.finfo(np.float64).eps)
_CONDITION = 10.0  # assumed bound on |f^(p)| when no derivative is estimated (adapt=0)
_MAX_STEP_FACTOR = 1000.0  # a chosen step never exceeds this multiple of the default step
# Where the derivative estimate that sets the step is not finite (its points left f's domain),
# its step shrinks by this factor, up to this many times, before the default step is used.
_SHRINK, _SHRINKS = 10.0, 3


def _x64(name: str):
    """A context in which float64 exists, whatever the global `jax_enable_x64` says."""
    enable = getattr(jax, "enable_x64", None)
    if enable is not None:
        return enable(True)
    if not jax.config.jax_enable_x64:
        raise RuntimeError(f"`{name}` differences in float64, but float64 is disabled in this JAX; call "
                           "`jax.config.update('jax_enable_x64', True)` before using finite differences.")
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


# ----- Methods: a grid, exact coefficients, and the choice of step ----------------------------


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
        grid = self._checked_grid()
        exact = _exact_coefs(grid, self.q)
        set_ = object.__setattr__
        for field, value in (("grid", grid), ("exact_coefs", exact), ("coefs", tuple(float(c) for c in exact))):
            set_(self, field, value)
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

    def _checked_grid(self) -> tuple[int, ...]:
        """The method's grid, after checking its parameters (errors name the constructor)."""
        name = self._name
        if self.kind not in ("central", "forward", "backward", "custom"):
            raise ValueError(f"`FDMethod`: `kind` must be 'central', 'forward', 'backward' or 'custom', "
                             f"got {self.kind!r}.")
        for arg in ("p", "q", "adapt"):
            value = getattr(self, arg)
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"`{name}`: `{arg}` must be an int, got {value!r}.")
        if self.q < 0:
            raise ValueError(f"`{name}`: the derivative order `q` must be >= 0, got q={self.q}.")
        if self.p <= self.q:
            example = "FDMethod.from_grid((-1, 0, 1), 1)" if self.kind == "custom" else f"{name}({self.q + 2}, {self.q})"
            raise ValueError(f"`{name}`: need more grid points than the derivative order (p > q), got "
                             f"p={self.p}, q={self.q}; use p >= {self.q + 1}, e.g. {example}.")
        if self.adapt < 0:
            raise ValueError(f"`{name}`: `adapt` must be >= 0, got {self.adapt}.")
        if not self.max_range >= 0:
            raise ValueError(f"`{name}`: `max_range` must be >= 0, got {self.max_range!r}.")
        if not 0 < self.factor < math.inf:
            raise ValueError(f"`{name}`: `factor` must be positive and finite, got {self.factor!r}.")
        if self.kind != "custom":
            if self.custom_grid is not None:
                raise ValueError(f"`{name}`: only kind 'custom' takes a grid; use FDMethod.from_grid.")
            return _make_grid(self.kind, self.p)
        if self.custom_grid is None or len(self.custom_grid) != self.p:
            raise ValueError(f"`{name}`: a custom method needs its grid of p={self.p} points.")
        return self.custom_grid

    @classmethod
    def from_grid(cls, grid: Any, q: int, *, adapt: int = 0, max_range: float = math.inf,
                  factor: float = 1.0) -> FDMethod:
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
        extras = "".join(f", {k}={getattr(self, k)!r}" for k, default in (("max_range", math.inf), ("factor", 1.0))
                         if getattr(self, k) != default)
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
                return _scalar("_scalar_value")(name, f, x)
            sampler = _scalar("_scalar_sampler")(self, f, x, name, self._batch_size() if step is None else 0)
            step = self._estimate_step(sampler)[0] if step is None else _check_step(name, step)
            step = float(_representable(sampler.flat.x_host[0], step))
            values, _ = sampler(self._offsets * step)
            return float(self._estimate(values, step))

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
            return self._estimate_step(_scalar("_scalar_sampler")(self, f, x, name, self._batch_size()))

    @property
    def _name(self) -> str:
        return "FDMethod.from_grid" if self.kind == "custom" else f"{self.kind}_fdm"

    # -- step selection; `sampler(ts)` returns f and |f| scales at x + ts (one batch) --

    @functools.cached_property
    def _bound_estimators(self) -> tuple[FDMethod | None, FDMethod | None]:
        """The methods estimating f^(p) for the step: p + 2 points (FiniteDifferences.jl), and
        p + 1 (lean: one evaluation of f fewer, for the testers' fast mode on large inputs)."""
        if self.adapt == 0:
            return None, None
        kind = _kind_of(self.grid) if self.kind == "custom" else self.kind
        p, q, adapt, r, factor = self.p, self.p, self.adapt - 1, self.max_range, self.factor
        return FDMethod(kind, p + 2, q, adapt, r, factor), FDMethod(kind, p + 1, q, adapt, r, factor)

    def _bound_of(self, lean: bool = False) -> FDMethod | None:
        return self._bound_estimators[lean]

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

    def _error_exponents(self, count: int) -> list[int]:
        """Powers of h in the error expansion: k - q for each k >= p with sum c g^k != 0."""
        exponents: list[int] = []
        k = self.p
        while len(exponents) < count:
            if sum(c * Fraction(g) ** k for g, c in zip(self.grid, self.exact_coefs)) != 0:
                exponents.append(k - self.q)
            k += 1
        return exponents


def central_fdm(p: int, q: int, *, adapt: int = 1, max_range: float = math.inf, factor: float = 1.0) -> FDMethod:
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


def forward_fdm(p: int, q: int, *, adapt: int = 1, max_range: float = math.inf, factor: float = 1.0) -> FDMethod:
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


def backward_fdm(p: int, q: int, *, adapt: int = 1, max_range: float = math.inf, factor: float = 1.0) -> FDMethod:
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


# ----- Richardson extrapolation ---------------------------------------------------------------


def extrapolate_fdm(m: FDMethod, f: Callable, x: Any, *, h0: float | None = None, contract: float = 0.125,
                    breaktol: float = math.inf, rtol: float = 0.0, atol: float = 0.0,
                    max_eval: int = 10) -> tuple[float, float]:
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
        sampler = _scalar("_scalar_sampler")(m, f, x, name, 0)
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
    return _neville(estimates, noise, m._error_exponents(max_eval - 1), contract, rtol, atol, breaktol)


def _neville(estimates: np.ndarray, noise: np.ndarray, exponents: list[int], contract: float,
             rtol: float, atol: float, breaktol: float) -> tuple[float, float]:
    """`extrapolate_fdm`'s tableau: row i eliminates the powers `exponents` of the step from
    the estimates at steps contracted i times; returns the entry with the smallest error
    estimate (see `extrapolate_fdm` for when the walk stops)."""
    best, best_err = float(estimates[0]), math.inf
    previous = [estimates[0]]
    for i in range(1, len(estimates)):
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


def _check_method(name: str, m: Any, first_order: bool = True) -> None:
    if not isinstance(m, FDMethod):
        raise TypeError(f"`{name}`: `m` must be an FDMethod such as central_fdm(5, 1), got {m!r}.")
    if first_order and m.q != 1:
        raise ValueError(f"`{name}`: `m` must estimate a first derivative (q=1), got q={m.q}; "
                         "use e.g. central_fdm(5, 1).")
