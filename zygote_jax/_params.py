"""Implicit parameters: `Params` (arrays held by mutable Python objects) and `Grads`.

`Params(model)` walks the model (attributes, lists, dicts, flax nnx `Param` variables, and
tuples or registered pytrees inside them) and records every *slot* holding a floating array:
a mutable container and a key. To differentiate `f()` with respect to those arrays, the
arrays in their slots are swapped for JAX tracers while `f` is traced, and the original
objects are put back afterwards (in a `finally`, so also when `f` raises). Arrays given
directly (`Params([m.w, m.b])`) are located once, when the `Params` is built, by identity,
through the garbage collector's referrer lists. One process-wide re-entrant lock serialises
all swaps. The explicit form, `gradient(loss, params, x, y)` with `params` a pytree, needs
none of this and is the recommended one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import sys
import threading
import types
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from ._errors import GradientError, describe, message

__all__ = ["Params", "Grads"]

_NOT_WALKED = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType)
_LOCK = threading.RLock()  # held while tracers are in slots, and while slots are walked or written
_SLOT_TYPE = types.MemberDescriptorType
_EXPLICIT = "use the explicit form `zygote_jax.gradient(loss, model)` with `loss(model)`"


class _Own(list):
    """A list of this module's (the arrays of a `Params` or `Grads`): never a place to swap in."""


def _is_param(x: Any) -> bool:
    return isinstance(x, (jax.Array, np.ndarray)) and bool(jnp.issubdtype(x.dtype, jnp.inexact))


def _is(x: Any, module: str, name: str) -> bool:
    """`isinstance(x, module.name)` if that library is imported (it is when `x` is one of its objects)."""
    cls = getattr(sys.modules.get(module), name, None)
    return cls is not None and isinstance(x, cls)


def _is_variable(x: Any) -> bool:
    return _is(x, "flax.nnx", "Variable")


def _is_jax_internal(x: Any) -> bool:
    return type(x).__module__.split(".")[0] in ("jax", "jaxlib")


def _is_immutable_object(x: Any) -> bool:
    """A frozen dataclass or an equinox module: a pytree whose attributes cannot be set."""
    params = getattr(x, "__dataclass_params__", None)
    return (dataclasses.is_dataclass(x) and params is not None and params.frozen) or _is(x, "equinox", "Module")


def _has_attributes(x: Any) -> bool:
    """A mutable object whose attributes are walked (not a class, module, function or frozen object)."""
    if isinstance(x, _NOT_WALKED + (jax.Array, np.ndarray)) or not hasattr(x, "__dict__"):
        return False
    return not _is_immutable_object(x)


def _flatten(tree: Any) -> tuple[list, Any]:
    """Leaves and structure of an immutable pytree, stopping at the mutable objects in it (walked)."""
    return jax.tree_util.tree_flatten(tree, is_leaf=lambda x: x is not tree and (_has_attributes(x) or _is_variable(x)))


def _key(p: Any) -> Any:
    """What `gs[p]` looks up: a flax nnx Variable stands for the array it holds."""
    return p.get_raw_value() if _is_variable(p) else p


def _error(what: str, expected: str, got: str, fix: str) -> GradientError:
    return GradientError(message(f"`Params`: {what}", expected=expected, got=got, fix=fix))


class _Slot:
    """A place holding parameters: `container[key]`, `container.key` or an nnx Variable's value.

    `positions` is None when the slot holds one parameter directly, else it maps leaf
    positions of the (immutable) pytree held there to parameter indices.
    """

    def __init__(self, container: Any, key: Any, index: int | None, positions: dict[int, int] | None):
        self.container, self.key, self.index, self.positions = container, key, index, positions

    def get(self) -> Any:
        if isinstance(self.container, (list, dict)):
            return self.container[self.key]
        return self.container.get_raw_value() if _is_variable(self.container) else getattr(self.container, self.key)

    def set(self, value: Any) -> None:
        if isinstance(self.container, (list, dict)):
            self.container[self.key] = value
        elif _is_variable(self.container):
            # nnx refuses writes from inside a trace (TraceContextError) so that tracers cannot
            # leak into Variables; this one is undone before the trace ends.
            object.__setattr__(self.container, "_raw_value", value)
        else:
            setattr(self.container, self.key, value)

    def where(self) -> str:
        c = self.container
        if isinstance(c, (list, dict)):
            return f"{type(c).__name__}[{self.key!r}]"
        if isinstance(c, types.CellType) or _is_variable(c):
            return "a closure variable" if isinstance(c, types.CellType) else f"an nnx {type(c).__name__} variable"
        return f"{c.__name__ if isinstance(c, (type, types.ModuleType)) else type(c).__name__}.{self.key}"

    def replaced(self, current: Any, originals: list, values: list) -> Any:
        """What the slot holds with its parameters replaced by `values` (checking they are still there)."""
        if self.positions is None:
            assert self.index is not None  # one parameter held directly: its index is set
            self._check(current, originals[self.index])
            return values[self.index]
        leaves, treedef = _flatten(current)
        for pos, i in self.positions.items():
            self._check(leaves[pos] if pos < len(leaves) else None, originals[i])
            leaves[pos] = values[i]
        return jax.tree_util.tree_unflatten(treedef, leaves)

    def _check(self, found: Any, expected: Any) -> None:
        if found is not expected:
            raise _error(
                f"the array at {self.where()} was replaced since the Params were collected",
                expected="the array that `Params(...)` found there",
                got="another object",
                fix="collect the parameters again (`Params(model)`), or write new arrays with `ps.update`",
            )


# ----- locating arrays given directly -------------------------------------------------------------
def _locate(given: list, ignore: set[int]) -> list[tuple[Any, Any, Any]]:
    """`(container, key, value)` for every place, found by `gc`, that holds one of `given`.

    Frames (plain locals are not readable by a loss), argument tuples held by nothing, and
    JAX's own containers are skipped; a holder where nothing can be swapped is an error.
    """
    wanted = {id(v): v for v in given}
    # the argument tuples of the gc calls hold what they ask about: made here (a tuple passed
    # as *args is passed as it is) and ignored, as Python 3.12+ tracks them
    given_args = tuple(given)
    ignore = ignore | {id(wanted), id(given_args)}
    skipped = (types.FrameType, _Own)
    holders = [r for r in gc.get_referrers(*given_args) if id(r) not in ignore and not isinstance(r, skipped)]
    containers = tuple(r for r in holders if isinstance(r, (list, dict, tuple)))
    ignore |= {id(holders), id(containers)}
    owners: dict[int, list] = {id(c): [] for c in containers}
    for o in gc.get_referrers(*containers) if containers else ():
        if id(o) not in ignore and not isinstance(o, types.FrameType):
            referents = {id(r) for r in gc.get_referents(o)}
            for c in containers:
                if id(c) in referents:
                    owners[id(c)].append(o)
    return [place for ref in holders for place in _held_by(ref, wanted, owners.get(id(ref), []))]


def _held_by(ref: Any, wanted: dict[int, Any], owners: list) -> list[tuple[Any, Any, Any]]:
    """The places in `ref` holding wanted values, as `(container, key, value)`."""
    if isinstance(ref, (list, dict)):
        hits: list[tuple[Any, Any]] = [
            (k, v) for k, v in (ref.items() if isinstance(ref, dict) else enumerate(ref)) if id(v) in wanted
        ]
        for o in owners:  # the `__dict__` of an object, module or class: write through setattr
            if _dict_of(o) is ref or isinstance(o, type) and all(vars(o).get(k) is v for k, v in hits):
                if _is_jax_internal(o):
                    return []
                if _is_immutable_object(o):
                    raise _unwritable(o, hits[0][1])
                return [(o, k, v) for k, v in hits]
        return [] if owners and all(map(_is_jax_internal, owners)) else [(ref, k, v) for k, v in hits]
    if isinstance(ref, types.CellType):
        return [(ref, "cell_contents", ref.cell_contents)]
    if _is_variable(ref):
        return [(ref, "_raw_value", ref.get_raw_value())]
    if _is_jax_internal(ref) or isinstance(ref, tuple) and all(map(_is_jax_internal, owners)):
        return []  # JAX's own, or a call's argument tuple (held by no object)
    if not isinstance(ref, tuple) and not _is_immutable_object(ref):
        attributes = dict(_dict_of(ref) or {})
        for slots in (getattr(c, "__slots__", ()) for c in type(ref).__mro__):
            attributes.update((n, getattr(ref, n, None)) for n in ([slots] if isinstance(slots, str) else slots))
        places = [(ref, n, v) for n, v in attributes.items() if id(v) in wanted]
        if places:
            return places
    raise _unwritable(ref, next((v for v in gc.get_referents(ref) if id(v) in wanted), None))


def _dict_of(o: Any) -> Any:
    try:
        return object.__getattribute__(o, "__dict__")
    except Exception:  # noqa: BLE001 -- no instance dictionary
        return None


def _unwritable(holder: Any, value: Any) -> GradientError:
    kind = type(holder).__name__
    return _error(
        f"the {describe(value)} given directly is also held by a {kind}, where no tracer can be swapped in "
        "(the loss could read it there and get no gradient)",
        expected="arrays held by mutable objects, lists, dicts, module globals or closure variables",
        got=f"a {kind} holding it",
        fix=f"pass the object that holds it (`Params(model)`, `Params([model])`), or {_EXPLICIT}",
    )


class Params:
    """The floating arrays held by mutable Python objects, for implicit differentiation.

    Zygote's `Params`: `gradient(lambda: loss(model, x, y), Params(model))` returns a
    `Grads` indexed by the original arrays (`gs[model.weight]`). Arrays are found through
    attributes, lists, dicts and nested objects, and through tuples and registered pytrees
    held by them; each array counts once, by identity. The loss must read the arrays from
    those objects when it runs. The explicit form `gradient(loss, params, x, y)`, with
    `params` a pytree, is simpler and recommended.

    Arrays given directly (`Params([m.w, m.b])`, `Params(m.w)`) are parameters as in Zygote:
    the places holding them (attributes, dict and list items, globals, closure variables)
    are found by identity when `Params` is built (a heap scan: build it once); one also held
    where no tracer can go (a tuple, a frozen object) is an error, never a zero gradient.
    A flax nnx module contributes its `nnx.Param` variables, as `nnx.grad` does; index with
    the Variable or its array (`gs[model.kernel]`). An equinox module is immutable: pass it
    explicitly (held by a mutable object, it is rebuilt there).

    Threads: a process-wide lock serialises `Params` gradients, so concurrent ones are
    correct; code outside `gradient` reading the model meanwhile sees tracers.

    Args:
      *roots: the objects to search (a model, a list of layers, arrays held elsewhere...).

    Raises:
      GradientError: for an equinox module, or an array also held where no tracer can go.

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
    >>> zygote_jax.gradient(lambda: jnp.sum(m.w ** 2), zygote_jax.Params([m.w]))[m.w]
    Array([3., 4.], dtype=float64)

    See also: `Grads`, `gradient`, `withgradient`.
    """

    def __init__(self, *roots: Any):
        self._arrays: list[Any] = _Own()
        self._index: dict[int, int] = {}
        self._slots: list[_Slot] = []
        self._slot_keys: set[tuple[int, Any]] = set()
        seen: set[int] = set()
        given: list = []  # arrays (or immutable pytrees of them) given directly
        with _LOCK:
            for root in roots:
                self._collect_root(root, seen, given)
            if given:
                ignore = {id(roots), id(given)} | {id(r) for r in roots if isinstance(r, tuple)}
                places = _locate(given, ignore)
                for container, key, value in places:
                    self._record(container, key, value)
                missing = {id(v) for v in given} - {id(value) for _, _, value in places}
                if missing:
                    value = next(v for v in given if id(v) in missing)
                    raise _error(
                        "found no place holding an array given directly, so no place to swap in a tracer",
                        expected="an array held by an object, a list, a dict or a closure variable the loss reads",
                        got=f"{describe(value)} held by nothing but the `Params(...)` call (or a tuple given to it)",
                        fix="differentiate it explicitly: `gradient(loss, x)`, or pass the object that holds it",
                    )

    # ----- collection ------------------------------------------------------------------------
    def _add(self, x: Any) -> int:
        if id(x) not in self._index:
            self._index[id(x)] = len(self._arrays)
            self._arrays.append(x)
        return self._index[id(x)]

    def _collect_root(self, root: Any, seen: set[int], given: list) -> None:
        """Walk a root; a list, tuple or dict root holds its items directly (`Params([m.w, m.b])`)."""
        if isinstance(root, (list, dict, tuple)):
            seen.add(id(root))
            items = list(root.items()) if isinstance(root, dict) else list(enumerate(root))
        else:
            items = [(None, root)]
        for key, value in items:
            if _is(value, "equinox", "Module"):
                raise _error(
                    f"{type(value).__name__} is an equinox module, an immutable pytree, so its arrays "
                    "cannot be swapped for tracers in place",
                    expected="mutable objects holding the arrays (attributes, lists, dicts, flax nnx modules)",
                    got=f"equinox module {type(value).__qualname__}",
                    fix=f"{_EXPLICIT}, or `equinox.filter_grad(loss)(model)`",
                )
            if isinstance(value, (list, dict)) or _has_attributes(value) or _is_variable(value):
                self._walk(value, seen)
            elif any(_is_param(leaf) for leaf in _flatten(value)[0]):
                given.append(value)
                if isinstance(root, (list, dict)):
                    self._record(root, key, value)

    def _walk(self, obj: Any, seen: set[int]) -> None:
        if id(obj) in seen:
            return
        seen.add(id(obj))
        if _is_variable(obj):
            if _is(obj, "flax.nnx", "Param"):
                self._record(obj, "_raw_value", obj.get_raw_value())
            return
        if isinstance(obj, list):
            items = list(enumerate(obj))
        elif isinstance(obj, dict):
            items = list(obj.items())
        elif _has_attributes(obj):
            items = [(k, v) for k, v in vars(obj).items() if not k.startswith("_pytree__")]  # nnx bookkeeping
        else:
            return
        for key, value in items:
            self._visit(obj, key, value, seen)

    def _visit(self, container: Any, key: Any, value: Any, seen: set[int]) -> None:
        if isinstance(value, (list, dict)) or _has_attributes(value) or _is_variable(value):
            return self._walk(value, seen)
        if not _is(container, "flax.nnx", "Pytree"):  # in nnx modules only the Param variables count
            self._record(container, key, value)  # an array, an immutable pytree (tuple...) or a leaf
        for leaf in _flatten(value)[0]:
            if leaf is not value and not _is_param(leaf):
                self._walk(leaf, seen)

    def _record(self, container: Any, key: Any, value: Any) -> None:
        """A slot for `value` (an array or a pytree holding some) at `container[key]` / `.key`."""
        if (id(container), key) in self._slot_keys:
            return
        if _is_variable(container) and not isinstance(getattr(type(container), "_raw_value", None), _SLOT_TYPE):
            raise _error(
                "this flax version keeps nnx Variable values in an unknown place",
                expected="the `Variable._raw_value` slot (flax 0.12)",
                got=f"{type(container).__name__} without it",
                fix=_EXPLICIT,
            )
        if _is_param(value):
            slot = _Slot(container, key, self._add(value), None)
        else:
            positions = {pos: self._add(leaf) for pos, leaf in enumerate(_flatten(value)[0]) if _is_param(leaf)}
            if not positions:
                return
            slot = _Slot(container, key, None, positions)
        self._slot_keys.add((id(container), key))
        self._slots.append(slot)

    # ----- the collection's face ---------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._arrays)

    def __iter__(self) -> Iterator[Any]:
        return iter(list(self._arrays))

    def __getitem__(self, i: int) -> Any:
        return self._arrays[i]

    def __contains__(self, x: Any) -> bool:
        x = _key(x)
        return id(x) in self._index and self._arrays[self._index[id(x)]] is x

    def __repr__(self) -> str:
        return "Params([" + ", ".join(f"{a.dtype}[{','.join(map(str, a.shape))}]" for a in self._arrays) + "])"

    # ----- substitution --------------------------------------------------------------------------
    @contextlib.contextmanager
    def substituted(self, values: list) -> Iterator[None]:
        """Put `values` in the places of the parameters; restore the original objects on exit."""
        with _LOCK:
            saved: list[tuple[_Slot, Any]] = []
            try:
                for slot in self._slots:
                    current = slot.get()
                    new = slot.replaced(current, self._arrays, values)
                    try:
                        slot.set(new)
                    except Exception as err:
                        raise _error(
                            f"cannot swap a tracer in at {slot.where()}",
                            expected="a place that can be written while the loss is traced",
                            got=f"{type(err).__name__}: {err}",
                            fix=f"pass the objects that hold the arrays, or {_EXPLICIT}",
                        ) from err
                    saved.append((slot, current))
                yield
            finally:
                for slot, current in reversed(saved):
                    slot.set(current)

    def update(self, grads: "Grads", fn: Callable[[Any, Any], Any]) -> None:
        """Write `fn(p, grads[p])` in place of every parameter `p` (e.g. an SGD step).

        Parameters whose gradient is `None` are left alone. The `Params` then holds the new
        arrays, so it can be used for the next gradient.
        """
        with _LOCK:
            new = [p if grads.get(p) is None else fn(p, grads[p]) for p in self._arrays]
            for slot in self._slots:
                slot.set(slot.replaced(slot.get(), self._arrays, new))
            self._arrays = _Own(new)
            self._index = {id(a): i for i, a in enumerate(new)}


class Grads:
    """Gradients of implicit parameters, indexed by the parameter arrays themselves.

    `gs[p]` is the gradient of the array `p`, looked up by identity (a flax nnx Variable
    stands for the array it holds), or None when the function did not read `p` (Zygote's
    `nothing`; a function that reads none of its parameters is an error, as it can only have
    read copies); `keys()` are the parameters, `values()` the gradients, `items()` pairs;
    iteration goes over the keys.

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
        self._params, self._grads = _Own(params), list(grads)
        self._index = {id(p): i for i, p in enumerate(self._params)}

    def __getitem__(self, p: Any) -> Any:
        if p not in self:
            raise KeyError(
                message(
                    "`Grads[p]`: p is not one of the parameters",
                    expected="one of the arrays collected by `Params` (looked up by identity)",
                    got=f"{type(p).__name__}",
                    fix="index with the array object held by the model, e.g. `gs[model.weight]`",
                )
            )
        return self._grads[self._index[id(_key(p))]]

    def get(self, p: Any, default: Any = None) -> Any:
        return self[p] if p in self else default

    def __contains__(self, p: Any) -> bool:
        p = _key(p)
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
