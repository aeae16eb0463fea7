"""Tests for the tangent types: zeros, thunks, NotImplementedTangent and structural `Tangent`.

Each test pins one entry of ChainRulesCore's tangent algebra (DESIGN.md 2.2).
"""

import copy
import dataclasses
import inspect
import pickle
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import rules
from rules import (
    InplaceableThunk,
    NoTangent,
    Tangent,
    Thunk,
    ZeroTangent,
    backing,
    canonicalize,
    thunk,
    unthunk,
)


class Point(NamedTuple):
    x: Any
    y: Any


@dataclasses.dataclass
class Pair:
    a: Any
    b: Any


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Params:
    w: jax.Array
    b: jax.Array


@jax.tree_util.register_pytree_with_keys_class
class Layer:
    """An attribute pytree whose type does not declare its fields."""

    def __init__(self, w, b):
        self.w, self.b = w, b

    def tree_flatten_with_keys(self):
        return ((jax.tree_util.GetAttrKey("w"), self.w), (jax.tree_util.GetAttrKey("b"), self.b)), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)


def _raise():
    raise AssertionError("the thunk was evaluated")


def never_evaluated() -> Thunk:
    return Thunk(_raise)


def values():
    """A float, a JAX array and a numpy array: what cotangents are made of."""
    return [1.5, jnp.array([1.0, 2.0]), np.array([1.0, 2.0])]


VALUE_IDS = ["float", "jax", "numpy"]


# ------------------------------------------------------------------------------------------
# ZeroTangent / NoTangent
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("x", values(), ids=VALUE_IDS)
@pytest.mark.parametrize("zero", [ZeroTangent(), NoTangent()], ids=["Zero", "No"])
def test_zero_is_the_identity_of_add(zero, x):
    assert (zero + x) is x
    assert (x + zero) is x


@pytest.mark.parametrize("zero", [ZeroTangent(), NoTangent()], ids=["Zero", "No"])
def test_numpy_plus_zero_is_not_an_object_array(zero):
    x = np.array([1.0, 2.0])
    y = x + zero
    assert isinstance(y, np.ndarray) and y.dtype == np.float64
    assert (np.float64(2.0) + zero) == 2.0 and isinstance(np.float64(2.0) + zero, np.float64)


@pytest.mark.parametrize("x", values(), ids=VALUE_IDS)
@pytest.mark.parametrize("zero", [ZeroTangent(), NoTangent()], ids=["Zero", "No"])
def test_zero_absorbs_mul(zero, x):
    assert (zero * x) is zero
    assert (x * zero) is zero


def test_no_tangent_wins_add_and_zero_tangent_wins_mul():
    assert NoTangent() + ZeroTangent() is NoTangent()
    assert ZeroTangent() + NoTangent() is NoTangent()
    assert NoTangent() * ZeroTangent() is ZeroTangent()
    assert ZeroTangent() * NoTangent() is ZeroTangent()
    assert ZeroTangent() + ZeroTangent() is ZeroTangent()
    assert NoTangent() * NoTangent() is NoTangent()


@pytest.mark.parametrize("x", values(), ids=VALUE_IDS)
def test_zero_negation_and_subtraction(x):
    chex.assert_trees_all_close(ZeroTangent() - x, -x)
    assert type(ZeroTangent() - x) is type(-x)
    assert (x - ZeroTangent()) is x
    assert -ZeroTangent() is ZeroTangent()
    assert -NoTangent() is NoTangent()
    assert ZeroTangent() - NoTangent() is NoTangent()


@pytest.mark.parametrize("x", values(), ids=VALUE_IDS)
def test_zero_divided_by_anything_is_zero(x):
    assert (ZeroTangent() / x) is ZeroTangent()
    assert (NoTangent() / x) is NoTangent()


@pytest.mark.parametrize("x", [jnp.ones((2, 2)), np.ones((2, 2))], ids=["jax", "numpy"])
def test_zero_matmul(x):
    assert (ZeroTangent() @ x) is ZeroTangent()
    assert (x @ ZeroTangent()) is ZeroTangent()
    assert (x @ NoTangent()) is NoTangent()


@pytest.mark.parametrize("cls", [ZeroTangent, NoTangent])
def test_zeros_are_singletons_through_copy_and_pickle(cls):
    z = cls()
    assert cls() is z
    assert copy.copy(z) is z
    assert copy.deepcopy([z])[0] is z
    assert pickle.loads(pickle.dumps(z)) is z
    assert isinstance(z, rules.AbstractZero)
    assert ZeroTangent() is not NoTangent()


def test_abstract_zero_cannot_be_instantiated():
    with pytest.raises(TypeError, match="abstract"):
        rules.AbstractZero()


def test_zeros_pass_through_jit_as_pytree_nodes():
    assert jax.tree_util.tree_leaves([ZeroTangent(), NoTangent(), 1.0]) == [1.0]

    @jax.jit
    def f(z, n, x):
        return z, n, x + z

    z, n, y = f(ZeroTangent(), NoTangent(), jnp.ones(2))
    assert z is ZeroTangent() and n is NoTangent()
    chex.assert_trees_all_close(y, jnp.ones(2))


# ------------------------------------------------------------------------------------------
# Thunks
# ------------------------------------------------------------------------------------------


def test_zeros_never_evaluate_a_thunk():
    t = never_evaluated()
    assert (ZeroTangent() + t) is t
    assert (t + ZeroTangent()) is t
    assert (NoTangent() + t) is t
    assert (t - ZeroTangent()) is t
    assert (ZeroTangent() * t) is ZeroTangent()
    assert (t * ZeroTangent()) is ZeroTangent()
    assert (t * NoTangent()) is NoTangent()
    assert (NoTangent() * t) is NoTangent()
    assert (ZeroTangent() @ t) is ZeroTangent()
    assert (t @ ZeroTangent()) is ZeroTangent()
    assert (ZeroTangent() / t) is ZeroTangent()


def test_arithmetic_with_a_value_evaluates_the_thunk():
    calls = []

    def fn():
        calls.append(1)
        return 2.0

    t = thunk(fn)
    assert calls == []
    assert t + 1.0 == 3.0
    assert 1.0 + t == 3.0
    assert t * 3.0 == 6.0
    assert -t == -2.0
    assert len(calls) == 4  # a Thunk is re-evaluated on each use
    chex.assert_trees_all_close(jnp.ones(2) + thunk(fn), jnp.full(2, 3.0))
    chex.assert_trees_all_close(np.ones(2) + thunk(fn), np.full(2, 3.0))


def test_unthunk_evaluates_nested_thunks_and_passes_values():
    assert unthunk(Thunk(lambda: Thunk(lambda: Thunk(lambda: 7.0)))) == 7.0
    x = jnp.ones(2)
    assert unthunk(x) is x
    assert unthunk(ZeroTangent()) is ZeroTangent()


def test_thunk_decorator_and_call():
    @thunk
    def dx():
        return 1.5

    assert isinstance(dx, rules.AbstractThunk)
    assert dx() == 1.5
    with pytest.raises(TypeError, match="callable"):
        Thunk(1.0)


def make_inplaceable(calls: list) -> InplaceableThunk:
    def add_fn(acc):
        calls.append("add_fn")
        return acc + 5.0

    return InplaceableThunk(add_fn, Thunk(lambda: calls.append("val") or 5.0))


@pytest.mark.parametrize("acc", values(), ids=VALUE_IDS)
def test_inplaceable_thunk_accumulates_with_add_fn(acc):
    calls = []
    it = make_inplaceable(calls)
    chex.assert_trees_all_close(acc + it, acc + 5.0)
    assert calls == ["add_fn"]
    chex.assert_trees_all_close(it + acc, acc + 5.0)
    assert calls == ["add_fn", "add_fn"]


def test_inplaceable_thunk_unthunk_uses_val_and_zeros_skip_it():
    calls = []
    it = make_inplaceable(calls)
    assert (ZeroTangent() + it) is it
    assert (it + ZeroTangent()) is it
    assert (ZeroTangent() * it) is ZeroTangent()
    assert calls == []
    assert unthunk(it) == 5.0
    assert calls == ["val"]


# ------------------------------------------------------------------------------------------
# NotImplementedTangent
# ------------------------------------------------------------------------------------------

INFO = "derivative with respect to the order nu"


def test_not_implemented_wins_add():
    nit = rules.not_implemented(INFO)
    for x in [1.5, np.array([1.0, 2.0]), ZeroTangent(), NoTangent(), Thunk(lambda: 1.0)]:
        assert (nit + x) is nit
        assert (x + nit) is nit
    assert (nit + jnp.array([1.0, 2.0])) is nit
    assert (nit + nit) is nit
    assert (nit + never_evaluated()) is nit


def test_not_implemented_loses_mul_against_a_zero():
    nit = rules.not_implemented(INFO)
    assert (nit * ZeroTangent()) is ZeroTangent()
    assert (ZeroTangent() * nit) is ZeroTangent()
    assert (nit * NoTangent()) is NoTangent()
    assert (NoTangent() * nit) is NoTangent()


def test_not_implemented_wins_mul_against_non_zeros():
    nit = rules.not_implemented(INFO)
    for x in [1.5, np.array([1.0, 2.0])]:
        assert (nit * x) is nit
        assert (x * nit) is nit
    assert (nit * jnp.array([1.0, 2.0])) is nit


@pytest.mark.parametrize(
    "use",
    [
        lambda nit, x: -nit,
        lambda nit, x: x - nit,
        lambda nit, x: nit - x,
        lambda nit, x: nit / x,
        lambda nit, x: x / nit,
        lambda nit, x: np.asarray(nit),
        lambda nit, x: jnp.asarray(nit),
        lambda nit, x: float(nit),
    ],
    ids=["neg", "x-nit", "nit-x", "nit/x", "x/nit", "np.asarray", "jnp.asarray", "float"],
)
@pytest.mark.parametrize("x", values(), ids=VALUE_IDS)
def test_not_implemented_raises_when_its_value_matters(use, x):
    nit, line = rules.not_implemented(INFO), inspect.currentframe().f_lineno
    with pytest.raises(rules.NotImplementedTangentError) as info:
        use(nit, x)
    message = str(info.value)
    assert INFO in message
    assert f"test_tangent_types.py:{line}" in message
    assert issubclass(rules.NotImplementedTangentError, rules.RuleError)
    assert isinstance(info.value, NotImplementedError)


# ------------------------------------------------------------------------------------------
# Tangent: construction and access
# ------------------------------------------------------------------------------------------


def test_missing_fields_read_as_zero_tangent():
    t = Tangent(Point, x=1.0)
    assert t.x == 1.0
    assert t.y is ZeroTangent()
    assert Tangent(Pair, b=2.0).a is ZeroTangent()
    assert Tangent(dict, a=1.0)["b"] is ZeroTangent()
    assert Tangent(dict, a=1.0).b is ZeroTangent()
    with pytest.raises(AttributeError):
        t.z


def test_dict_tangent_from_mapping_or_keywords():
    a, b = Tangent(dict, {"a": 1.0}), Tangent(dict, a=1.0)
    assert a == b
    assert backing(a) == {"a": 1.0} and type(backing(a)) is dict
    assert Tangent(dict, {1: 2.0})[1] == 2.0  # non-str keys via the mapping form


def test_tuple_tangent_and_backing():
    t = Tangent(tuple, 1.0, 2.0)
    assert backing(t) == (1.0, 2.0)
    assert t[1] == 2.0 and list(t) == [1.0, 2.0] and len(t) == 2
    assert backing(3.0) == 3.0


def test_field_access_unthunks():
    calls = []
    t = Tangent(Point, x=thunk(lambda: calls.append(1) or 3.0))
    assert calls == []
    assert t.x == 3.0
    assert t["x"] == 3.0
    assert calls == [1, 1]


@pytest.mark.parametrize("primal_type, fields", [(Point, ["x", "y"]), (Pair, ["a", "b"])])
def test_unknown_field_raises_and_names_the_fields(primal_type, fields):
    with pytest.raises(rules.TangentStructureError) as info:
        Tangent(primal_type, z=1.0)
    message = str(info.value)
    for name in ["z", *fields]:
        assert repr(name) in message
    assert issubclass(rules.TangentStructureError, rules.RuleError)


def test_tangent_is_immutable():
    with pytest.raises(AttributeError):
        Tangent(Point, x=1.0).x = 2.0


# ------------------------------------------------------------------------------------------
# Tangent: equality and algebra
# ------------------------------------------------------------------------------------------


def test_equality_treats_missing_fields_as_zeros():
    assert Tangent(Point, x=1.0) == Tangent(Point, x=1.0, y=0.0)
    assert Tangent(Point, x=1.0) == Tangent(Point, x=1.0, y=ZeroTangent())
    assert Tangent(Point, x=1.0, y=0.0) == Tangent(Point, x=1.0)
    assert Tangent(Point, x=jnp.zeros(2)) == Tangent(Point)
    assert Tangent(Point) == ZeroTangent()


def test_inequality_when_values_differ():
    assert Tangent(Point, x=1.0) != Tangent(Point, x=2.0)
    assert Tangent(Point, x=1.0) != Tangent(Point, x=1.0, y=1.0)
    assert Tangent(Point, x=jnp.ones(2)) != Tangent(Point, x=jnp.array([1.0, 2.0]))
    assert Tangent(Point, x=1.0) != Tangent(Pair, a=1.0)


def test_add_merges_fields():
    t = Tangent(Point, x=1.0) + Tangent(Point, x=2.0, y=3.0)
    assert t == Tangent(Point, x=3.0, y=3.0)
    assert t.primal_type is Point
    u = Tangent(dict, a=1.0) + Tangent(dict, b=2.0)
    assert backing(u) == {"a": 1.0, "b": 2.0}
    assert Tangent(tuple, 1.0, 2.0) + Tangent(tuple, 3.0, ZeroTangent()) == Tangent(tuple, 4.0, 2.0)


def test_add_with_zeros_keeps_the_tangent():
    t = Tangent(Point, x=1.0)
    assert (t + ZeroTangent()) is t
    assert (ZeroTangent() + t) is t
    assert (t + NoTangent()) is t
    assert (t * ZeroTangent()) is ZeroTangent()
    assert (NoTangent() * t) is NoTangent()


def test_scalar_mul_maps_fields_on_both_sides():
    t = Tangent(Point, x=1.0, y=np.array([1.0, 2.0]))
    for scaled in [2.0 * t, t * 2.0]:
        assert scaled.primal_type is Point
        assert scaled.x == 2.0
        chex.assert_trees_all_close(scaled.y, np.array([2.0, 4.0]))
    assert 2.0 * Tangent(Point, x=1.0) == Tangent(Point, x=2.0)


def test_negation_subtraction_and_division():
    t = Tangent(Point, x=1.0, y=2.0)
    assert -t == Tangent(Point, x=-1.0, y=-2.0)
    assert t - Tangent(Point, y=5.0) == Tangent(Point, x=1.0, y=-3.0)
    assert t / 2 == Tangent(Point, x=0.5, y=1.0)
    assert (t - ZeroTangent()) is t


def test_adding_tangents_of_different_primal_types_raises():
    with pytest.raises(rules.TangentStructureError, match="different primal types"):
        Tangent(Point, x=1.0) + Tangent(Pair, a=1.0)
    with pytest.raises(rules.TangentStructureError):
        Tangent(tuple, 1.0) + Tangent(tuple, 1.0, 2.0)


def test_canonicalize_orders_fields_and_fills_zeros():
    c = canonicalize(Tangent(Point, y=2.0))
    assert list(backing(c)) == ["x", "y"]
    assert backing(c)["x"] is ZeroTangent() and c.y == 2.0
    assert list(backing(canonicalize(Tangent(Pair, b=1.0, a=2.0)))) == ["a", "b"]
    assert canonicalize(Tangent(Point, y=2.0)) == Tangent(Point, y=2.0)
    t = Tangent(tuple, 1.0)
    assert canonicalize(t) is t


# ------------------------------------------------------------------------------------------
# Tangent: primal + tangent
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "primal, tangent, expected",
    [
        (Point(1.0, 2.0), Tangent(Point, x=1.0), Point(2.0, 2.0)),
        ({"a": 1.0, "b": 2.0}, Tangent(dict, {"a": 1.0}), {"a": 2.0, "b": 2.0}),
        ({"a": 1.0, "b": 2.0}, Tangent(dict, b=0.5), {"a": 1.0, "b": 2.5}),
        (Pair(1.0, 2.0), Tangent(Pair, b=1.0), Pair(1.0, 3.0)),
        ((1.0, 2.0), Tangent(tuple, 1.0, 2.0), (2.0, 4.0)),
        (
            Point({"a": 1.0}, (1.0, 2.0)),
            Tangent(Point, x=Tangent(dict, a=1.0), y=Tangent(tuple, 0.5, ZeroTangent())),
            Point({"a": 2.0}, (1.5, 2.0)),
        ),
    ],
    ids=["namedtuple", "dict-mapping", "dict-kwargs", "dataclass", "tuple", "nested"],
)
def test_primal_plus_tangent_rebuilds_the_primal(primal, tangent, expected):
    for moved in [primal + tangent, tangent + primal]:
        assert type(moved) is type(expected)
        assert moved == expected


def test_primal_plus_tangent_for_registered_pytrees():
    p = Params(jnp.ones(2), jnp.zeros(2))
    moved = p + Tangent(Params, b=jnp.full(2, 3.0))
    assert type(moved) is Params
    chex.assert_trees_all_close(moved, Params(jnp.ones(2), jnp.full(2, 3.0)))

    layer = Layer(1.0, 2.0) + Tangent(Layer, w=1.0)
    assert type(layer) is Layer and (layer.w, layer.b) == (2.0, 2.0)


def test_primal_plus_tangent_with_unknown_field_raises():
    with pytest.raises(rules.TangentStructureError) as info:
        Layer(1.0, 2.0) + Tangent(Layer, z=1.0)
    assert "'z'" in str(info.value) and "'w'" in str(info.value)


# ------------------------------------------------------------------------------------------
# Tangent as a pytree
# ------------------------------------------------------------------------------------------


def test_tree_map_keeps_primal_type_and_zeros():
    t = Tangent(Point, x=1.0, y=ZeroTangent())
    doubled = jax.tree_util.tree_map(lambda v: v * 2, t)
    assert isinstance(doubled, Tangent) and doubled.primal_type is Point
    assert doubled.x == 2.0 and doubled.y is ZeroTangent()
    assert jax.tree_util.tree_leaves(Tangent(tuple, 1.0, 2.0)) == [1.0, 2.0]


def test_tangent_passes_through_jit():
    @jax.jit
    def scale(t):
        return t * 2.0

    out = scale(Tangent(Point, x=jnp.ones(2)))
    assert out.primal_type is Point and out.y is ZeroTangent()
    chex.assert_trees_all_close(out.x, jnp.full(2, 2.0))


# ------------------------------------------------------------------------------------------
# Properties
# ------------------------------------------------------------------------------------------

finite = st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False)
zeros = st.sampled_from([ZeroTangent(), NoTangent()])
small_arrays = hnp.arrays(np.float64, hnp.array_shapes(min_dims=0, max_dims=2, max_side=3), elements=finite)
cotangents = st.one_of(finite, small_arrays, zeros)


@settings(max_examples=30, deadline=None)
@given(cotangents)
def test_zero_tangent_is_the_identity_of_add(v):
    assert (ZeroTangent() + v) is v
    assert (v + ZeroTangent()) is v


@settings(max_examples=30, deadline=None)
@given(zeros, cotangents)
def test_zeros_absorb_mul(z, v):
    if isinstance(v, rules.AbstractZero):
        expected = ZeroTangent() if ZeroTangent() in (z, v) else NoTangent()
    else:
        expected = z
    assert (z * v) is expected
    assert (v * z) is expected


class Pt(NamedTuple):
    a: Any  # shape (2,)
    b: Any  # scalar


def _field(values):
    return st.one_of(st.just(None), zeros, values)  # None: the field is left out


point_tangents = st.builds(
    lambda a, b: Tangent(Pt, **{k: v for k, v in [("a", a), ("b", b)] if v is not None}),
    _field(hnp.arrays(np.float64, (2,), elements=finite)),
    _field(finite),
)


def _dense(t: Tangent) -> list[np.ndarray]:
    """The fields of a `Tangent[Pt]` as arrays, zeros materialised."""
    a = 0.0 if isinstance(t.a, rules.AbstractZero) else t.a
    b = 0.0 if isinstance(t.b, rules.AbstractZero) else t.b
    return [np.zeros(2) + a, np.asarray(b)]


def _assert_close(s: Tangent, t: Tangent):
    assert s.primal_type is t.primal_type is Pt
    for u, v in zip(_dense(s), _dense(t)):
        np.testing.assert_allclose(u, v, rtol=1e-12, atol=1e-9)


@settings(max_examples=30, deadline=None)
@given(point_tangents, point_tangents, point_tangents)
def test_tangent_add_is_associative_and_commutative(r, s, t):
    _assert_close((r + s) + t, r + (s + t))
    _assert_close(r + s, s + r)


# ----- regressions found while writing these tests ------------------------------------------
def test_not_implemented_wins_plus_and_times_with_a_jax_array_on_the_left():
    nit = rules.not_implemented("left operand")
    assert (jnp.ones(2) + nit) is nit
    assert (jnp.ones(2) * nit) is nit


def test_thunks_combined_with_not_implemented_are_not_evaluated():
    nit = rules.not_implemented("lazy")

    def boom():
        raise AssertionError("evaluated")

    t = rules.Thunk(boom)
    assert (t + nit) is nit and (t * nit) is nit and (nit + t) is nit
    it = rules.InplaceableThunk(lambda acc: acc.at[1].add(5.0), rules.Thunk(boom))
    assert (it + nit) is nit


def test_primal_plus_tangent_of_another_type_is_an_error():
    import dataclasses

    @dataclasses.dataclass
    class A:
        a: float

    @dataclasses.dataclass
    class B:
        a: float

    with pytest.raises(rules.TangentStructureError, match="another type"):
        A(1.0) + rules.Tangent(B, a=1.0)
    with pytest.raises(rules.ProjectionError, match="another type"):
        rules.ProjectTo(A(1.0))(rules.Tangent(B, a=2.0))
