"""`ProjectTo`: map a cotangent onto the tangent space of its primal.

JAX does not check cotangent dtypes, so every cotangent that crosses into JAX passes
through `project_leaf`: float32 stays float32, real primals drop the imaginary part,
complex primals accept real cotangents, shapes must match up to dimensions of size 1.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from ._errors import ProjectionError, format_message
from ._notimplemented import NotImplementedTangent
from ._tangent import Tangent, _from_store, children_with_names
from ._thunks import AbstractThunk, Thunk, unthunk
from ._zeros import AbstractZero, NoTangent

__all__ = ["ProjectTo", "project_leaf", "tangent_dtype", "is_differentiable_leaf"]

ArrayTypes = (jax.Array, np.ndarray, np.generic)


def tangent_dtype(x: Any) -> np.dtype | None:
    """The dtype of x's cotangents, or None when x cannot be perturbed (bool, str, ...)."""
    if isinstance(x, bool) or isinstance(x, np.bool_):
        return None
    if isinstance(x, ArrayTypes):
        dtype = np.dtype(x.dtype)
        if jnp.issubdtype(dtype, jnp.inexact):
            return dtype
        if jnp.issubdtype(dtype, jnp.integer):
            return np.dtype(jax.dtypes.canonicalize_dtype(jnp.float64))
        return None
    if isinstance(x, int):
        return np.dtype(jax.dtypes.canonicalize_dtype(jnp.float64))
    if isinstance(x, float):
        return np.dtype(jax.dtypes.canonicalize_dtype(jnp.float64))
    if isinstance(x, complex):
        return np.dtype(jax.dtypes.canonicalize_dtype(jnp.complex128))
    return None


def is_differentiable_leaf(x: Any) -> bool:
    """True for the leaves JAX differentiates: inexact arrays and Python floats/complex."""
    if isinstance(x, ArrayTypes):
        return bool(jnp.issubdtype(x.dtype, jnp.inexact))
    return isinstance(x, (float, complex))


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


def project_leaf(dx: Any, dtype: np.dtype, shape: tuple[int, ...], where: str | Callable[[], str]) -> Any:
    """Project an array-like cotangent onto (dtype, shape).

    `where` names the place for error messages (a string, or a callable building it, so the
    description costs nothing unless an error is raised).
    """
    dx = jnp.asarray(dx) if not isinstance(dx, jax.Array) else dx
    if jnp.iscomplexobj(dx) and not jnp.issubdtype(dtype, jnp.complexfloating):
        dx = jnp.real(dx)
    if dx.dtype != dtype:
        dx = dx.astype(dtype)
    if dx.shape != shape:
        if math.prod(dx.shape) == math.prod(shape) and _squeezed(dx.shape) == _squeezed(shape):
            dx = dx.reshape(shape)
        else:
            raise ProjectionError(
                format_message(
                    f"{where() if callable(where) else where}: the cotangent's shape does not match the primal's",
                    expected=f"shape {shape} (dtype {np.dtype(dtype).name})",
                    got=f"shape {tuple(dx.shape)} (dtype {dx.dtype.name})",
                    fix="return a cotangent of the primal's shape: sum over broadcast dimensions "
                    "(e.g. `jnp.sum(dx, axis=0)`) or reshape it",
                )
            )
    return dx


class ProjectTo:
    """`ProjectTo(x)(dx)`: `dx` made a valid cotangent for `x`.

    Captures only x's structure, shapes and dtypes (never x itself), so it is cheap to keep
    in a pullback's closure (`project_x = ProjectTo(x)`).

    * inexact arrays and Python floats/complex: dtype preserved (float32 stays float32), a
      real primal drops the imaginary part, shape checked (dimensions of size 1 may be
      reshaped); integer primals get the default float dtype, as ChainRules treats integers
      as reals (the JAX lowering never differentiates ints: those cotangents are dropped);
    * bools, strings, None, callables and other objects: `NoTangent()`;
    * pytrees: projected leaf by leaf, for `Tangent`s and for cotangents of the primal's structure;
    * `ZeroTangent`/`NoTangent`/`NotImplementedTangent` pass; thunks stay lazy.

    >>> import jax.numpy as jnp
    >>> from rules import ProjectTo
    >>> ProjectTo(jnp.ones(2, jnp.float32))(jnp.array([1 + 2j, 3 - 1j]))
    Array([1., 3.], dtype=float32)
    >>> ProjectTo(True)(1.0)
    NoTangent()

    Raises:
      ProjectionError: the cotangent's shape or structure cannot be matched to the primal's.

    See also: `Tangent`, `rules.testing.test_rrule`.
    """

    __slots__ = ("kind", "dtype", "shape", "children", "rebuild", "primal_type", "names", "__weakref__")

    def __init__(self, x: Any):
        self.children = None
        if isinstance(x, AbstractZero) or x is None:
            self.kind = "none"
            return
        dtype = tangent_dtype(x)
        if dtype is not None:
            self.kind, self.dtype, self.shape = "array", dtype, tuple(np.shape(x))
            return
        split = None if isinstance(x, (str, bytes)) or callable(x) else children_with_names(x)
        if split is None:
            self.kind = "none"
            return
        pairs, self.rebuild = split
        self.kind = "tree"
        self.primal_type = type(x)
        self.names = [name for name, _ in pairs]
        self.children = [ProjectTo(child) for _, child in pairs]

    def __repr__(self) -> str:
        if self.kind == "array":
            return f"ProjectTo(dtype={self.dtype.name}, shape={self.shape})"
        if self.kind == "tree":
            assert self.children is not None  # set with kind "tree"
            return f"ProjectTo({self.primal_type.__name__}, {dict(zip(self.names, self.children))})"
        return "ProjectTo(NoTangent)"

    def __call__(self, dx: Any) -> Any:
        if isinstance(dx, (AbstractZero, NotImplementedTangent)):
            return dx if self.kind != "none" else NoTangent()
        if isinstance(dx, AbstractThunk):
            return Thunk(lambda: self(unthunk(dx)))
        if self.kind == "none":
            return NoTangent()
        if self.kind == "array":
            if isinstance(dx, Tangent) or not _array_like(dx):
                raise ProjectionError(
                    format_message(
                        "ProjectTo: an array primal needs an array cotangent",
                        expected=f"an array of shape {self.shape} and dtype {self.dtype.name}",
                        got=f"{type(dx).__name__}",
                    )
                )
            return project_leaf(dx, self.dtype, self.shape, "ProjectTo")
        return self._project_tree(dx)

    def _project_tree(self, dx: Any) -> Any:
        children = self.children
        assert children is not None  # set with kind "tree"
        projectors = dict(zip(self.names, children))
        if isinstance(dx, Tangent):
            if not _same_family(dx.primal_type, self.primal_type):
                raise ProjectionError(
                    format_message(
                        f"ProjectTo({self.primal_type.__name__}): the Tangent belongs to another type",
                        expected=f"Tangent[{self.primal_type.__name__}]",
                        got=f"Tangent[{getattr(dx.primal_type, '__name__', dx.primal_type)}]",
                    )
                )
            store = dict(dx.items())
            unknown = [k for k in store if k not in projectors]
            if unknown:
                raise ProjectionError(
                    format_message(
                        f"ProjectTo({self.primal_type.__name__}): the Tangent has unknown fields",
                        expected=f"fields among {self.names}",
                        got=f"{list(store)}",
                    )
                )
            projected = {k: projectors[k](v) for k, v in store.items()}
            if isinstance(dx._backing, tuple):
                return Tangent(dx.primal_type, *(projected[i] for i in range(len(projected))))
            return _from_store(dx.primal_type, projected)
        split = children_with_names(dx)
        if split is None or [n for n, _ in split[0]] != self.names:
            raise ProjectionError(
                format_message(
                    f"ProjectTo({self.primal_type.__name__}): the cotangent's structure differs from the primal's",
                    expected=f"a Tangent or a {self.primal_type.__name__} with fields {self.names}",
                    got=f"{type(dx).__name__}",
                )
            )
        pairs, rebuild = split
        return rebuild([p(child) for p, (_, child) in zip(children, pairs)])


def _same_family(tangent_type: Any, primal_type: type) -> bool:
    """A Tangent of `tangent_type` may describe a primal of `primal_type`."""
    return isinstance(tangent_type, type) and (
        issubclass(primal_type, tangent_type) or issubclass(tangent_type, primal_type)
    )


def _array_like(x: Any) -> bool:
    return isinstance(x, (*ArrayTypes, int, float, complex)) and not isinstance(x, bool)
