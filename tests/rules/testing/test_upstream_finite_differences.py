"""FiniteDifferences.jl's tests, ported: upstream test/methods.jl and test/grad.jl.

Each test's docstring names the upstream testset it carries over. Names map as
`jvp(fdm, f, (x, ẋ), ...)` -> `fd_jvp(m, f, (x, ...), (ẋ, ...))`, `j′vp(fdm, f, ȳ, x...)` ->
`fd_vjp(m, f, ȳ, (x, ...))`, `jacobian(fdm, f, x...)` -> `fd_jacobian(m, f, *x)`,
`grad(fdm, f, x...)` -> `fd_vjp(m, f, 1.0, (x, ...))`, `FiniteDifferenceMethod(grid, q)` ->
`FDMethod.from_grid(grid, q)`.

Upstream cases without a JAX meaning, not ported:

- methods.jl "Correctness": `m(f, T(1)) isa T` for T = Float32. Here every difference is
  taken in float64 and returned as a Python float (`rules.testing` checks float32 rules
  against float64 differences); the values are ported.
- methods.jl "Test allocations" (`@ballocated(m(sin, 1)) == 0`): Julia heap allocations.
- methods.jl "Printing FiniteDifferenceMethods": Julia's `show` text; the repr's facts (p,
  q, grid, coefficients) are in test_finite_differences.py's `test_repr_names_the_method`.
- methods.jl "_is_symmetric" on hand-made `SVector`s: a private Julia helper that picks the
  extrapolation power; its facts about methods (central grids and coefficients are
  symmetric, one-sided ones are not) are ported, and `extrapolate_fdm` here derives the
  powers of its error expansion exactly from the coefficients instead.
- grad.jl `@inferred` (type inference of jvp/j′vp/jacobian) and "jacobian that throws
  errors"'s restoring of a mutated `x`: JAX arrays are immutable and the functions are
  traced, never run on a mutated input; the port checks a NumPy input is left unchanged.
- grad.jl "check dict" with `Dict(:x => ..., :y => ...)`: ported with a str-keyed dict.
"""

from __future__ import annotations

import math

import jax

jax.config.update("jax_enable_x64", True)  # the conftest does this too; kept for direct runs

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

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

METHODS = [forward_fdm, backward_fdm, central_fdm]
METHOD_IDS = ["forward", "backward", "central"]


def sinc(x):
    return jnp.sinc(x)


def cosc(x):
    """Julia's `cosc` (the derivative of the normalised sinc), accurate near 0: a Taylor
    series below |x| = 0.25, `cos(pi x)/x - sin(pi x)/(pi x^2)` above."""
    small = jnp.abs(x) < 0.25
    t = jnp.where(small, x, 0.0)
    u = (jnp.pi * t) ** 2
    # d/dx sum_k (-1)^k (pi x)^(2k) / (2k+1)! = sum_{k>=1} (-1)^k 2k pi^(2k) x^(2k-1) / (2k+1)!
    series = 0.0
    for k in range(12, 0, -1):
        series = series * u + (-1) ** k * 2 * k / math.factorial(2 * k + 1)
    series = series * jnp.pi**2 * t
    s = jnp.where(small, 1.0, x)
    closed = jnp.cos(jnp.pi * s) / s - jnp.sin(jnp.pi * s) / (jnp.pi * s**2)
    return jnp.where(small, series, closed)


def abs2(x):
    return x * x


# ------------------------------------------------------------------------------------------
# methods.jl
# ------------------------------------------------------------------------------------------

CORRECTNESS = [
    ("sin", jnp.sin, math.cos(1), -math.sin(1), False),
    ("exp", jnp.exp, math.e, math.e, False),
    ("abs2", abs2, 2.0, 2.0, False),
    ("sqrt(x+1)", lambda x: jnp.sqrt(x + 1), 0.5 / math.sqrt(2), -0.25 / 2**1.5, True),
]


@pytest.mark.parametrize(
    "make, f, d1, d2",
    [(make, f, d1, d2) for _, f, d1, d2, only_forward in CORRECTNESS for make in METHODS
     if make is forward_fdm or not only_forward],
    ids=[f"{name}-{mid}" for name, *_, only_forward in CORRECTNESS for make, mid in zip(METHODS, METHOD_IDS)
         if make is forward_fdm or not only_forward],
)
def test_correctness(make, f, d1, d2):
    """methods.jl "Correctness": q = 0 methods of orders 1..5 (adapt=2) return f(1) itself;
    10-point methods estimate f' and f'' at 1 to isapprox's default tolerance (sqrt(x + 1)
    with forward methods only, as upstream)."""
    for order in range(1, 6):
        assert make(order, 0, adapt=2)(f, 1.0) == float(f(1.0))
    assert make(10, 1)(f, 1.0) == pytest.approx(d1, rel=1.5e-8)
    assert make(10, 2)(f, 1.0) == pytest.approx(d2, rel=1.5e-8)


ACCURACY = [
    # (id, f, x, derivative, atol of one-sided methods, atol of central methods)
    ("zero", lambda x: 0.0 * x, 0.0, 0.0, 0.0, 0.0),  # FiniteDifferences.jl issue 124
    ("identity", lambda x: x, 0.0, 1.0, 5e-15, 5e-16),
    ("exp@0", jnp.exp, 0.0, 1.0, 5e-13, 5e-14),
    ("sin@0", jnp.sin, 0.0, 1.0, 1e-14, 5e-16),
    ("cos@0", jnp.cos, 0.0, 0.0, 5e-14, 5e-14),
    ("exp@1", jnp.exp, 1.0, math.e, 5e-12, 5e-13),
    ("sin@1", jnp.sin, 1.0, math.cos(1), 5e-13, 5e-14),
    ("cos@1", jnp.cos, 1.0, -math.sin(1), 5e-13, 5e-14),
    ("sinc@0", sinc, 0.0, 0.0, 5e-12, 5e-14),
    ("cosc@0", cosc, 0.0, -(math.pi**2) / 3, 5e-9, 5e-10),  # FiniteDifferences.jl issue 125
]


@pytest.mark.parametrize("make", METHODS, ids=METHOD_IDS)
@pytest.mark.parametrize("name, f, x, d, atol, atol_central", ACCURACY, ids=[c[0] for c in ACCURACY])
def test_accuracy(make, name, f, x, d, atol, atol_central):
    """methods.jl "Accuracy": 6- and 7-point methods to the upstream bounds, and central
    14-point methods to 5e-15 (1e-13 for cosc, which is hard)."""
    bound = atol_central if make is central_fdm else atol
    assert abs(make(6, 1)(f, x) - d) <= bound
    assert abs(make(7, 1)(f, x) - d) <= bound
    if make is central_fdm:
        assert abs(make(14, 1)(f, x) - d) <= (1e-13 if name == "cosc@0" else 5e-15)


def test_custom_grid():
    """methods.jl "Test custom grid": `FiniteDifferenceMethod([-2, 0, 5], 1)(sin, 1)`."""
    m = FDMethod.from_grid((-2, 0, 5), 1)
    assert m.grid == (-2, 0, 5)
    assert m(jnp.sin, 1.0) == pytest.approx(math.cos(1), rel=1.5e-8)


def test_integer_output():
    """methods.jl "Integer output": a function returning the integer 5 has derivative 0."""
    assert abs(central_fdm(5, 1)(lambda x: 5, 0.0)) <= 1e-12


def test_adaptation_improves_the_estimate():
    """methods.jl "Adaptation improves estimate": log at 0.001."""
    assert abs(forward_fdm(5, 1, adapt=0)(jnp.log, 0.001) - 1000) > 1
    assert forward_fdm(5, 1, adapt=1)(jnp.log, 0.001) == pytest.approx(1000, rel=1.5e-8)


def test_limiting_the_step_size():
    """methods.jl "Limiting step size": `max_range=0` gives no finite estimate; a max_range
    inside log's domain gives 1000 at 0.001; abs near its kink at 0.001."""
    assert not math.isfinite(central_fdm(5, 1, max_range=0)(jnp.abs, 0.001))
    assert central_fdm(10, 1, max_range=9e-4)(jnp.log, 1e-3) == pytest.approx(1000, rel=1.5e-8)
    assert central_fdm(5, 1)(jnp.abs, 0.001) == pytest.approx(1.0, rel=1.5e-8)


def test_accuracy_at_high_orders_and_high_adaptation():
    """methods.jl "Accuracy at high orders and high adaptation (issue #64)"."""
    assert abs(central_fdm(9, 5, adapt=4)(jnp.exp, 1.0) - math.e) <= 2e-7
    assert abs(central_fdm(15, 5, adapt=2)(jnp.exp, 1.0) - math.e) <= 1e-10
    assert abs(central_fdm(9, 3, adapt=4)(lambda x: 4 * x**3 + 3 * x**2 + 2 * x + 1, 1.0) - 24) <= 1e-11


@pytest.mark.parametrize("p", range(2, 11))
def test_central_methods_are_symmetric_and_one_sided_ones_are_not(p):
    """methods.jl "_is_symmetric", its facts about methods: a central first-derivative
    method has an antisymmetric grid and coefficients; forward and backward ones do not."""
    m = central_fdm(p, 1)
    assert m.grid == tuple(-g for g in reversed(m.grid))
    assert m.exact_coefs == tuple(-c for c in reversed(m.exact_coefs))
    for make in (forward_fdm, backward_fdm):
        one_sided = make(p, 1)
        assert one_sided.grid != tuple(-g for g in reversed(one_sided.grid))


@pytest.mark.parametrize("make", METHODS, ids=METHOD_IDS)
@pytest.mark.parametrize("x", [1, 1.0], ids=["int", "float"])
def test_extrapolate_fdm_third_derivative(make, x):
    """methods.jl "extrapolate_fdm": the third derivative of exp at 1 (an int or a float)
    by 4-point methods, contracting steps by 0.8, to 1e-7."""
    estimate, _ = extrapolate_fdm(make(4, 3), jnp.exp, x, contract=0.8)
    assert abs(estimate - math.e) <= 1e-7


class NotAFunction:
    """A callable object that is not a Python function (FiniteDifferences.jl issue 224)."""

    def __call__(self, x):
        return abs2(x)


@pytest.mark.parametrize("make", METHODS, ids=METHOD_IDS)
def test_f_need_not_be_a_function(make):
    """methods.jl "do not require f::Function"."""
    assert make(5, 1)(NotAFunction(), 0.7) == pytest.approx(1.4, rel=1.5e-8)


# ------------------------------------------------------------------------------------------
# grad.jl
# ------------------------------------------------------------------------------------------

M5 = central_fdm(5, 1)


def _rng():
    return np.random.default_rng(123456)


def test_jvp_scalar_vector_and_tuple_outputs():
    """grad.jl "jvp": scalar, vector and tuple outputs; one tuple argument ("auto") and two
    arguments ("multi") agree with the manual JVP."""
    rng = _rng()
    x, y, x_dot, y_dot = (jnp.asarray(rng.standard_normal(2)) for _ in range(4))
    z, z_dot = jnp.asarray(rng.standard_normal(3)), jnp.asarray(rng.standard_normal(3))

    manual = fd_jvp(M5, lambda xz: jnp.sum(jnp.sin(xz)), (jnp.concatenate([x, z]),), (jnp.concatenate([x_dot, z_dot]),))
    auto = fd_jvp(M5, lambda p: jnp.sum(jnp.sin(p[0])) + jnp.sum(jnp.sin(p[1])), ((x, z),), ((x_dot, z_dot),))
    multi = fd_jvp(M5, lambda a, b: jnp.sum(jnp.sin(a)) + jnp.sum(jnp.sin(b)), (x, z), (x_dot, z_dot))
    np.testing.assert_allclose(auto, manual, rtol=1e-10)
    np.testing.assert_allclose(multi, manual, rtol=1e-10)

    expected = jnp.cos(x) * x_dot + jnp.cos(y) * y_dot
    auto = fd_jvp(M5, lambda p: jnp.sin(p[0]) + jnp.sin(p[1]), ((x, y),), ((x_dot, y_dot),))
    multi = fd_jvp(M5, lambda a, b: jnp.sin(a) + jnp.sin(b), (x, y), (x_dot, y_dot))
    np.testing.assert_allclose(auto, expected, rtol=1e-10)
    np.testing.assert_allclose(multi, expected, rtol=1e-10)

    expected = (jnp.cos(x) * x_dot, jnp.cos(y) * y_dot)
    auto = fd_jvp(M5, lambda p: (jnp.sin(p[0]), jnp.sin(p[1])), ((x, y),), ((x_dot, y_dot),))
    multi = fd_jvp(M5, lambda a, b: (jnp.sin(a), jnp.sin(b)), (x, y), (x_dot, y_dot))
    assert isinstance(auto, tuple) and isinstance(multi, tuple)
    for got in (auto, multi):
        np.testing.assert_allclose(np.concatenate(got), np.concatenate(expected), rtol=1e-10)


def test_grad_leaves_a_numpy_input_unchanged():
    """grad.jl "grad": the gradient of sin(x1) + cos(x2); x is not modified."""
    x = _rng().standard_normal(2)
    x_copy = x.copy()
    (g,) = fd_vjp(M5, lambda v: jnp.sin(v[0]) + jnp.cos(v[1]), 1.0, (x,))
    np.testing.assert_allclose(g, [math.cos(x[0]), -math.sin(x[1])], rtol=1e-10)
    np.testing.assert_array_equal(x, x_copy)


@pytest.mark.parametrize("kind", ["linear", "sin"])
def test_jacobian_jvp_and_vjp_against_the_exact_jacobian(kind):
    """grad.jl "jacobian / _jvp / _j′vp": for x -> A x and x -> sin.(A x), the Jacobian (of
    shape (length(ȳ), length(x)), the same on a second call), J ẋ and Jᵀ ȳ; the identity's
    Jacobian is I."""
    rng = _rng()
    y_bar, a = rng.standard_normal(3), rng.standard_normal((3, 2))
    x, x_dot = rng.standard_normal(2), rng.standard_normal(2)
    a_copy = a.copy()
    if kind == "linear":
        f, exact = (lambda v: jnp.asarray(a) @ v), a
    else:
        f, exact = (lambda v: jnp.sin(jnp.asarray(a) @ v)), np.cos(a @ x)[:, None] * a
    (jac,) = fd_jacobian(M5, f, x)
    assert jac.shape == (3, 2)
    np.testing.assert_allclose(jac, exact, rtol=1e-9)
    np.testing.assert_array_equal(jac, fd_jacobian(M5, f, x)[0])
    np.testing.assert_allclose(fd_jvp(M5, f, (x,), (x_dot,)), exact @ x_dot, rtol=1e-9)
    np.testing.assert_allclose(fd_vjp(M5, f, y_bar, (x,))[0], exact.T @ y_bar, rtol=1e-9)
    np.testing.assert_array_equal(a, a_copy)
    (eye,) = fd_jacobian(M5, lambda v: v, x)
    np.testing.assert_allclose(eye, np.eye(2), atol=1e-12)


def test_a_jacobian_of_a_raising_function_raises_and_leaves_x_unchanged():
    """grad.jl "jacobian that throws errors" (FiniteDifferences.jl issue 221)."""
    x = np.zeros(5)

    def fails(v):
        raise ArithmeticError("f failed")

    with pytest.raises(ArithmeticError, match="f failed"):
        fd_jacobian(M5, fails, x)
    np.testing.assert_array_equal(x, np.zeros(5))


def test_multi_variable_jacobian_and_grad():
    """grad.jl "multi vars jacobian/grad": the Jacobian (gradient) with respect to each of
    several arguments equals that of the function of that argument alone; matrices, a
    scalar, a tuple argument and a dict argument."""
    rng = _rng()

    def times(x, y):  # Julia's `*`: a matrix product, or a product with a scalar
        return x @ y if jnp.ndim(y) == 2 else x * y

    def f1(x, y):
        return times(x, y) + x

    def f2(x, y):
        return jnp.sum(times(x, y) + x)

    def f3(p):
        return jnp.sum(p[0]) + p[1]

    def f4(d):
        return jnp.sum(d["x"]) + d["y"]

    for x, y in ((rng.uniform(size=(3, 3)), rng.uniform(size=(3, 3))), (rng.uniform(size=(3, 3)), 2.0)):
        jx, jy = fd_jacobian(M5, f1, x, y)
        np.testing.assert_allclose(jx, fd_jacobian(M5, lambda a: f1(a, y), x)[0], rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(jy, fd_jacobian(M5, lambda b: f1(x, b), y)[0], rtol=1e-9, atol=1e-12)
        gx, gy = fd_vjp(M5, f2, 1.0, (x, y))
        np.testing.assert_allclose(gx, fd_vjp(M5, lambda a: f2(a, y), 1.0, (x,))[0], rtol=1e-9)
        np.testing.assert_allclose(gy, fd_vjp(M5, lambda b: f2(x, b), 1.0, (y,))[0], rtol=1e-9)

    x, y = rng.uniform(size=(3, 3)), 2.0
    ((gx, gy),) = fd_vjp(M5, f3, 1.0, ((x, y),))
    np.testing.assert_allclose(gx, fd_vjp(M5, lambda a: f3((a, y)), 1.0, (x,))[0], rtol=1e-9)
    np.testing.assert_allclose(gy, fd_vjp(M5, lambda b: f3((x, b)), 1.0, (y,))[0], rtol=1e-9)
    (g,) = fd_vjp(M5, f4, 1.0, ({"x": x, "y": y},))
    np.testing.assert_allclose(g["x"], np.ones((3, 3)), rtol=1e-9)
    np.testing.assert_allclose(g["y"], 1.0, rtol=1e-9)


@pytest.mark.parametrize("n, m", [(2, 3), (0, 0), (0, 3)])
def test_vjp_of_concatenated_and_separate_arguments(n, m):
    """grad.jl "j′vp": with respect to one vector, one tuple argument, or two arguments,
    including empty vectors."""
    rng = _rng()
    x, y, z_bar = rng.standard_normal(n), rng.standard_normal(m), rng.standard_normal(n + m)
    (manual,) = fd_vjp(M5, jnp.sin, z_bar, (np.concatenate([x, y]),))
    ((ax, ay),) = fd_vjp(M5, lambda p: jnp.sin(jnp.concatenate([p[0], p[1]])), z_bar, ((x, y),))
    mx, my = fd_vjp(M5, lambda a, b: jnp.sin(jnp.concatenate([a, b])), z_bar, (x, y))
    np.testing.assert_allclose(np.concatenate([ax, ay]), manual, rtol=1e-10)
    np.testing.assert_allclose(np.concatenate([mx, my]), manual, rtol=1e-10)
    np.testing.assert_allclose(manual, np.cos(np.concatenate([x, y])) * z_bar, rtol=1e-9)


def test_complex_correctness():
    """grad.jl "Complex correctness" (FiniteDifferences.jl PR 76, issue 75): Jacobians of +, -
    and * as 2x2 real blocks, the gradient of abs2, and jvp/j′vp against the Jacobian."""
    rng = _rng()
    x, y = complex(*rng.standard_normal(2)), complex(*rng.standard_normal(2))
    dx, dy = fd_jacobian(M5, lambda a, b: a + b, x, y)
    np.testing.assert_allclose(dx, np.eye(2), atol=1e-10)
    np.testing.assert_allclose(dy, np.eye(2), atol=1e-10)
    (dx,) = fd_jacobian(M5, lambda a: -a, x)
    np.testing.assert_allclose(dx, -np.eye(2), atol=1e-10)
    dx, dy = fd_jacobian(M5, lambda a, b: a * b, x, y)
    np.testing.assert_allclose(dx, [[y.real, -y.imag], [y.imag, y.real]], rtol=1e-9)
    np.testing.assert_allclose(dy, [[x.real, -x.imag], [x.imag, x.real]], rtol=1e-9)
    (g,) = fd_vjp(M5, lambda a: jnp.abs(a) ** 2, 1.0, (x,))
    assert g.real == pytest.approx(2 * x.real, rel=1e-9) and g.imag == pytest.approx(2 * x.imag, rel=1e-9)

    x_dot, y_dot, z_bar = (complex(*rng.standard_normal(2)) for _ in range(3))

    def f(a, b):
        return 5 * jnp.sin(a) * jnp.cos(b)

    jx, jy = fd_jacobian(M5, f, x, y)
    z_dot = fd_jvp(M5, f, (x, y), (x_dot, y_dot))
    manual = np.hstack([jx, jy]) @ np.concatenate([to_vec(x_dot)[0], to_vec(y_dot)[0]])
    np.testing.assert_allclose([z_dot.real, z_dot.imag], manual, rtol=1e-9)
    x_bar, y_bar = fd_vjp(M5, f, z_bar, (x, y))
    z_bar_vec = np.asarray(to_vec(z_bar)[0])
    np.testing.assert_allclose([x_bar.real, x_bar.imag], jx.T @ z_bar_vec, rtol=1e-9)
    np.testing.assert_allclose([y_bar.real, y_bar.imag], jy.T @ z_bar_vec, rtol=1e-9)
