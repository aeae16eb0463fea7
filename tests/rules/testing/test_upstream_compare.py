"""ChainRulesTestUtils.jl's comparison tests, ported: upstream test/check_result.jl and
test/rand_tangent.jl.

Each test's docstring names the upstream testset it carries over. Julia's vectors of vectors
are lists of arrays here, its tuples Python tuples, `@thunk` a `Thunk`, `@not_implemented` a
`rules.not_implemented`, and a struct a NamedTuple (a pytree).

Upstream cases without a JAX meaning, not ported:

- check_result.jl `test_approx(Broadcast.broadcasted(...), ...)` and rand_tangent.jl's
  `Broadcasted`: JAX has no lazy broadcast objects.
- check_result.jl "FakeNaturalDiffWithIsApprox": overloading Julia's `isapprox` for a type;
  Python has no such hook (a natural tangent of a pytree type is compared by its leaves,
  ported as "Structural == Natural").
- check_result.jl "type negative" for `Tangent{Tuple{Float32,Float32}}` against
  `Tangent{Tuple{Float64,Float64}}`: a Python tuple type does not carry its element types;
  the fact (Tangents of different primal types differ) is ported with two NamedTuple types.
- check_result.jl `test_approx((1.0, 2.0), Tangent{Tuple}(1.0, 2.0))` fails upstream (Zygote's
  legacy tuple tangents against structural ones). Here a tuple is a valid natural tangent of
  a tuple (`jax.vjp` gives one, and `rand_tangent` returns one), so the two compare by value;
  this is a deliberate difference, tested in `test_a_tuple_and_a_tangent_of_a_tuple_compare_by_value`.
- check_result.jl `_test_add!!_behaviour(12.0, InplaceableThunk(error, ...))` ("should not have
  in-placed" into an immutable scalar): every JAX array is immutable, so `add_fn(acc)` is
  how every accumulation happens; the other `add!!` cases are ported.
- check_result.jl "TestIterator" with iterators that differ only in their traits (type
  parameters): a pytree's static data is part of its structure, so two such containers have
  different structures; the value cases are ported with one container type.
- rand_tangent.jl: `BigFloat` (no arbitrary precision in JAX); `Adjoint`/`Transpose`
  co-arrays and `UpperTriangular`/`Diagonal`/`Symmetric`/`Hermitian` (jax.numpy has no lazy
  or structured matrix types: `x.T` is an array, ported); types and `Union`s as values
  (ported for classes); "erroring cases" (`invoke` of the struct fallback on a Float64, Julia
  dispatch); "niceness of printing" (upstream draws from a 0.01 grid so values print short;
  here tangents are standard normal, which every rule test's random probe depends on).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rules import InplaceableThunk, NoTangent, Tangent, Thunk, ZeroTangent, not_implemented
from rules.testing import rand_tangent, test_approx
from rules.testing._testers import _check_close, _inplaceable_sums

RNG = np.random.default_rng(123456)


def fails(call):
    with pytest.raises(AssertionError):
        call()


class Pair(NamedTuple):
    a: float
    b: float


class Diag(NamedTuple):
    """A stand-in for `Diagonal`: a matrix type whose only field is its diagonal."""

    diag: jax.Array


class Diag32(NamedTuple):
    diag: jax.Array


# ------------------------------------------------------------------------------------------
# check_result.jl: _test_add!!_behaviour
# ------------------------------------------------------------------------------------------


def test_inplaceable_add_behaviour():
    """check_result.jl "_test_add!!_behaviour": `add!!(acc, x) ≈ acc + x` for an
    `InplaceableThunk` whose add function adds into the accumulator (correct: 2.0 into entry
    0; wrong: 3.0)."""
    def check(part):
        added, plain = _inplaceable_sums("test_frule", "check", "output", part, ())
        _check_close("test_frule", "check", "InplaceableThunk: add_fn(acc) differs from acc + val",
                     added, plain, 1e-10, 1e-12)

    check(InplaceableThunk(lambda acc: acc.at[0].add(2.0), Thunk(lambda: jnp.array([2.0, 0.0]))))
    bad = InplaceableThunk(lambda acc: acc.at[0].add(3.0), Thunk(lambda: jnp.array([2.0, 0.0])))
    with pytest.raises(AssertionError, match=r"add_fn\(acc\) differs from acc \+ val"):
        check(bad)


# ------------------------------------------------------------------------------------------
# check_result.jl: test_approx
# ------------------------------------------------------------------------------------------


def test_approx_positive_cases():
    """check_result.jl "test_approx", "positive cases"."""
    test_approx(1.0, 1.0)
    test_approx(1.0 + 1j, 1.0 + 1j)
    test_approx(1.0, 1.0 + 1e-10)
    test_approx((1.5, 2.5, 3.5), (1.5, 2.5, 3.5 + 1e-10))
    test_approx(ZeroTangent(), 0.0)
    test_approx(jnp.array([1.0, 2.0]), jnp.array([1.0, 2.0]))
    test_approx([jnp.array([1.0]), jnp.array([2.0])], [jnp.array([1.0]), jnp.array([2.0])])
    test_approx([jnp.zeros(1), jnp.zeros(1)], ZeroTangent())
    test_approx(ZeroTangent(), [jnp.zeros(1), jnp.zeros(1)])
    nested = [jnp.zeros(2), [jnp.zeros(2), jnp.zeros(2)]]
    test_approx(ZeroTangent(), nested)
    test_approx(nested, NoTangent())
    test_approx(Thunk(lambda: [10 * 0.1 * jnp.array([1.0]), 10 * 0.1 * jnp.array([2.0])]),
                [jnp.array([1.0]), jnp.array([2.0])])
    test_approx(not_implemented(""), jnp.asarray(RNG.uniform(size=3)))
    test_approx(jnp.asarray(RNG.uniform(size=3)), not_implemented(""))
    test_approx(*[not_implemented("a") for _ in range(2)])  # the same one: same message, same line
    test_approx(Tangent(tuple, 1.0, 2.0), Tangent(tuple, 1.0, 2.0))
    d = jnp.asarray(RNG.standard_normal(5))
    test_approx(Tangent(Diag, diag=d), Tangent(Diag, diag=d))  # structural == structural
    test_approx(Tangent(Diag, diag=d), Diag(d))  # structural == natural
    test_approx(Tangent(Pair, a=1.0), Tangent(Pair, a=1.0, b=ZeroTangent()))
    test_approx(Tangent(Pair, a=1.0), Tangent(Pair, a=1.0 + 1e-10, b=ZeroTangent()))
    test_approx(Tangent(tuple, 1.0, 2.0), Thunk(lambda: Tangent(tuple, 1.0, 2.0)))
    test_approx(Thunk(lambda: Tangent(tuple, 1.0, 2.0)), Tangent(tuple, 1.0, 2.0))
    test_approx(Thunk(lambda: ZeroTangent()), ZeroTangent())
    test_approx(ZeroTangent(), Thunk(lambda: ZeroTangent()))
    test_approx(Tangent(tuple, NoTangent(), NoTangent()), NoTangent())
    test_approx(NoTangent(), Tangent(tuple, NoTangent(), NoTangent()))


def test_approx_negative_cases():
    """check_result.jl "test_approx", "negative case"."""
    fails(lambda: test_approx(1.0, 2.0))
    fails(lambda: test_approx(1.0 + 1j, 1.0 - 1j))
    fails(lambda: test_approx((1.5, 2.5, 3.5), (1.5, 2.5, 4.5)))
    fails(lambda: test_approx(ZeroTangent(), 20.0))
    fails(lambda: test_approx(10.0, ZeroTangent()))
    fails(lambda: test_approx(jnp.array([1.0, 2.0]), jnp.array([1.0, 3.9])))
    fails(lambda: test_approx([jnp.array([1.0]), jnp.array([2.0])], [jnp.array([1.1]), jnp.array([2.0])]))
    fails(lambda: test_approx([jnp.array([0.0]), jnp.array([0.1])], ZeroTangent()))
    fails(lambda: test_approx(ZeroTangent(), [jnp.array([0.1]), jnp.array([0.0])]))
    nested = [jnp.zeros(1), jnp.zeros(1), [jnp.array([0.0, 0.1]), jnp.zeros(1)]]
    fails(lambda: test_approx(nested, ZeroTangent()))
    fails(lambda: test_approx(ZeroTangent(), nested))
    fails(lambda: test_approx(Tangent(tuple, NoTangent(), 0.1), NoTangent()))
    fails(lambda: test_approx(NoTangent(), Tangent(tuple, NoTangent(), 0.1)))
    fails(lambda: test_approx(Thunk(lambda: [10 * jnp.array([1.0]), 10 * jnp.array([2.0])]),
                              [jnp.array([1.0]), jnp.array([2.0])]))
    fails(lambda: test_approx(not_implemented("a"), not_implemented("b")))
    fails(lambda: test_approx(Tangent(tuple, 1.0, 2.0), Thunk(lambda: Tangent(tuple, 2.0, 2.0))))


def test_approx_tangents_of_different_primal_types_differ():
    """check_result.jl "type negative": Tangents of different primal types are not equal."""
    d = jnp.ones(2)
    fails(lambda: test_approx(Tangent(Diag32, diag=d), Tangent(Diag, diag=d)))


def test_a_tuple_and_a_tangent_of_a_tuple_compare_by_value():
    """check_result.jl "type negative", `(1.0, 2.0)` against `Tangent{Tuple}(1.0, 2.0)`: a
    deliberate difference (see the module docstring); a different value still fails."""
    test_approx((1.0, 2.0), Tangent(tuple, 1.0, 2.0))
    fails(lambda: test_approx((1.0, 2.5), Tangent(tuple, 1.0, 2.0)))


@jax.tree_util.register_pytree_node_class
class Iterator:
    """ChainRulesTestUtils' `TestIterator` as a pytree (data; a static trait)."""

    def __init__(self, data, eltype_known=True):
        self.data, self.eltype_known = data, eltype_known

    def tree_flatten(self):
        return (self.data,), self.eltype_known

    @classmethod
    def tree_unflatten(cls, eltype_known, children):
        return cls(children[0], eltype_known)


def test_approx_custom_containers():
    """check_result.jl "TestIterator": containers compare by their data."""
    data = jnp.asarray(RNG.standard_normal(3))
    test_approx(Iterator(data), Iterator(data))
    test_approx(Iterator(data + 1e-10), Iterator(data))
    fails(lambda: test_approx(Iterator(data + 10), Iterator(data)))


# ------------------------------------------------------------------------------------------
# rand_tangent.jl
# ------------------------------------------------------------------------------------------


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Bar:
    """rand_tangent.jl's `Bar(a::Float64, b::Int, c::Any)`."""

    a: float
    b: int
    c: object


NO_TANGENT = [
    ("str", "hi"),
    ("char", "a"),
    ("bool", True),
    ("int", 4),
    ("module", np),
    ("class", Bar),
    ("builtin-class", int),
    ("function", jnp.sin),
    ("int-range", jnp.arange(10)),
    ("int-step-range", jnp.arange(1, 10, 2)),
    ("bool-array", jnp.array([False, True])),
    ("bool-tuple", (False, True)),
    ("empty-tuple", ()),
    ("bool-namedtuple", {"a": False, "b": True}),
    ("empty-dict", {}),
    ("pair-of-strings", ("a", "b")),
    ("cartesian-index", (2, 3)),
]


@pytest.mark.parametrize("x", [c[1] for c in NO_TANGENT], ids=[c[0] for c in NO_TANGENT])
def test_things_without_tangents(x):
    """rand_tangent.jl: "Things without sensible tangents", ranges and arrays of Bools,
    tuples and named tuples of Bools, empty ones, "all fields NoTangent implies NoTangent"."""
    assert rand_tangent(x) == NoTangent()
    assert rand_tangent(x, seed=np.random.default_rng(1)) == NoTangent()


ARRAYS = [
    ("0d-float32", jnp.asarray(RNG.standard_normal(), jnp.float32)),
    ("0d-float64", jnp.asarray(RNG.standard_normal())),
    ("vector-float32", jnp.asarray(RNG.standard_normal(3), jnp.float32)),
    ("vector-complex128", jnp.asarray(RNG.standard_normal(2) + 1j * RNG.standard_normal(2))),
    ("matrix", jnp.asarray(RNG.standard_normal((5, 4)))),
    ("matrix-complex64", jnp.asarray(RNG.standard_normal((5, 4)) + 1j, jnp.complex64)),
    ("transposed-vector", jnp.asarray(RNG.standard_normal((1, 5))).T),
    ("transposed-matrix", jnp.asarray(RNG.standard_normal((5, 4))).T),
]


@pytest.mark.parametrize("x", [c[1] for c in ARRAYS], ids=[c[0] for c in ARRAYS])
def test_arrays_get_arrays_of_their_shape_and_dtype(x):
    """rand_tangent.jl: "StridedArrays" and "Co-Arrays" (a transpose is a plain array here)."""
    t = rand_tangent(x)
    assert isinstance(t, jax.Array) and t.shape == x.shape and t.dtype == x.dtype
    assert bool(jnp.all(jnp.isfinite(t)))


def test_numbers_get_numbers():
    """rand_tangent.jl: "Numbers" (5.0 and 5.0 + 0.4im), also float subclasses (JAX's typed
    literals)."""
    assert isinstance(rand_tangent(5.0), float)
    assert isinstance(rand_tangent(5.0 + 0.4j), complex)

    class TypedFloat(float):  # like jax._src.literals.TypedFloat: more to its constructor
        def __new__(cls, value, dtype):
            return super().__new__(cls, value)

    assert isinstance(rand_tangent(TypedFloat(2.1, "float64")), float)


def test_containers_get_tangents_of_their_structure():
    """rand_tangent.jl: a Vector{Any} of a matrix and a number, "Tuples", "NamedTuples" and
    "structs" (`Bar(5.0, 4, rand(3))`, a nested `Bar`); the non-differentiable fields get
    `NoTangent()`."""
    m = jnp.asarray(RNG.standard_normal((5, 4)))
    t = rand_tangent([m, 4.0])
    assert isinstance(t, list) and t[0].shape == (5, 4) and isinstance(t[1], float)
    t = rand_tangent((4.0,))
    assert isinstance(t, tuple) and isinstance(t[0], float)
    t = rand_tangent((5.0, jnp.ones(3)))
    assert isinstance(t[0], float) and t[1].shape == (3,)
    assert isinstance(rand_tangent({"a": 4.0})["a"], float)
    t = rand_tangent({"a": 5.0, "b": 1})
    assert isinstance(t["a"], float) and t["b"] == NoTangent()
    t = rand_tangent(Bar(5.0, 4, jnp.asarray(RNG.uniform(size=3))))
    assert isinstance(t, Bar) and isinstance(t.a, float) and t.b == NoTangent() and t.c.shape == (3,)
    t = rand_tangent(Bar(4.0, 3, Bar(5.0, 2, 4)))
    assert isinstance(t.c, Bar) and isinstance(t.c.a, float) and t.c.b == NoTangent() and t.c.c == NoTangent()


def test_moving_a_struct_along_its_tangent_keeps_its_type():
    """rand_tangent.jl "compsition of addition": `x + rand_tangent(x) isa typeof(x)`, here as a
    structural `Tangent` added to the primal."""
    x = Pair(1.5, 1.1)
    t = rand_tangent(x)
    moved = x + Tangent(Pair, **t._asdict())
    assert isinstance(moved, Pair)
    assert isinstance(x + (Tangent(Pair, **t._asdict()) + Tangent(Pair, **rand_tangent(x)._asdict())), Pair)
