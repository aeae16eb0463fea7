"""Tests for rules/testing/_finite_differences.py: methods, extrapolation, to_vec, fd_*."""

import math
from fractions import Fraction
from typing import NamedTuple

import jax

jax.config.update("jax_enable_x64", True)  # the conftest does this too; kept for direct runs

import chex  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import rules.testing._finite_differences as fd_module  # noqa: E402
from rules.testing import (  # noqa: E402
    FDMethod,
    backward_fdm,
    central_fdm,
    extrapolate_fdm,
    fd_jacobian,
    fd_jvp,
    fd_vjp,
    forward_fdm,
    to_vec,
)

RTOL = 1e-8


# ------------------------------------------------------------------------------------------
# Scalar methods
# ------------------------------------------------------------------------------------------


def test_central_fdm_first_derivative_of_sin_to_1e_12():
    assert abs(central_fdm(5, 1)(jnp.sin, 1.0) - math.cos(1.0)) < 1e-12


@pytest.mark.parametrize("make", [forward_fdm, backward_fdm])
def test_one_sided_first_derivative_of_sin(make):
    assert abs(make(5, 1)(jnp.sin, 1.0) - math.cos(1.0)) < 1e-9


@pytest.mark.parametrize("f, d2", [(jnp.sin, -math.sin(1.0)), (jnp.exp, math.e)])
def test_central_fdm_second_derivative_to_1e_8(f, d2):
    assert abs(central_fdm(5, 2)(f, 1.0) - d2) < 1e-8


def test_call_accepts_0d_arrays_ints_and_a_fixed_step():
    m = central_fdm(5, 1)
    assert abs(m(jnp.sin, jnp.asarray(1.0, jnp.float32)) - math.cos(1.0)) < 1e-6
    assert abs(m(jnp.sin, 1) - math.cos(1.0)) < 1e-12
    assert abs(m(jnp.sin, 1.0, step=1e-3) - math.cos(1.0)) < 1e-11


def test_estimate_step_returns_step_and_honest_error():
    step, err = central_fdm(5, 1).estimate_step(jnp.exp, 0.0)
    assert 1e-5 < step < 1e-1
    assert abs(central_fdm(5, 1)(jnp.exp, 0.0, step=step) - 1.0) <= err


@pytest.mark.parametrize("p", [2, 3])
def test_extrapolate_fdm_accurate_and_error_estimate_honest(p):
    estimate, err = extrapolate_fdm(central_fdm(p, 1), jnp.sin, 1.0)
    true_err = abs(estimate - math.cos(1.0))
    assert true_err < 1e-12
    assert err < 1e-11
    assert true_err <= 10 * err


def test_extrapolate_fdm_one_sided_and_tolerance_stop():
    estimate, err = extrapolate_fdm(forward_fdm(2, 1), jnp.exp, 0.5, rtol=1e-6)
    assert abs(estimate - math.exp(0.5)) < 1e-5
    assert err <= 1e-6 * abs(estimate)


# ------------------------------------------------------------------------------------------
# Grids and exact coefficients
# ------------------------------------------------------------------------------------------


def test_coefficients_exact():
    assert central_fdm(3, 1).coefs == (-0.5, 0.0, 0.5)
    assert central_fdm(3, 1).exact_coefs == (Fraction(-1, 2), Fraction(0), Fraction(1, 2))
    assert central_fdm(3, 2).coefs == (1.0, -2.0, 1.0)
    five_point = tuple(map(Fraction, ["1/12", "-2/3", "0", "2/3", "-1/12"]))
    assert central_fdm(5, 1).exact_coefs == five_point
    assert forward_fdm(2, 1).coefs == (-1.0, 1.0)
    assert backward_fdm(3, 1).exact_coefs == (Fraction(1, 2), Fraction(-2), Fraction(3, 2))


def test_grids_follow_finite_differences_jl():
    assert central_fdm(5, 1).grid == (-2, -1, 0, 1, 2)
    assert central_fdm(4, 1).grid == (-2, -1, 1, 2)  # even p skips 0
    assert central_fdm(4, 1).exact_coefs == tuple(map(Fraction, ["1/12", "-2/3", "2/3", "-1/12"]))
    assert forward_fdm(4, 2).grid == (0, 1, 2, 3)
    assert backward_fdm(4, 2).grid == (-3, -2, -1, 0)


@pytest.mark.parametrize("make", [central_fdm, forward_fdm, backward_fdm])
@pytest.mark.parametrize("p, q", [(2, 1), (5, 3), (8, 2), (11, 4)])
def test_coefficients_solve_the_moment_equations_exactly(make, p, q):
    m = make(p, q)
    for k in range(p):
        moment = sum(c * Fraction(g) ** k for g, c in zip(m.grid, m.exact_coefs))
        assert moment == (math.factorial(q) if k == q else 0)


def test_repr_names_the_method():
    assert repr(central_fdm(3, 2, adapt=0)) == (
        "<FDMethod central_fdm(3, 2): grid=(-1, 0, 1), coefs=(1, -2, 1), adapt=0>"
    )
    assert isinstance(central_fdm(3, 1), FDMethod)


def test_p_not_above_q_raises_with_message():
    with pytest.raises(ValueError, match=r"central_fdm.*p > q.*p=2, q=2.*p >= 3"):
        central_fdm(2, 2)
    with pytest.raises(ValueError, match=r"forward_fdm.*p > q"):
        forward_fdm(1, 3)


@pytest.mark.parametrize(
    "kwargs, error, pattern",
    [
        (dict(p=5.0, q=1), TypeError, "`p` must be an int"),
        (dict(p=5, q=-1), ValueError, "`q` must be >= 0"),
        (dict(p=5, q=1, adapt=-1), ValueError, "`adapt` must be >= 0"),
        (dict(p=5, q=1, max_range=-1.0), ValueError, "`max_range` must be >= 0"),
        (dict(p=5, q=1, factor=-1.0), ValueError, "`factor` must be positive"),
    ],
)
def test_bad_method_arguments_raise(kwargs, error, pattern):
    with pytest.raises(error, match=pattern):
        central_fdm(**kwargs)


def test_max_range_keeps_every_evaluation_inside_the_domain():
    seen = []

    def log_or_nan(x):
        jax.debug.callback(lambda v: seen.append(float(v)), x)
        return jnp.where(x > 0, jnp.log(jnp.where(x > 0, x, 1.0)), jnp.nan)

    x = 1e-3
    m = central_fdm(5, 1, max_range=5e-4)
    assert abs(m(log_or_nan, x) * x - 1.0) < 1e-6
    assert seen and min(seen) > 0 and max(abs(np.array(seen) - x)) <= 5e-4 * (1 + 1e-12)


def test_scalar_method_rejects_non_scalar_output_and_input():
    with pytest.raises(TypeError, match="real scalar.*fd_jacobian"):
        central_fdm(5, 1)(lambda x: jnp.stack([x, x]), 1.0)
    with pytest.raises(TypeError, match="`x` must be a real scalar"):
        central_fdm(5, 1)(jnp.sin, jnp.ones(2))


# ------------------------------------------------------------------------------------------
# to_vec
# ------------------------------------------------------------------------------------------


class Pair(NamedTuple):
    a: jax.Array
    b: object


def _assert_same_tree(got, want):
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        if isinstance(w, (bool, int, str)):
            assert g == w and type(g) is type(w)
        else:
            assert np.shape(g) == np.shape(w)
            assert np.asarray(g).dtype == np.asarray(w).dtype
            np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


@pytest.mark.parametrize(
    "tree, size",
    [
        ({"x": jnp.arange(3.0), "y": (jnp.ones((2, 2)), 1.5)}, 8),
        ((jnp.ones(2, jnp.float32), [jnp.zeros((1, 3)), 2.0]), 6),
        (Pair(jnp.arange(4.0).reshape(2, 2), {"n": 3, "s": "name"}), 4),
        ({"z": jnp.array([1 + 2j, 3 - 4j], jnp.complex64), "k": jnp.arange(3)}, 4),
    ],
)
def test_to_vec_round_trips(tree, size):
    v, from_vec = to_vec(tree)
    assert v.shape == (size,) and v.dtype == jnp.float64
    _assert_same_tree(from_vec(v), tree)

    def summary(t):
        return [(np.shape(x), getattr(x, "dtype", type(x))) for x in jax.tree_util.tree_leaves(t)]

    inside = []  # under jit, from_vec sees a tracer; record what it rebuilds

    def round_trip(v):
        rebuilt = from_vec(v)
        inside.append(summary(rebuilt))
        return to_vec(rebuilt)[0]

    np.testing.assert_array_equal(jax.jit(round_trip)(v), v)
    assert inside == [summary(from_vec(v))]


def test_to_vec_complex_is_interleaved_and_float32_kept():
    v, from_vec = to_vec((jnp.array([1 + 2j, 3 + 4j]), jnp.array([5.0], jnp.float32)))
    np.testing.assert_array_equal(v, [1.0, 2.0, 3.0, 4.0, 5.0])
    z, w = from_vec(v + 1)
    assert z.dtype == jnp.complex128 and w.dtype == jnp.float32
    np.testing.assert_array_equal(z, [2 + 3j, 4 + 5j])


def test_to_vec_excludes_and_preserves_int_and_bool_leaves():
    tree = {"i": jnp.arange(3), "b": jnp.array([True, False]), "n": 7, "x": 2.0}
    v, from_vec = to_vec(tree)
    np.testing.assert_array_equal(v, [2.0])
    back = from_vec(jnp.array([5.0]))
    assert back["n"] == 7 and back["i"] is tree["i"] and back["b"] is tree["b"]
    assert back["x"].dtype == jnp.float64 and float(back["x"]) == 5.0


def test_from_vec_under_vmap_and_wrong_length():
    v, from_vec = to_vec({"a": jnp.ones(2, jnp.float32), "z": 1j})
    batch = jax.vmap(from_vec)(jnp.stack([v, 2 * v]))
    assert batch["a"].shape == (2, 2) and batch["a"].dtype == jnp.float32
    np.testing.assert_array_equal(batch["z"], [1j, 2j])
    with pytest.raises(ValueError, match=r"from_vec.*\(4,\).*\(3,\)"):
        from_vec(jnp.ones(3))


_DTYPES = [np.float32, np.float64, np.complex64, np.complex128, np.int32, np.bool_]


@st.composite
def _leaves(draw):
    shape = tuple(draw(st.lists(st.integers(0, 3), max_size=3)))
    dtype = draw(st.sampled_from(_DTYPES))
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    value = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        value = value + 1j * rng.standard_normal(shape)
    array = np.asarray(value).astype(dtype)
    return jnp.asarray(array) if draw(st.booleans()) else array


_trees = st.recursive(
    _leaves() | st.floats(-1e3, 1e3) | st.integers(-5, 5),
    lambda children: st.lists(children, max_size=3)
    | st.tuples(children, children)
    | st.dictionaries(st.sampled_from("abc"), children, max_size=3),
    max_leaves=6,
)


@settings(max_examples=30, deadline=None)
@given(_trees)
def test_to_vec_round_trip_property(tree):
    v, from_vec = to_vec(tree)
    expected = 0
    for leaf in jax.tree_util.tree_leaves(tree):
        kind = np.asarray(leaf).dtype.kind
        if kind in "fc" and not isinstance(leaf, (bool, int)):
            expected += np.size(leaf) * (2 if kind == "c" else 1)
    assert v.shape == (expected,) and v.dtype == jnp.float64
    back = from_vec(v)
    assert jax.tree_util.tree_structure(back) == jax.tree_util.tree_structure(tree)
    for got, want in zip(jax.tree_util.tree_leaves(back), jax.tree_util.tree_leaves(tree)):
        assert np.shape(got) == np.shape(want)
        if isinstance(want, float):
            assert got.dtype == jnp.float64
        elif not isinstance(want, int):
            assert got.dtype == want.dtype
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


# ------------------------------------------------------------------------------------------
# fd_jvp, fd_vjp, fd_jacobian against JAX
# ------------------------------------------------------------------------------------------

M = central_fdm(5, 1)
_rng = np.random.default_rng(0)
A = jnp.asarray(_rng.standard_normal((3, 4)))
B = jnp.asarray(_rng.standard_normal((4, 2)))
X = jnp.asarray(_rng.uniform(0.5, 1.5, 4))
Z = jnp.asarray(_rng.standard_normal(3) + 1j * _rng.standard_normal(3))


def _pytree_f(p, s):
    return {"u": jnp.sin(p["w"]) * s, "v": (p["w"] @ p["m"], jnp.exp(s))}


PYTREE_ARGS = ({"w": X, "m": B}, 0.7)

CASES = [
    pytest.param(lambda a, b: a @ b, (A, B), id="matmul"),
    pytest.param(lambda x: jnp.tanh(x) * jnp.log(x), (X,), id="elementwise"),
    pytest.param(_pytree_f, PYTREE_ARGS, id="pytree"),
]
WRAPS = [pytest.param(lambda f: f, id="eager"), pytest.param(jax.jit, id="jit")]


def _assert_trees_close(got, want):
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    chex.assert_trees_all_close(got, want, rtol=RTOL, atol=1e-10)


def _random_like(tree, seed):
    rng = np.random.default_rng(seed)
    return jax.tree_util.tree_map(lambda x: jnp.asarray(rng.standard_normal(np.shape(x))), tree)


@pytest.mark.parametrize("wrap", WRAPS)
@pytest.mark.parametrize("f, args", CASES)
def test_fd_jvp_matches_jax_jvp(f, args, wrap):
    tangents = _random_like(args, 1)
    _, want = jax.jvp(f, args, tangents)
    got = fd_jvp(M, wrap(f), args, tangents)
    _assert_trees_close(got, want)


@pytest.mark.parametrize("wrap", WRAPS)
@pytest.mark.parametrize("f, args", CASES)
def test_fd_vjp_matches_jax_vjp(f, args, wrap):
    y, pullback = jax.vjp(f, *args)
    y_bar = _random_like(y, 2)
    got = fd_vjp(M, wrap(f), y_bar, args)
    assert isinstance(got, tuple) and len(got) == len(args)
    _assert_trees_close(got, pullback(y_bar))


@pytest.mark.parametrize("wrap", WRAPS)
@pytest.mark.parametrize("f, args", CASES)
def test_fd_jacobian_matches_jax_jacfwd(f, args, wrap):
    got = fd_jacobian(M, wrap(f), *args)
    _, from_vec = to_vec(args)
    flat = lambda v: to_vec(f(*from_vec(v)))[0]  # noqa: E731
    want = jax.jacfwd(flat)(to_vec(args)[0])
    assert isinstance(got, tuple) and len(got) == len(args)
    np.testing.assert_allclose(np.concatenate(got, axis=1), want, rtol=RTOL, atol=1e-10)
    assert [j.shape[1] for j in got] == [to_vec(a)[0].size for a in args]


def test_complex_jvp_is_the_complex_derivative():
    z_dot = jnp.asarray(_rng.standard_normal(3) + 1j * _rng.standard_normal(3))
    got = fd_jvp(M, lambda z: z**2, (Z,), (z_dot,))
    assert got.dtype == np.complex128
    np.testing.assert_allclose(got, 2 * Z * z_dot, rtol=RTOL)


def test_complex_vjp_follows_chainrules_convention():
    y_bar = jnp.asarray(_rng.standard_normal(3) + 1j * _rng.standard_normal(3))
    (got,) = fd_vjp(M, lambda z: z**2, y_bar, (Z,))
    _, pullback = jax.vjp(lambda z: z**2, Z)
    (jax_bar,) = pullback(jnp.conj(y_bar))
    np.testing.assert_allclose(got, jnp.conj(jax_bar), rtol=RTOL)  # = y_bar * conj(2 z)
    np.testing.assert_allclose(got, y_bar * jnp.conj(2 * Z), rtol=RTOL)
    (grad,) = fd_vjp(M, lambda z: jnp.abs(z) ** 2, 1.0, (1 + 2j,))
    np.testing.assert_allclose(grad, 2 + 4j, rtol=RTOL)  # dl/dRe z + i dl/dIm z


def test_complex_jacobian_counts_real_and_imaginary_parts():
    (jac,) = fd_jacobian(M, lambda z: z**2, Z)
    assert jac.shape == (6, 6)
    re, im = np.real(2 * Z), np.imag(2 * Z)  # d(z^2) = 2z dz as a real 2x2 block per entry
    for k in range(3):
        block = jac[2 * k : 2 * k + 2, 2 * k : 2 * k + 2]
        np.testing.assert_allclose(block, [[re[k], -im[k]], [im[k], re[k]]], rtol=RTOL)


def test_float32_inputs_are_differenced_in_float64():
    x = jnp.asarray([0.3, 0.9], jnp.float32)
    (jac,) = fd_jacobian(M, jnp.sin, x)
    assert jac.dtype == np.float64
    want = np.diag(np.cos(np.asarray(x, np.float64)))
    np.testing.assert_allclose(jac, want, rtol=1e-10, atol=1e-12)
    y_dot = fd_jvp(M, lambda x: x.astype(jnp.float32) * 2, (x,), (jnp.ones(2, jnp.float32),))
    assert y_dot.dtype == np.float64


def test_non_perturbable_arguments_and_outputs():
    f = lambda x, n: (x * n, n)  # noqa: E731
    x, n = jnp.arange(1.0, 4.0), jnp.arange(3)
    jx, jn = fd_jacobian(M, f, x, n)
    assert jx.shape == (3, 3) and jn.shape == (3, 0)
    x_bar, n_bar = fd_vjp(M, f, (jnp.ones(3), None), (x, n))
    np.testing.assert_allclose(x_bar, [0.0, 1.0, 2.0], atol=1e-10)
    assert n_bar.dtype == jax.dtypes.float0 and n_bar.shape == (3,)
    y_dot, n_dot = fd_jvp(M, f, (x, n), (jnp.ones(3), None))
    np.testing.assert_allclose(y_dot, [0.0, 1.0, 2.0], atol=1e-10)
    assert n_dot.dtype == jax.dtypes.float0


# ------------------------------------------------------------------------------------------
# One batched evaluation, x64, errors
# ------------------------------------------------------------------------------------------


def _counting(f):
    traces = []

    def counted(*args):
        traces.append(1)
        return f(*args)

    return counted, traces


def test_fd_jacobian_traces_f_once_for_the_step_and_the_stencil():
    f, traces = _counting(lambda a, b: jnp.tanh(a @ b))
    fd_jacobian(M, f, A, B)  # 20 input directions x 4 stencil points
    assert len(traces) == 1  # f's jaxpr serves both batched evaluations
    f, traces = _counting(lambda a, b: jnp.tanh(a @ b))
    fd_jacobian(M, f, A, B, step=1e-3)
    assert len(traces) == 1


@pytest.mark.parametrize("adapt", [0, 1, 2])
def test_fd_jvp_and_fd_vjp_trace_f_once(adapt):
    m = central_fdm(5, 1, adapt=adapt)
    f, traces = _counting(lambda x: jnp.sin(x) * x)
    fd_jvp(m, f, (X,), (jnp.ones(4),))
    assert len(traces) == 1  # step selection and stencil share one padded batch shape
    f, traces = _counting(lambda x: jnp.sin(x) * x)
    fd_vjp(m, f, jnp.ones(4), (X,))
    assert len(traces) == 1


# ------------------------------------------------------------------------------------------
# Large batches: point by point, each point one call of a compiled evaluation reduced on the device
# ------------------------------------------------------------------------------------------


@pytest.fixture
def looped(monkeypatch):
    """Treat every batch along a direction as large, so it runs point by point."""
    monkeypatch.setattr(fd_module, "_VMAP_ELEMENTS", 0)


@pytest.mark.parametrize("f, args", CASES)
def test_large_batch_loop_matches_jax(f, args, looped):
    tangents = _random_like(args, 1)
    _assert_trees_close(fd_jvp(M, f, args, tangents), jax.jvp(f, args, tangents)[1])
    y, pullback = jax.vjp(f, *args)
    y_bar = _random_like(y, 2)
    _assert_trees_close(fd_vjp(M, f, y_bar, args), pullback(y_bar))
    flat = lambda v: to_vec(f(*to_vec(args)[1](v)))[0]  # noqa: E731
    got = np.concatenate(fd_jacobian(M, f, *args), axis=1)
    np.testing.assert_allclose(got, jax.jacfwd(flat)(to_vec(args)[0]), rtol=RTOL, atol=1e-10)


def test_large_batch_loop_complex(looped):
    z_dot = jnp.asarray(_rng.standard_normal(3) + 1j * _rng.standard_normal(3))
    got = fd_jvp(M, lambda z: z**2, (Z,), (z_dot,))
    assert got.dtype == np.complex128
    np.testing.assert_allclose(got, 2 * Z * z_dot, rtol=RTOL)


def test_large_batch_loop_gives_the_same_step_and_estimate(monkeypatch):
    f = lambda x: jnp.tanh(x) * jnp.log(x)  # noqa: E731
    # its own generator: the shared one's state depends on which tests ran before
    tangents = (jnp.asarray(np.random.default_rng(11).standard_normal(4)),)
    small = fd_jvp(M, f, (X,), tangents)
    scalar_small = central_fdm(5, 1).estimate_step(jnp.exp, 0.3)
    monkeypatch.setattr(fd_module, "_VMAP_ELEMENTS", 0)
    # the same step and stencil; the loop reduces on the device in another order, so the
    # estimates agree to rounding of the differences (~1e-12), not bit for bit
    np.testing.assert_allclose(fd_jvp(M, f, (X,), tangents), small, rtol=1e-10, atol=1e-15)
    scalar_large = central_fdm(5, 1).estimate_step(jnp.exp, 0.3)
    np.testing.assert_allclose(scalar_large, scalar_small, rtol=1e-12)
    assert abs(central_fdm(5, 1)(jnp.sin, 1.0) - math.cos(1.0)) < 1e-12
    estimate, err = extrapolate_fdm(central_fdm(2, 1), jnp.sin, 1.0)
    assert abs(estimate - math.cos(1.0)) < 1e-12 and err < 1e-11


@pytest.mark.parametrize(
    # adapt=1: the step's 7-point estimate of f^(5), then the 4 points with nonzero weight;
    # adapt=2: first a 9-point estimate of f^(7). Small batches are padded to the largest.
    "adapt, small, large", [(0, 4, 4), (1, 7 + 7, 7 + 4), (2, 9 + 9 + 9, 9 + 7 + 4)]
)
def test_large_batch_loop_evaluates_no_padding(adapt, small, large, monkeypatch):
    calls = []

    def f(x):
        jax.debug.callback(lambda v: calls.append(1), x[0])  # once per point, also under vmap
        return jnp.sin(x) * x

    m = central_fdm(5, 1, adapt=adapt)
    fd_jvp(m, f, (X,), (jnp.ones(4),))
    jax.effects_barrier()
    assert len(calls) == small  # small batches: the stencil is padded to the step's batch
    calls.clear()
    monkeypatch.setattr(fd_module, "_VMAP_ELEMENTS", 0)
    traced, traces = _counting(f)
    fd_jvp(m, traced, (X,), (jnp.ones(4),))
    jax.effects_barrier()
    assert len(calls) == large and len(traces) == 1  # one compiled point, real points only


@pytest.mark.parametrize("method", ["_along", "_point"])
def test_several_directions_share_one_trace_and_one_compiled_evaluation(method, monkeypatch, count_compiles):
    if method == "_point":
        monkeypatch.setattr(fd_module, "_VMAP_ELEMENTS", 0)
    compiled = count_compiles(method)
    f, traces = _counting(lambda a, b: jnp.tanh(a @ b))
    directions = [_random_like((A, B), seed) for seed in (3, 4, 5)]
    got = fd_module._fd_jvps("fd_jvp", M, f, (A, B), directions, None)
    assert len(traces) == 1 and len(compiled) == 1
    for y_dot, tangents in zip(got, directions):
        np.testing.assert_allclose(y_dot, fd_jvp(M, f, (A, B), tangents), rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(y_dot, jax.jvp(f, (A, B), tangents)[1], rtol=RTOL, atol=1e-10)


@pytest.mark.parametrize("large", [False, True])
def test_fd_jvp_of_a_constant_function_is_exactly_zero(large, monkeypatch):
    if large:
        monkeypatch.setattr(fd_module, "_VMAP_ELEMENTS", 0)
    y_dot = fd_jvp(M, lambda x, c: (c * 1.7 + 0.1, jnp.sum(x) * 0 + 3.0), (X, jnp.ones(3)),
                   (jnp.ones(4), jnp.zeros(3)))
    assert all(np.all(np.asarray(leaf) == 0) for leaf in jax.tree_util.tree_leaves(y_dot))


def test_x64_disabled_globally_still_differences_in_float64():
    with jax.enable_x64(False):
        assert abs(central_fdm(5, 1)(jnp.sin, 1.0) - math.cos(1.0)) < 1e-12
        x = np.array([0.3, 0.9], np.float32)
        (jac,) = fd_jacobian(M, jnp.sin, x)
        assert jac.dtype == np.float64
        want = np.diag(np.cos(x.astype(np.float64)))
        np.testing.assert_allclose(jac, want, rtol=1e-10, atol=1e-12)


def test_fd_errors_name_function_argument_and_fix():
    with pytest.raises(TypeError, match=r"fd_jvp.*`args` must be a tuple.*\(x,\)"):
        fd_jvp(M, jnp.sin, X, (X,))
    with pytest.raises(ValueError, match=r"fd_jvp.*`tangents`.*\[0\]\['w'\]"):
        fd_jvp(M, _pytree_f, PYTREE_ARGS, ({"w": jnp.ones(3), "m": B}, 1.0))
    with pytest.raises(ValueError, match=r"fd_vjp.*`y_bar`.*output"):
        fd_vjp(M, jnp.sin, jnp.ones(3), (X,))
    with pytest.raises(ValueError, match=r"fd_jacobian.*q=1.*got q=2"):
        fd_jacobian(central_fdm(5, 2), jnp.sin, X)
    with pytest.raises(TypeError, match=r"extrapolate_fdm.*`m` must be an FDMethod"):
        extrapolate_fdm(jnp.sin, jnp.sin, 1.0)


def _random_complex_like(tree, seed):
    rng = np.random.default_rng(seed)
    return jax.tree_util.tree_map(lambda x: jnp.asarray(rng.standard_normal(np.shape(x)) + 1j * rng.standard_normal(np.shape(x))), tree)


@pytest.mark.parametrize("large", [False, True])
@pytest.mark.parametrize("f, args", CASES + [pytest.param(lambda z: jnp.sin(z) * z, (Z,), id="complex")])
def test_fd_inner_jvps_is_y_bar_dot_jvp(f, args, large, monkeypatch):
    """Re`<y_bar, J x_dot>` along several directions: one trace, and it equals JAX's."""
    if large:
        monkeypatch.setattr(fd_module, "_VMAP_ELEMENTS", 0)
    counted, traces = _counting(f)
    y = f(*args)
    like = _random_complex_like if any(jnp.iscomplexobj(l) for l in jax.tree_util.tree_leaves(y)) else _random_like
    y_bar = like(y, 7)
    directions = [like(args, seed) for seed in (8, 9)]
    got = fd_module._fd_inner_jvps("test", M, counted, args, directions, y_bar)
    assert len(traces) == 1
    for value, tangents in zip(got, directions):
        jv = jax.jvp(f, args, tangents)[1]
        want = sum(float(np.sum(np.real(np.conj(np.asarray(a)) * np.asarray(b))))
                   for a, b in zip(jax.tree_util.tree_leaves(y_bar), jax.tree_util.tree_leaves(jv)))
        assert abs(value - want) <= 1e-9 * max(1.0, abs(want))


def test_fd_inner_jvps_checks_y_bar_against_the_output():
    with pytest.raises(ValueError, match="`y_bar` must match the output of f"):
        fd_module._fd_inner_jvps("test", M, jnp.sin, (X,), [(jnp.ones(4),)], jnp.ones(3))


@pytest.mark.parametrize("large", [False, True])
def test_a_second_call_on_the_same_function_reuses_the_compiled_evaluation(large, monkeypatch, count_compiles):
    """Every call traces f anew; the evaluation's compilation is reused where the program is
    the same: the fixed int argument (a fresh array each call, another value the third
    time) is an argument of the compiled evaluation, so all three calls and another function
    computing the same run one compilation, each with its own values; a function computing
    something else is compiled anew."""
    if large:
        monkeypatch.setattr(fd_module, "_VMAP_ELEMENTS", 0)
    compiled = count_compiles("_point" if large else "_along")

    def f(x, k):
        return jnp.sin(x) * k

    for k in ([1, 2, 3, 4], [1, 2, 3, 4], [5, -6, 7, 8]):
        k = jnp.asarray(k)
        got = fd_jvp(M, f, (X, k), (jnp.ones(4), None))
        np.testing.assert_allclose(got, jnp.cos(X) * k, rtol=RTOL)
    g = lambda x, k: jnp.sin(x) * k  # noqa: E731  - another function, the same program
    np.testing.assert_allclose(fd_jvp(M, g, (X, k), (jnp.ones(4), None)), jnp.cos(X) * k, rtol=RTOL)
    assert len(compiled) == 1
    h = lambda x, k: jnp.cos(x) * k  # noqa: E731  - another program: compiled anew
    np.testing.assert_allclose(fd_jvp(M, h, (X, k), (jnp.ones(4), None)), -jnp.sin(X) * k, rtol=RTOL)
    assert len(compiled) == 2


def test_numpy_code_gets_an_error_that_names_rules_external():
    def f(x):
        return np.sin(np.asarray(x))  # NumPy on a traced value

    with pytest.raises(TypeError, match=r"`fd_jvp`: f cannot be traced by JAX.*rules\.external") as info:
        fd_jvp(M, f, (X,), (jnp.ones(4),))
    assert isinstance(info.value.__cause__, jax.errors.TracerArrayConversionError)

    def g(x):
        return x if float(x[0]) > 0 else -x  # Python control flow on a traced value

    with pytest.raises(TypeError, match="ConcretizationTypeError"):
        fd_vjp(M, g, jnp.ones(4), (X,))


# ------------------------------------------------------------------------------------------
# Parity with FiniteDifferences.jl (issue 13): one step per coordinate, custom grids, limits
# ------------------------------------------------------------------------------------------


def _projector(a):
    """The projector onto the eigenvector of the smallest eigenvalue of sym(a): smooth, with
    high derivatives that grow as the gap to the next eigenvalue closes."""
    _, v = jnp.linalg.eigh((a + a.T) / 2)
    return jnp.outer(v[:, 0], v[:, 0])


def test_each_coordinate_gets_its_own_step():
    """An ill-conditioned input (eigenvalues 1 and 1.1 of a 6x6 matrix): a step chosen for
    each coordinate, as FiniteDifferences.jl's jacobian does, keeps fd_vjp and fd_jacobian
    to ~1e-12; one step shared along a random direction lost four digits (1.7e-9)."""
    rng = np.random.default_rng(0)
    noise = rng.standard_normal((6, 6)) * 0.01
    a = np.diag([1.0, 1.1, 3.0, 3.5, 4.0, 5.0]) + (noise + noise.T) / 2
    y, pullback = jax.vjp(_projector, jnp.asarray(a))
    y_bar = rng.standard_normal(y.shape)
    (exact,) = pullback(jnp.asarray(y_bar))
    (got,) = fd_vjp(M, _projector, y_bar, (a,))
    assert np.linalg.norm(got - exact) / np.linalg.norm(exact) < 1e-11
    (jac,) = fd_jacobian(M, _projector, a)
    exact_jac = jax.jacfwd(_projector)(jnp.asarray(a)).reshape(36, 36)
    assert np.linalg.norm(jac - exact_jac) / np.linalg.norm(exact_jac) < 1e-10


def test_a_step_rule_whose_points_leave_the_domain_shrinks_them():
    """arccos near 1: the 7 points that estimate f^(5) at the default step reach past 1 (nan);
    their step shrinks until they fit, so the step is fitted, not the default guess."""
    x = np.array([0.99, -0.98, 0.97])
    exact = -1 / np.sqrt(1 - x**2)
    assert abs(M(jnp.arccos, 0.99) - exact[0]) < 1e-10
    (got,) = fd_vjp(M, jnp.arccos, np.ones(3), (x,))
    np.testing.assert_allclose(got, exact, rtol=1e-11)
    np.testing.assert_allclose(np.diag(fd_jacobian(M, jnp.arccos, x)[0]), exact, rtol=1e-11)


def test_per_coordinate_steps_share_one_compiled_evaluation_for_small_inputs(count_compiles):
    """The step rule's batch and the stencil's are padded to one shape: one compilation."""
    compiled = count_compiles("_rows")
    fd_vjp(M, lambda x: jnp.sin(x) * x, jnp.ones(4), (X,))
    assert len(compiled) == 1


def test_max_range_zero_gives_no_finite_estimate_anywhere():
    """FiniteDifferences.jl's `max_range=0`: no step fits, every estimate is nan (no error)."""
    m = central_fdm(5, 1, max_range=0)
    assert math.isnan(m(jnp.sin, 1.0))
    assert np.all(np.isnan(fd_jvp(m, jnp.sin, (X,), (jnp.ones(4),))))
    assert np.all(np.isnan(fd_vjp(m, jnp.sin, jnp.ones(4), (X,))[0]))
    assert np.all(np.isnan(fd_jacobian(m, jnp.sin, X)[0][np.eye(4, dtype=bool)]))


def test_custom_grids_and_zeroth_derivatives():
    m = FDMethod.from_grid([-2, 0, 5], 1)
    assert m.kind == "custom" and m.adapt == 0 and m.grid == (-2, 0, 5)
    assert sum(c * g for c, g in zip(m.exact_coefs, m.grid)) == 1
    assert repr(m).startswith("<FDMethod from_grid((-2, 0, 5), 1): grid=(-2, 0, 5)")
    adapted = FDMethod.from_grid((0, 1, 3, 4), 1, adapt=1)
    assert adapted._bound_of().kind == "forward"
    assert abs(adapted(jnp.exp, 0.5) - math.exp(0.5)) < 1e-9
    (x_bar,) = fd_vjp(m, jnp.sin, jnp.ones(4), (X,))
    np.testing.assert_allclose(x_bar, jnp.cos(X), rtol=1e-8)
    with pytest.raises(ValueError, match="distinct"):
        FDMethod.from_grid([0, 1, 1], 1)
    with pytest.raises(TypeError, match="must hold ints"):
        FDMethod.from_grid([0, 0.5, 1], 1)
    with pytest.raises(ValueError, match=r"p > q"):
        FDMethod.from_grid([0, 1], 2)
    assert central_fdm(3, 0)(jnp.exp, 0.3) == float(jnp.exp(0.3))  # q = 0: f itself
    # with a step, the stencil itself: the mean of f at x -+ h for a 2-point central grid
    assert central_fdm(2, 0)(jnp.exp, 0.3, step=0.1) == pytest.approx(math.exp(0.3) * math.cosh(0.1), rel=1e-14)
    with pytest.raises(ValueError, match=r"q=1.*q=0"):
        fd_jvp(central_fdm(3, 0), jnp.exp, (X,), (X,))
