"""Tests for rules/_projection.py: `ProjectTo(x)(dx)` onto dtypes, shapes and pytrees."""

import gc
import weakref
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rules
from rules import NoTangent, ProjectTo, Tangent, Thunk, ZeroTangent, unthunk

DTYPES = [np.float32, np.float64, np.complex64, np.complex128]
DTYPE_IDS = ["f32", "f64", "c64", "c128"]
SHAPES = [(), (3,), (2, 3), (1, 3)]
SHAPE_IDS = ["scalar", "vector", "matrix", "row"]
DEFAULT_FLOAT = np.float64  # x64 is on in the test configuration


class Point(NamedTuple):
    x: Any
    y: Any


@jax.tree_util.register_pytree_with_keys_class
class Layer:
    """An attribute pytree: its type does not declare fields, so `Tangent(Layer, z=...)` builds."""

    def __init__(self, w, b):
        self.w, self.b = w, b

    def tree_flatten_with_keys(self):
        return ((jax.tree_util.GetAttrKey("w"), self.w), (jax.tree_util.GetAttrKey("b"), self.b)), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)


def is_complex(dtype) -> bool:
    return np.issubdtype(dtype, np.complexfloating)


def make(shape, dtype, seed=0) -> np.ndarray:
    """Deterministic values with a nonzero imaginary part for complex dtypes."""
    n = int(np.prod(shape))
    re = np.arange(1, n + 1, dtype=np.float64).reshape(shape) + 0.25 * seed
    value = re + 1j * (re + 0.5) if is_complex(dtype) else re
    return np.asarray(value, dtype=dtype)


def expected_projection(dx: np.ndarray, dtype, shape) -> np.ndarray:
    dx = np.asarray(dx)
    if is_complex(dx.dtype) and not is_complex(dtype):
        dx = dx.real
    return dx.astype(dtype).reshape(shape)


# ------------------------------------------------------------------------------------------
# Arrays: dtype and shape
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dx_dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_projection_keeps_the_primal_dtype_and_shape(dtype, shape, dx_dtype):
    x = make(shape, dtype, seed=1)
    dx = make(shape, dx_dtype)
    out = ProjectTo(x)(dx)
    chex.assert_type(out, dtype)
    chex.assert_shape(out, shape)
    chex.assert_trees_all_close(out, expected_projection(dx, dtype, shape))
    if is_complex(dtype) and not is_complex(dx_dtype):
        assert np.all(np.imag(out) == 0)


@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_projection_under_jit(dtype, shape):
    project = ProjectTo(jnp.asarray(make(shape, dtype)))
    dx = jnp.asarray(make(shape, np.complex128))
    out = jax.jit(lambda d: project(d))(dx)
    chex.assert_type(out, dtype)
    chex.assert_trees_all_close(out, project(dx))
    chex.assert_trees_all_close(out, expected_projection(dx, dtype, shape))


def test_float32_primal_stays_float32_for_a_float64_cotangent():
    out = ProjectTo(jnp.ones(3, jnp.float32))(np.array([1.0, 2.0, 3.0]))
    chex.assert_type(out, jnp.float32)
    out = ProjectTo(np.float32(1.0))(2.0)
    chex.assert_type(out, jnp.float32)


@pytest.mark.parametrize("x", [3, jnp.arange(3, dtype=jnp.int32)], ids=["python-int", "int32-array"])
@pytest.mark.parametrize("dx_dtype", [np.float32, np.complex128], ids=["f32", "c128"])
def test_int_primal_gets_the_default_float_dtype(x, dx_dtype):
    dx = make(np.shape(x), dx_dtype)
    out = ProjectTo(x)(dx)
    chex.assert_type(out, DEFAULT_FLOAT)
    chex.assert_trees_all_close(out, np.real(dx).astype(DEFAULT_FLOAT))


def test_python_scalars():
    chex.assert_type(ProjectTo(1.0)(np.float32(2.0)), DEFAULT_FLOAT)
    out = ProjectTo(1j)(2.0)
    chex.assert_type(out, np.complex128)
    assert out == 2.0 + 0j


def test_real_primal_drops_the_imaginary_part():
    out = ProjectTo(jnp.ones(2))(jnp.array([1 + 2j, 3 - 1j]))
    chex.assert_type(out, jnp.float64)
    chex.assert_trees_all_close(out, jnp.array([1.0, 3.0]))


def test_complex_primal_accepts_a_real_cotangent():
    out = ProjectTo(jnp.ones(2, jnp.complex64))(jnp.array([1.0, 2.0]))
    chex.assert_type(out, jnp.complex64)
    chex.assert_trees_all_close(out, jnp.array([1.0 + 0j, 2.0 + 0j], jnp.complex64))


@pytest.mark.parametrize(
    "x_shape, dx_shape",
    [((2, 3), (3, 2)), ((3,), (4,)), ((3,), ()), ((), (2,)), ((1, 3), (3, 3))],
)
def test_shape_mismatch_raises_with_both_shapes(x_shape, dx_shape):
    with pytest.raises(rules.ProjectionError) as info:
        ProjectTo(jnp.ones(x_shape))(jnp.ones(dx_shape))
    message = str(info.value)
    assert f"shape {x_shape}" in message
    assert f"shape {dx_shape}" in message
    assert issubclass(rules.ProjectionError, rules.RuleError)


@pytest.mark.parametrize(
    "x_shape, dx_shape",
    [((3,), (1, 3)), ((3,), (3, 1)), ((), (1,)), ((), (1, 1)), ((1, 3), (3,)), ((2, 1, 3), (2, 3))],
)
def test_trivial_dimensions_are_reshaped(x_shape, dx_shape):
    dx = make(dx_shape, np.float64)
    out = ProjectTo(jnp.ones(x_shape))(dx)
    chex.assert_shape(out, x_shape)
    chex.assert_trees_all_close(out, dx.reshape(x_shape))


def test_non_array_cotangent_for_an_array_primal_raises():
    with pytest.raises(rules.ProjectionError, match="array cotangent"):
        ProjectTo(jnp.ones(2))(Tangent(Point, x=1.0))
    with pytest.raises(rules.ProjectionError):
        ProjectTo(jnp.ones(2))("not a cotangent")


# ------------------------------------------------------------------------------------------
# Zeros, NotImplementedTangent, thunks
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "x",
    [1.0, jnp.ones(3, jnp.float32), {"a": 1.0}, Point(1.0, 2.0)],
    ids=["float", "array", "dict", "namedtuple"],
)
def test_special_tangents_pass_through_unchanged(x):
    nit = rules.not_implemented("a gap")
    project = ProjectTo(x)
    assert project(ZeroTangent()) is ZeroTangent()
    assert project(NoTangent()) is NoTangent()
    assert project(nit) is nit


def test_thunk_stays_lazy_and_its_value_is_projected():
    calls = []

    def dx():
        calls.append(1)
        return np.array([[1.0 + 1j, 2.0, 3.0]])

    out = ProjectTo(jnp.ones(3, jnp.float32))(Thunk(dx))
    assert isinstance(out, rules.AbstractThunk)
    assert calls == []
    value = unthunk(out)
    assert calls == [1]
    chex.assert_type(value, jnp.float32)
    chex.assert_trees_all_close(value, jnp.array([1.0, 2.0, 3.0], jnp.float32))


# ------------------------------------------------------------------------------------------
# Pytrees
# ------------------------------------------------------------------------------------------


def test_dict_projected_leaf_by_leaf():
    x = {"a": jnp.ones(2, jnp.float32), "b": jnp.ones((), jnp.float64), "n": 3, "flag": True}
    dx = {"a": np.array([1.0, 2.0]), "b": np.array([5.0]), "n": np.float32(1.5), "flag": 1.0}
    out = ProjectTo(x)(dx)
    assert set(out) == {"a", "b", "n", "flag"}
    chex.assert_type([out["a"], out["b"], out["n"]], [jnp.float32, jnp.float64, DEFAULT_FLOAT])
    chex.assert_shape(out["b"], ())
    chex.assert_trees_all_close(out["a"], jnp.array([1.0, 2.0], jnp.float32))
    assert out["flag"] is NoTangent()


def test_namedtuple_primal_with_a_tangent_cotangent():
    x = Point(jnp.ones(2, jnp.float32), 1.0)
    out = ProjectTo(x)(Tangent(Point, x=jnp.array([1.0 + 1j, 2.0])))
    assert isinstance(out, Tangent) and out.primal_type is Point
    chex.assert_type(out.x, jnp.float32)
    chex.assert_trees_all_close(out.x, jnp.array([1.0, 2.0], jnp.float32))
    assert out.y is ZeroTangent()


def test_namedtuple_primal_with_a_namedtuple_cotangent():
    out = ProjectTo(Point(jnp.ones(2, jnp.float32), 1.0))(Point(np.ones(2), np.float32(2.0)))
    assert type(out) is Point
    chex.assert_type([out.x, out.y], [jnp.float32, DEFAULT_FLOAT])


def test_tuple_primal_with_a_tuple_tangent():
    out = ProjectTo((1.0, np.float32(2.0)))(Tangent(tuple, 1.0, 2.0))
    assert isinstance(out, Tangent) and out.primal_type is tuple
    chex.assert_type([out[0], out[1]], [DEFAULT_FLOAT, jnp.float32])


def test_nested_pytree():
    x = {"p": Point(jnp.ones(2, jnp.float32), (1.0, 2))}
    dx = {"p": Point(np.ones((1, 2)), (3.0, 4.0))}
    out = ProjectTo(x)(dx)
    chex.assert_type([out["p"].x, out["p"].y[0], out["p"].y[1]], [jnp.float32, DEFAULT_FLOAT, DEFAULT_FLOAT])
    chex.assert_shape(out["p"].x, (2,))


@pytest.mark.parametrize(
    "x, dx",
    [
        ({"a": 1.0}, Tangent(dict, {"a": 1.0, "zz": 2.0})),
        ((1.0, 2.0), Tangent(tuple, 1.0, 2.0, 3.0)),
        (Layer(1.0, 2.0), Tangent(Layer, z=1.0)),
    ],
    ids=["dict", "tuple", "attribute-pytree"],
)
def test_tangent_with_an_unknown_field_raises(x, dx):
    with pytest.raises(rules.ProjectionError, match="unknown fields"):
        ProjectTo(x)(dx)


def test_cotangent_with_a_different_structure_raises():
    with pytest.raises(rules.ProjectionError, match="structure"):
        ProjectTo({"a": 1.0})({"b": 1.0})


def test_pytree_projection_under_jit():
    x = {"a": jnp.ones(2, jnp.float32), "b": Point(1.0, jnp.ones((), jnp.complex64))}
    project = ProjectTo(x)
    dx = {"a": jnp.ones((1, 2)), "b": Point(jnp.asarray(2.0), jnp.asarray(1.0))}
    out = jax.jit(lambda d: project(d))(dx)
    chex.assert_type([out["a"], out["b"].x, out["b"].y], [jnp.float32, DEFAULT_FLOAT, jnp.complex64])
    chex.assert_trees_all_close(out, project(dx))


# ------------------------------------------------------------------------------------------
# Non-differentiable primals; no reference to the primal
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "x",
    [True, np.bool_(False), "text", None, jnp.sin, lambda v: v, jnp.array([True, False])],
    ids=["bool", "np.bool_", "str", "None", "function", "lambda", "bool-array"],
)
def test_non_differentiable_primals_project_to_no_tangent(x):
    project = ProjectTo(x)
    assert project(1.0) is NoTangent()
    assert project(jnp.ones(2)) is NoTangent()
    assert project(ZeroTangent()) is NoTangent()


@pytest.mark.parametrize(
    "make_primal, get_array",
    [
        (lambda: np.ones(3), lambda x: x),
        (lambda: np.ones(3, np.float32), lambda x: x),
        (lambda: {"a": np.ones(3), "b": (np.ones(2), 1.0)}, lambda x: x["b"][0]),
    ],
    ids=["array", "float32-array", "pytree"],
)
def test_projector_keeps_no_reference_to_the_primal(make_primal, get_array):
    x = make_primal()
    ref = weakref.ref(get_array(x))
    project = ProjectTo(x)
    del x
    gc.collect()
    assert ref() is None
    assert project is not None  # the projector itself is still alive


# ------------------------------------------------------------------------------------------
# Properties
# ------------------------------------------------------------------------------------------


def _trivial_variants(shape):
    """Shapes a cotangent for `shape` may have: itself and with a leading or trailing 1."""
    return [shape, (1, *shape), (*shape, 1)]


@st.composite
def primal_and_cotangent(draw):
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(st.sampled_from(SHAPES))
    dx_dtype = draw(st.sampled_from(DTYPES))
    dx_shape = draw(st.sampled_from(_trivial_variants(shape)))
    n = int(np.prod(dx_shape))
    finite = st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False, width=32)
    re = np.array(draw(st.lists(finite, min_size=n, max_size=n)), dtype=np.float64).reshape(dx_shape)
    im = np.array(draw(st.lists(finite, min_size=n, max_size=n)), dtype=np.float64).reshape(dx_shape)
    dx = (re + 1j * im if is_complex(dx_dtype) else re).astype(dx_dtype)
    return np.zeros(shape, dtype), dx


@settings(max_examples=30, deadline=None)
@given(primal_and_cotangent())
def test_projection_is_idempotent(pair):
    x, dx = pair
    project = ProjectTo(x)
    once = project(dx)
    twice = project(once)
    assert once.dtype == twice.dtype == x.dtype
    assert once.shape == twice.shape == x.shape
    np.testing.assert_array_equal(np.asarray(twice), np.asarray(once))
