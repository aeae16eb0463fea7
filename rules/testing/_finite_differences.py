"""Finite differences of pytree functions, batched with JAX: `to_vec`, `fd_jvp`, `fd_vjp`, `fd_jacobian`.

The methods (`central_fdm` and the others, FiniteDifferences.jl's) are `_fdm`. `fd_jvp` picks
a step for its direction by the method's rule, `fd_vjp` and `fd_jacobian` one per input
coordinate. They difference any pytree function through `to_vec`, evaluating the whole
stencil in one jitted call: each call traces f anew, and `_compiled.jit` reuses a
compilation only for the same program. Everything runs in float64, whatever
`jax_enable_x64` says globally. Where a central stencil leaves f's domain (a non-finite
estimate at a finite point), `_in_domain` estimates again with shorter spans and one-sided
stencils; infinite and NaN inputs are held constant. How the evaluation is batched, and
why: rules/testing/README.md.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, NamedTuple

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np

from ._compare import host_dot
from ._compiled import jit
from ._fdm import (
    _SHRINK, _SHRINKS, FDMethod, _check_method, _check_step, _combine, _divide, _representable, _x64, backward_fdm,
    central_fdm, extrapolate_fdm, forward_fdm
)

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
# A batch of points along a direction with up to this many elements (points x the larger of
# input and output size) is one vmap of f, brought to the host and reduced there; a larger
# one is evaluated point by point, reduced on the device (why: rules/testing/README.md).
_VMAP_ELEMENTS = 2**17


def _held(x: np.ndarray) -> np.ndarray:
    """The input coordinates that are not perturbed: infinite or NaN entries (x + h is x
    again, or NaN), which finite differences treat as constants (derivative 0)."""
    return ~np.isfinite(x)


# Spans (largest |h * grid|) tried, largest first, where a method's stencil left f's domain.
_DOMAIN_SPANS = (1e-2, 1e-4, 1e-6, 1e-8, 1e-10, 1e-12)


def _sided(m: FDMethod, span: float | None = None) -> list[FDMethod]:
    """FiniteDifferences.jl's forward and backward methods of a central method's order, their
    span capped at `span` (default m's own); none for a one-sided or custom method."""
    if m.kind != "central":
        return []
    r = m.max_range if span is None else span
    return [FDMethod(kind, m.p, m.q, m.adapt, r, m.factor) for kind in ("forward", "backward")]


def _shorter_spans(m: FDMethod, x: np.ndarray) -> list[FDMethod]:
    """m with its span capped ever shorter (`_DOMAIN_SPANS` below its own), as long as the
    inputs still resolve it: 2^16 spacings of the largest finite |x| at least (README)."""
    floor = 2.0**16 * np.spacing(np.max(np.abs(x[np.isfinite(x)]), initial=0.0))
    return [dataclasses.replace(m, max_range=r) for r in _DOMAIN_SPANS if floor <= r < m.max_range]


def _one_sided(m: FDMethod) -> list[FDMethod]:
    """Methods tried, in order, where a central method's estimate is not finite at a point
    (its stencil left f's domain: `logit` near 0, `sqrt` near 0): the same method with its
    span capped ever shorter (its step rule then sees f on the scale of the boundary's
    distance), then the forward and backward methods (`_sided`), the same way (a point on
    the boundary itself). None for a one-sided or custom method, which is the user's choice."""
    if m.kind != "central":
        return []
    spans = [r for r in _DOMAIN_SPANS if r < m.max_range]
    sided = [_sided(m, r) for r in (m.max_range, *spans)]
    shorter = [FDMethod("central", m.p, m.q, m.adapt, r, m.factor) for r in spans]
    return shorter + [forward for forward, _ in sided] + [backward for _, backward in sided]


def _finite_rows(a: np.ndarray) -> np.ndarray:
    """Whether each entry along the first axis is finite in every other axis."""
    return np.isfinite(a).reshape(a.shape[0], -1).all(axis=1) if a.size else np.ones(a.shape[:1], bool)


def _in_domain(m: FDMethod, estimate: Callable[[FDMethod], np.ndarray], held: np.ndarray) -> np.ndarray:
    """`estimate(m)`, an array whose first axis runs over the entries `held` describes, with
    each non-finite entry replaced by the first finite one of `_one_sided(m)`'s methods
    (evaluated only where needed), and each held entry 0."""
    out = np.array(estimate(m), copy=True)
    bad = ~_finite_rows(out) & ~held
    for other in (_one_sided(m) if bad.any() else []):
        if not bad.any():
            break
        alt = np.asarray(estimate(other))
        good = bad & _finite_rows(alt)
        out[good] = alt[good]
        bad &= ~good
    out[held] = 0
    return out


# ----- Pytrees as vectors. Complex numbers are interleaved: z -> [re z_0, im z_0, re z_1, ...]. ---


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
            raise ValueError(f"`from_vec`: expected a vector of shape ({layout.size},), as returned by `to_vec`, "
                             f"got shape {np.shape(v)}.")
        with _x64("from_vec"):
            return layout.unflatten(jnp.asarray(v), "original")

    return vector, from_vec


# ----- Batched evaluation: f(*args) as R^n -> R^m, one compiled call per batch shape ----------


def _check_tuple(name: str, arg: str, value: Any) -> tuple:
    if not isinstance(value, tuple):
        raise TypeError(f"`{name}`: `{arg}` must be a tuple with one entry per argument of f, got "
                        f"{type(value).__name__}; wrap a single argument as `(x,)`.")
    return value


class _Program:
    """The compiled evaluations of one traced f (a jaxpr), the jaxpr's constants their first
    argument: another trace to the same program reuses the compilations (`_compiled.jit`)."""

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
        """f at x + displacements[r] for every row r, in one vmap: shape (rows, len(f))."""
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
        """f at x + hs[i, j] * e_j for all i, j: shape (len(hs), len(x), len(f)); with w,
        (len(hs), len(x), 2) holding <w, f - f_0j> (f_0j at the first row's point: a
        difference taken before the sum keeps its accuracy) and <|w|, |f|>."""
        k, n = hs.shape
        points = x[None, None, :] + hs[:, :, None] * jnp.eye(n, dtype=x.dtype)[None]
        ys = jax.vmap(lambda v: self.fun(consts, v))(points.reshape(k * n, n))
        ys = ys.reshape(k, n, ys.shape[-1])
        if w is None:
            return ys
        w = w[None, None]  # sums of products, not `y @ w`: XLA:CPU compiles a dot ~60 ms slower (per f)
        return jnp.stack([jnp.sum((ys - ys[:1]) * w, -1), jnp.sum(jnp.abs(ys) * jnp.abs(w), -1)], -1)


class _Flat:
    """`f(*args)` as a function of the float64 vector `to_vec(args)`, evaluated in batches:
    traced once per `_Flat` (f as it is now; `check_output(layout)` runs then) to a jaxpr
    that every batch replays, reusing a kept compilation only of the same lowered program
    (`_compiled.compiled`). `x` stays on the device; `x_host` is its NumPy copy."""

    def __init__(self, name: str, f: Callable, args: tuple, check_output: Callable | None = None):
        self.name, self.f, self.check_output = name, f, check_output
        self.layout = _layout(_check_tuple(name, "args", args))
        self.x = _vector(args)
        self._program: _Program | None = None

    @functools.cached_property
    def x_host(self) -> np.ndarray:
        return np.asarray(self.x)

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
    """f along a direction d: t -> <w, f(x + t d)> with its scale <|w|, |f(x + t d)|>, and the
    stencil's combination of f(x + t d). A small batch is padded to `size` points, so step
    selection and stencil share one compiled vmap of f, reduced with NumPy; a large one
    (above `_VMAP_ELEMENTS`) runs point by point, reduced on the device. `d=None`, `w=None`:
    fixed random unit vectors."""

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


def _random_unit(n: int, seed: int) -> jax.Array:
    """A fixed pseudo-random unit vector of length n, as a float64 device array (call inside
    `_x64`)."""
    v = np.random.default_rng(seed).standard_normal(n)
    return jnp.asarray(v / max(float(np.linalg.norm(v)), 1e-300), jnp.float64)


def _check_scalar_input(name: str, x: Any) -> None:
    if np.ndim(x) != 0 or np.iscomplexobj(x):
        raise TypeError(f"`{name}`: `x` must be a real scalar, got {type(x).__name__} with shape "
                        f"{np.shape(x)}; use fd_jvp or fd_jacobian for arrays and complex numbers.")


def _scalar_output_check(name: str) -> Callable[[_Layout], None]:
    """A real scalar output, or an integer (bool) one, which counts as a constant."""

    def check_output(out: _Layout) -> None:
        constant = out.size == 0 and all(leaf.kind is None and leaf.shape == () for leaf in out.leaves)
        if not (out.size == 1 or constant) or len(out.leaves) != 1 or out.leaves[0].kind == "complex":
            raise TypeError(f"`{name}`: f must return a real scalar, got (path, shape, kind) "
                            f"{[(leaf.path, leaf.shape, leaf.kind) for leaf in out.leaves]}; use fd_jacobian "
                            "or fd_jvp for array or complex outputs.")

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


# ----- Derivatives of pytree functions: jvp, vjp, jacobian ------------------------------------


def _check_like(name: str, arg: str, expected: _Layout, got: _Layout, of: str) -> None:
    """Require the same perturbable leaves (path, shape, real/complex) as `expected`."""
    want, have = expected.signature(), got.signature()
    if want != have:
        first = next((a, b) for a, b in zip(want + [None], have + [None]) if a != b)
        raise ValueError(f"`{name}`: `{arg}` must match {of} leaf by leaf (path, shape, real/complex) for every "
                         f"float and complex leaf; first difference: expected {first[0]}, got {first[1]}.")


def _basis_values(flat: _Flat, offsets: np.ndarray, steps: np.ndarray, w: Any, rows: int) -> np.ndarray:
    """f at x + offsets[i] * steps[j] * e_j for every i and coordinate j, in one batch: shape
    (len(offsets), x.size, len(f)), or with weights w, (len(offsets), x.size, 2) holding
    <w, f - f_0j> (f_0j at the first offset's point) and <|w|, |f|>. A small batch is padded
    to `rows` offsets (repeating x), so the step rule's batches and the stencil's share one
    compiled evaluation (`_shared_rows`); a large one is reduced on the device."""
    k, n = len(offsets), flat.x.size
    shared = _shared_rows(flat, rows)
    if shared and rows >= k:
        hs = np.zeros((rows, n))
        hs[:k] = np.outer(offsets, steps)
        ys = flat.rows((hs[:, :, None] * np.eye(n)[None]).reshape(shared, n))[: k * n]
        ys = ys.reshape(k, n, ys.shape[-1])
        if w is not None:
            w_host = np.asarray(w)
            ys = np.stack([(ys - ys[:1]) @ w_host, np.abs(ys) @ np.abs(w_host)], axis=-1)
        return ys
    return np.asarray(flat.basis(flat.x, np.outer(offsets, steps), w))[:k]


def _coordinate_steps(m: FDMethod, flat: _Flat, w: Any, rows: int) -> np.ndarray:
    """One step per input coordinate, each by `m`'s step rule for that coordinate alone (as
    FiniteDifferences.jl's `jacobian`): the bound estimator differences f (with w, <w, f>;
    without, the largest entry) along every e_j in one batch. One step along a random
    direction would be too long where f bends most (its f^(p) along it ~n^(-p/2) smaller)."""
    n, b = flat.x.size, m._bound_of()
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


def _per_coordinate(m: FDMethod, flat: _Flat, w: Any, step: float | None) -> np.ndarray:
    """`m`'s derivative along every basis direction, each with its own step: shape (x.size,)
    for the scalar <w, f> (with w), else (x.size, y.size)."""
    rows = m._batch_size() if step is None else len(m._offsets)
    wanted = _coordinate_steps(m, flat, w, rows) if step is None else _check_step(flat.name, step)
    steps = _representable(flat.x_host, wanted)  # made exact for each coordinate
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


def fd_jvp(m: FDMethod, f: Callable, args: tuple, tangents: tuple, *, step: float | None = None) -> PyTree:
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
    return _fd_jvps("fd_jvp", m, f, args, [tangents], step)[0]


def _fd_jvps(name: str, m: FDMethod, f: Callable, args: tuple, directions: list, step: float | None) -> list[PyTree]:
    """`fd_jvp` along several `tangents` at the same `args`: f is traced once and every
    direction reuses the same compiled evaluation (its direction is an argument), so each
    extra direction costs only its evaluations of f, not another trace and compile. Where
    the stencil leaves f's domain (an output entry not finite), the entry is estimated
    again by `_one_sided`'s methods."""
    _check_method(name, m)
    with _x64(name):
        flat = _Flat(name, f, args)
        vectors = []
        for tangents in directions:  # every direction checked before any is evaluated
            _check_like(name, "tangents", flat.layout, _layout(_check_tuple(name, "tangents", tangents)), "`args`")
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


def _fd_inner_jvps(name: str, m: FDMethod, f: Callable, args: tuple, directions: list, y_bar: PyTree) -> list[float]:
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


def fd_jacobian(m: FDMethod, f: Callable, *args: Any, step: float | None = None) -> tuple[np.ndarray, ...]:
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


def fd_vjp(m: FDMethod, f: Callable, y_bar: PyTree, args: tuple, *, step: float | None = None) -> tuple:
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
