"""Implicit parameters: `Params` (arrays held by mutable Python objects) and `Grads`.

`Params(model)` walks the model (attributes, lists, dicts, and tuples or registered pytrees
inside them) and records every *slot* holding a floating array: a mutable container and a
key. To differentiate `f()` with respect to those arrays, the arrays in their slots are
swapped for JAX tracers while `f` is traced, and the original objects are put back
afterwards (in a `finally`, so also when `f` raises). The explicit form,
`gradient(loss, params, x, y)` with `params` a pytree, needs none of this and is the
recommended one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import types
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from ._errors import GradientError, message

__all__ = ["Params", "Grads"]

_NOT_WALKED = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType)


def _is_param(x: Any) -> bool:
    return isinstance(x, (jax.Array, np.ndarray)) and bool(jnp.issubdtype(x.dtype, jnp.inexact))


def _has_attributes(x: Any) -> bool:
    """A mutable object whose attributes are walked (not a class, module, function or frozen dataclass)."""
    if isinstance(x, _NOT_WALKED + (jax.Array, np.ndarray)) or not hasattr(x, "__dict__"):
        return False
    params = getattr(x, "__dataclass_params__", None)
    return not (dataclasses.is_dataclass(x) and params is not None and params.frozen)


class _Slot:
    """A place holding parameters: `container[key]` or `container.key`.

    `positions` is None when the slot holds one parameter directly, else it maps leaf
    positions of the (immutable) pytree held there to parameter indices.
    """

    def __init__(self, container: Any, key: Any, index: int | None, positions: dict[int, int] | None):
        self.container, self.key, self.index, self.positions = container, key, index, positions

    def get(self) -> Any:
        if isinstance(self.container, (list, dict)):
            return self.container[self.key]
        return getattr(self.container, self.key)

    def set(self, value: Any) -> None:
        if isinstance(self.container, (list, dict)):
            self.container[self.key] = value
        else:
            setattr(self.container, self.key, value)

    def where(self) -> str:
        key = f"[{self.key!r}]" if isinstance(self.container, (list, dict)) else f".{self.key}"
        return f"{type(self.container).__name__}{key}"

    def replaced(self, current: Any, originals: list, values: list) -> Any:
        """What the slot holds with its parameters replaced by `values` (checking they are still there)."""
        if self.positions is None:
            self._check(current, originals[self.index])
            return values[self.index]
        leaves, treedef = jax.tree_util.tree_flatten(current)
        for pos, i in self.positions.items():
            self._check(leaves[pos] if pos < len(leaves) else None, originals[i])
            leaves[pos] = values[i]
        return jax.tree_util.tree_unflatten(treedef, leaves)

    def _check(self, found: Any, expected: Any) -> None:
        if found is not expected:
            raise GradientError(
                message(
                    f"`Params`: the array at {self.where()} was replaced since the Params were collected",
                    expected="the array that `Params(...)` found there",
                    got="another object",
                    fix="collect the parameters again (`Params(model)`), or write new arrays with `ps.update`",
                )
            )


class Params:
    """The floating arrays held by mutable Python objects, for implicit differentiation.

    Zygote's `Params`: `gradient(lambda: loss(model, x, y), Params(model))` returns a
    `Grads` indexed by the original arrays (`gs[model.weight]`). Arrays are found through
    attributes, lists, dicts and nested objects, and through tuples and registered pytrees
    held by them; each array counts once, by identity. The loss must read the arrays from
    those objects when it runs. The explicit form `gradient(loss, params, x, y)`, with
    `params` a pytree, is simpler and recommended.

    Args:
      *roots: the objects to search (a model, a list of layers, ...).

    Raises:
      GradientError: if a root is itself an array (it has no place to be swapped in).

    >>> import jax.numpy as jnp, zygote_jax
    >>> class Affine:
    ...     def __init__(self):
    ...         self.w, self.b = jnp.array([2.0, 3.0]), jnp.array(1.0)
    >>> m = Affine()
    >>> ps = zygote_jax.Params(m)
    >>> gs = zygote_jax.gradient(lambda: jnp.sum(m.w * jnp.array([1.0, 2.0])) + m.b, ps)
    >>> gs[m.w], gs[m.b]
    (Array([1., 2.], dtype=float64), Array(1., dtype=float64))
    >>> ps.update(gs, lambda p, g: p - 0.5 * g)
    >>> m.w
    Array([1.5, 2. ], dtype=float64)

    See also: `Grads`, `gradient`, `withgradient`.
    """

    def __init__(self, *roots: Any):
        self._arrays: list[Any] = []
        self._index: dict[int, int] = {}
        self._slots: list[_Slot] = []
        seen: set[int] = set()
        for root in roots:
            if _is_param(root):
                raise GradientError(
                    message(
                        "`Params(x)`: an array given directly cannot be swapped for a tracer",
                        expected="objects that hold the arrays (a model, a list or dict of arrays)",
                        got=f"an array {root.dtype}{list(root.shape)}",
                        fix="differentiate the array explicitly: `gradient(loss, x)`",
                    )
                )
            self._walk(root, seen)

    # ----- collection ------------------------------------------------------------------------
    def _add(self, x: Any) -> int:
        if id(x) not in self._index:
            self._index[id(x)] = len(self._arrays)
            self._arrays.append(x)
        return self._index[id(x)]

    def _walk(self, obj: Any, seen: set[int]) -> None:
        if id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, list):
            items = list(enumerate(obj))
        elif isinstance(obj, dict):
            items = list(obj.items())
        elif _has_attributes(obj):
            items = list(vars(obj).items())
        else:
            return
        for key, value in items:
            self._visit(obj, key, value, seen)

    def _visit(self, container: Any, key: Any, value: Any, seen: set[int]) -> None:
        if _is_param(value):
            self._slots.append(_Slot(container, key, self._add(value), None))
        elif isinstance(value, (list, dict)) or _has_attributes(value):
            self._walk(value, seen)
        else:  # an immutable pytree (tuple, NamedTuple, frozen dataclass...) or a leaf
            positions = {}
            for pos, leaf in enumerate(jax.tree_util.tree_leaves(value)):
                if _is_param(leaf):
                    positions[pos] = self._add(leaf)
                elif leaf is not value:
                    self._walk(leaf, seen)
            if positions:
                self._slots.append(_Slot(container, key, None, positions))

    # ----- the collection's face ---------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._arrays)

    def __iter__(self) -> Iterator[Any]:
        return iter(list(self._arrays))

    def __getitem__(self, i: int) -> Any:
        return self._arrays[i]

    def __contains__(self, x: Any) -> bool:
        return id(x) in self._index and self._arrays[self._index[id(x)]] is x

    def __repr__(self) -> str:
        return "Params([" + ", ".join(f"{a.dtype}[{','.join(map(str, a.shape))}]" for a in self._arrays) + "])"

    # ----- substitution --------------------------------------------------------------------------
    @contextlib.contextmanager
    def substituted(self, values: list) -> Iterator[None]:
        """Put `values` in the places of the parameters; restore the original objects on exit."""
        saved: list[tuple[_Slot, Any]] = []
        try:
            for slot in self._slots:
                current = slot.get()
                new = slot.replaced(current, self._arrays, values)
                saved.append((slot, current))
                slot.set(new)
            yield
        finally:
            for slot, current in reversed(saved):
                slot.set(current)

    def update(self, grads: "Grads", fn: Callable[[Any, Any], Any]) -> None:
        """Write `fn(p, grads[p])` in place of every parameter `p` (e.g. an SGD step).

        Parameters whose gradient is `None` are left alone. The `Params` then holds the new
        arrays, so it can be used for the next gradient.
        """
        new = [p if grads.get(p) is None else fn(p, grads[p]) for p in self._arrays]
        for slot in self._slots:
            slot.set(slot.replaced(slot.get(), self._arrays, new))
        self._arrays = new
        self._index = {id(a): i for i, a in enumerate(new)}


class Grads:
    """Gradients of implicit parameters, indexed by the parameter arrays themselves.

    `gs[p]` is the gradient of the array `p` (looked up by identity); `keys()` are the
    parameters, `values()` the gradients, `items()` pairs; iteration goes over the keys.

    >>> import jax.numpy as jnp, zygote_jax
    >>> model = {"w": jnp.array([1.0, 2.0])}
    >>> gs = zygote_jax.gradient(lambda: jnp.sum(model["w"] ** 2), zygote_jax.Params(model))
    >>> gs[model["w"]]
    Array([2., 4.], dtype=float64)
    >>> len(gs), model["w"] in gs
    (1, True)

    See also: `Params`, `gradient`.
    """

    def __init__(self, params: list, grads: list):
        self._params, self._grads = list(params), list(grads)
        self._index = {id(p): i for i, p in enumerate(self._params)}

    def __getitem__(self, p: Any) -> Any:
        i = self._index.get(id(p))
        if i is None or self._params[i] is not p:
            raise KeyError(
                message(
                    "`Grads[p]`: p is not one of the parameters",
                    expected="one of the arrays collected by `Params` (looked up by identity)",
                    got=f"{type(p).__name__}",
                    fix="index with the array object held by the model, e.g. `gs[model.weight]`",
                )
            )
        return self._grads[i]

    def get(self, p: Any, default: Any = None) -> Any:
        return self[p] if p in self else default

    def __contains__(self, p: Any) -> bool:
        i = self._index.get(id(p))
        return i is not None and self._params[i] is p

    def __iter__(self) -> Iterator[Any]:
        return iter(self._params)

    def __len__(self) -> int:
        return len(self._params)

    def keys(self) -> list:
        return list(self._params)

    def values(self) -> list:
        return list(self._grads)

    def items(self) -> list[tuple[Any, Any]]:
        return list(zip(self._params, self._grads))

    def __repr__(self) -> str:
        return f"Grads({len(self)} parameters)"
