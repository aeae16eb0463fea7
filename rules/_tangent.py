"""`Tangent`: the structural tangent of a tuple, NamedTuple, dict, dataclass or pytree.

Fields that are not stored read as `ZeroTangent()`. `primal + tangent` rebuilds the primal
with each field moved along its tangent.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from ._errors import TangentStructureError, format_message
from ._thunks import unthunk
from ._zeros import AbstractZero, ZeroTangent

__all__ = ["Tangent", "backing", "canonicalize", "children_with_names", "known_fields"]


def known_fields(primal_type: type) -> tuple[str, ...] | None:
    """The field names of a NamedTuple or dataclass type; None when the type does not fix them."""
    if isinstance(primal_type, type) and issubclass(primal_type, tuple) and hasattr(primal_type, "_fields"):
        return tuple(primal_type._fields)
    if dataclasses.is_dataclass(primal_type):
        return tuple(f.name for f in dataclasses.fields(primal_type))
    return None


class Tangent:
    """Structural tangent of a value of type `primal_type`.

    `Tangent(P, **fields)` for NamedTuples, dataclasses, str-keyed dicts and attribute
    pytrees; `Tangent(P, *items)` for tuples and lists; `Tangent(dict, mapping)` for dicts.

    >>> from typing import NamedTuple
    >>> from rules import Tangent, ZeroTangent
    >>> class Point(NamedTuple):
    ...     x: float
    ...     y: float
    >>> t = Tangent(Point, x=1.0)
    >>> t.y
    ZeroTangent()
    >>> Point(1.0, 2.0) + t
    Point(x=2.0, y=2.0)
    >>> t + Tangent(Point, y=3.0) == Tangent(Point, x=1.0, y=3.0)
    True

    See also: `canonicalize`, `backing`, `ProjectTo`.
    """

    __slots__ = ("primal_type", "_backing")
    __array_ufunc__ = None
    __array_priority__ = 1000

    def __init__(self, primal_type: type, *items: Any, **fields: Any):
        if items and fields:
            raise TypeError(
                f"`Tangent({getattr(primal_type, '__name__', primal_type)}, ...)` takes either "
                "positional items (tuples) or keyword fields (structs), not both."
            )
        object.__setattr__(self, "primal_type", primal_type)
        if isinstance(primal_type, type) and issubclass(primal_type, Mapping):
            if len(items) == 1 and isinstance(items[0], Mapping):
                value: Any = dict(items[0])
            elif items:
                raise TypeError("`Tangent(dict, mapping)` takes one mapping, or keyword fields.")
            else:
                value = dict(fields)
        elif items:
            value = tuple(items)
        else:
            value = dict(fields)
            allowed = known_fields(primal_type)
            unknown = [name for name in value if allowed is not None and name not in allowed]
            if allowed is not None and unknown:
                raise TangentStructureError(
                    format_message(
                        f"`Tangent({primal_type.__name__}, ...)`: unknown field(s) {unknown}",
                        expected=f"fields of {primal_type.__name__}: {list(allowed)}",
                        got=f"{list(value)}",
                        fix="use the primal type's field names (missing fields read as ZeroTangent())",
                    )
                )
        object.__setattr__(self, "_backing", value)

    def __setattr__(self, name, value):
        raise AttributeError("`Tangent` is immutable; build a new one (e.g. with `+`).")

    # ----- access -----------------------------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        store = object.__getattribute__(self, "_backing")
        if isinstance(store, dict):
            if name in store:
                return unthunk(store[name])
            allowed = known_fields(self.primal_type)
            if allowed is None or name in allowed:
                return ZeroTangent()
        raise AttributeError(
            f"`Tangent[{getattr(self.primal_type, '__name__', self.primal_type)}]` has no field {name!r}"
        )

    def __getitem__(self, key: Any) -> Any:
        store = self._backing
        if isinstance(store, tuple):
            return unthunk(store[key])
        return unthunk(store.get(key, ZeroTangent()))

    def __iter__(self):
        store = self._backing
        if isinstance(store, tuple):
            return (unthunk(v) for v in store)
        return (unthunk(v) for v in store.values())

    def __len__(self) -> int:
        return len(self._backing)

    def items(self):
        store = self._backing
        pairs = enumerate(store) if isinstance(store, tuple) else store.items()
        return [(k, unthunk(v)) for k, v in pairs]

    def __repr__(self) -> str:
        name = getattr(self.primal_type, "__name__", repr(self.primal_type))
        store = self._backing
        if isinstance(store, tuple):
            inner = ", ".join(repr(v) for v in store)
        else:
            inner = ", ".join(f"{k}={v!r}" if isinstance(k, str) else f"{k!r}: {v!r}" for k, v in store.items())
        return f"Tangent[{name}]({inner})"

    # ----- algebra ----------------------------------------------------------------------
    def _map(self, fn) -> "Tangent":
        store = self._backing
        if isinstance(store, tuple):
            return Tangent(self.primal_type, *(fn(v) for v in store))
        return _from_store(self.primal_type, {k: fn(v) for k, v in store.items()})

    def _check_same_type(self, other: "Tangent", op: str) -> None:
        if other.primal_type is not self.primal_type:
            raise TangentStructureError(
                format_message(
                    f"`Tangent` {op}: the two tangents belong to different primal types",
                    expected=f"Tangent[{getattr(self.primal_type, '__name__', self.primal_type)}]",
                    got=f"Tangent[{getattr(other.primal_type, '__name__', other.primal_type)}]",
                    fix="combine tangents of the same primal type only",
                )
            )

    def __add__(self, other: Any) -> Any:
        if isinstance(other, AbstractZero):
            return self
        other = unthunk(other)
        if isinstance(other, Tangent):
            self._check_same_type(other, "addition")
            a, b = self._backing, other._backing
            if isinstance(a, tuple):
                if len(a) != len(b):
                    raise TangentStructureError(
                        format_message(
                            "`Tangent` addition: tuple tangents of different lengths",
                            expected=f"{len(a)} items",
                            got=f"{len(b)} items",
                        )
                    )
                return Tangent(self.primal_type, *(x + y for x, y in zip(a, b)))
            merged = dict(a)
            for key, value in b.items():
                merged[key] = merged[key] + value if key in merged else value
            return _from_store(self.primal_type, merged)
        if isinstance(other, AbstractZero):
            return self
        return rebuild_primal(other, self)

    def __radd__(self, other: Any) -> Any:
        if isinstance(other, AbstractZero):
            return self
        return rebuild_primal(unthunk(other), self)

    def __neg__(self) -> "Tangent":
        return self._map(lambda v: -v)

    def __sub__(self, other: Any) -> Any:
        if isinstance(other, AbstractZero):
            return self
        return self + (-unthunk(other))

    def __mul__(self, scalar: Any) -> Any:
        if isinstance(scalar, AbstractZero):
            return scalar
        return self._map(lambda v: v * scalar)

    def __rmul__(self, scalar: Any) -> Any:
        if isinstance(scalar, AbstractZero):
            return scalar
        return self._map(lambda v: scalar * v)

    def __truediv__(self, scalar: Any) -> "Tangent":
        return self._map(lambda v: v / scalar)

    def conj(self) -> "Tangent":
        return self._map(lambda v: unthunk(v).conj() if hasattr(unthunk(v), "conj") else v)

    def __eq__(self, other: Any) -> bool:
        if isinstance(other, AbstractZero):
            return all(_value_eq(v, other) for v in self)
        if not isinstance(other, Tangent) or other.primal_type is not self.primal_type:
            return NotImplemented
        a, b = self._backing, other._backing
        if isinstance(a, tuple) != isinstance(b, tuple):
            return False
        if isinstance(a, tuple):
            n = max(len(a), len(b))
            pad = lambda t: tuple(t) + (ZeroTangent(),) * (n - len(t))  # noqa: E731
            return all(_value_eq(x, y) for x, y in zip(pad(a), pad(b)))
        keys = list(a) + [k for k in b if k not in a]
        return all(_value_eq(a.get(k, ZeroTangent()), b.get(k, ZeroTangent())) for k in keys)

    # mutable-looking values inside; equality is structural (typeshed declares object.__hash__ a method)
    __hash__ = None  # type: ignore[assignment]


def _from_store(primal_type: type, store: dict) -> Tangent:
    """A dict-backed Tangent from already validated fields (any key type)."""
    new = Tangent.__new__(Tangent)
    object.__setattr__(new, "primal_type", primal_type)
    object.__setattr__(new, "_backing", store)
    return new


def _value_eq(a: Any, b: Any) -> bool:
    a, b = unthunk(a), unthunk(b)
    if isinstance(a, AbstractZero) and isinstance(b, AbstractZero):
        return True
    if isinstance(a, AbstractZero):
        a, b = b, a
    if isinstance(b, AbstractZero):
        if isinstance(a, Tangent):
            return a == b
        return bool(np.all(np.asarray(a) == 0))
    if isinstance(a, Tangent) or isinstance(b, Tangent):
        return bool(a == b)
    return bool(np.array_equal(np.asarray(a), np.asarray(b)))


def backing(t: Any) -> Any:
    """The stored fields of a `Tangent` (a dict or a tuple); other values are returned as is.

    >>> from rules import Tangent, backing
    >>> backing(Tangent(tuple, 1.0, 2.0))
    (1.0, 2.0)

    See also: `Tangent`, `canonicalize`.
    """
    if isinstance(t, Tangent):
        store = t._backing
        return dict(store) if isinstance(store, dict) else store
    return t


def canonicalize(t: Tangent) -> Tangent:
    """Every field of the primal type present, in declaration order (missing -> ZeroTangent).

    >>> from typing import NamedTuple
    >>> from rules import Tangent, canonicalize
    >>> class P(NamedTuple):
    ...     a: float
    ...     b: float
    >>> canonicalize(Tangent(P, b=2.0))
    Tangent[P](a=ZeroTangent(), b=2.0)

    See also: `Tangent`, `backing`.
    """
    if not isinstance(t, Tangent):
        return t
    allowed = known_fields(t.primal_type)
    if allowed is None or isinstance(t._backing, tuple):
        return t
    return Tangent(t.primal_type, **{name: t._backing.get(name, ZeroTangent()) for name in allowed})


# ----- primal structure ---------------------------------------------------------------------
def _key_name(key: Any) -> Any:
    for attr in ("name", "key", "idx"):
        if hasattr(key, attr):
            return getattr(key, attr)
    return key


def children_with_names(primal: Any) -> tuple[list[tuple[Any, Any]], Any] | None:
    """One level of a pytree node: `([(name, child), ...], rebuild)`, or None for a leaf.

    Names are attribute names (NamedTuple, dataclass, attribute pytrees), dict keys or
    sequence indices; `rebuild(children)` makes a new node of the same type. Dataclasses
    that are not registered pytrees are split by their fields.
    """
    if primal is None:
        return None
    keyed, treedef = jax.tree_util.tree_flatten_with_path(primal, is_leaf=lambda n: n is not primal)
    if treedef.num_nodes == 1:  # a leaf for JAX
        if dataclasses.is_dataclass(primal) and not isinstance(primal, type):
            names = [f.name for f in dataclasses.fields(primal)]

            def rebuild_dataclass(children, primal=primal, names=names):
                return dataclasses.replace(primal, **dict(zip(names, children)))

            return [(n, getattr(primal, n)) for n in names], rebuild_dataclass
        return None
    pairs = [(_key_name(path[0]), child) for path, child in keyed]

    def rebuild(children, treedef=treedef):
        return jax.tree_util.tree_unflatten(treedef, list(children))

    return pairs, rebuild


def rebuild_primal(primal: Any, tangent: Tangent) -> Any:
    """`primal + tangent` for a structural tangent: each field moved along its tangent."""
    if isinstance(tangent.primal_type, type) and not isinstance(primal, tangent.primal_type):
        raise TangentStructureError(
            format_message(
                "`primal + Tangent`: the tangent belongs to another type",
                expected=f"a value of type {tangent.primal_type.__name__}",
                got=f"{type(primal).__name__}",
                fix="add a Tangent to a primal of the type it was built for",
            )
        )
    split = children_with_names(primal)
    if split is None:
        raise TangentStructureError(
            format_message(
                "`primal + Tangent`: the primal has no fields",
                expected=f"a value of type {getattr(tangent.primal_type, '__name__', tangent.primal_type)}",
                got=f"{type(primal).__name__}",
            )
        )
    pairs, rebuild = split
    names = [n for n, _ in pairs]
    store = tangent._backing
    lookup = dict(enumerate(store)) if isinstance(store, tuple) else store
    unknown = [k for k in lookup if k not in names]
    if unknown:
        raise TangentStructureError(
            format_message(
                f"`primal + Tangent`: the tangent has fields the {type(primal).__name__} lacks",
                expected=f"fields among {names}",
                got=f"{list(lookup)}",
                fix="build the Tangent with the primal's field names",
            )
        )
    new_children = [child + lookup[name] if name in lookup else child for name, child in pairs]
    return rebuild(new_children)


def _flatten_tangent(t: Tangent):
    store = t._backing
    if isinstance(store, tuple):
        return store, (t.primal_type, None)
    keys = tuple(store)
    return tuple(store[k] for k in keys), (t.primal_type, keys)


def _unflatten_tangent(aux, children):
    primal_type, keys = aux
    if keys is None:
        return Tangent(primal_type, *children)
    return _from_store(primal_type, dict(zip(keys, children)))


jax.tree_util.register_pytree_node(Tangent, _flatten_tangent, _unflatten_tangent)
