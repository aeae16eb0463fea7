"""rules.library.linalg: every rule verified by the testers, and what it does better than JAX."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rules
from rules import NoTangent, ZeroTangent
from rules.library import linalg as la
from rules.testing import test_frule, test_rrule


def _cofactor_adjugate(A):
    """adj(A) by cofactors (the definition), in NumPy."""
    A = np.asarray(A)
    n = A.shape[0]
    adj = np.zeros_like(A)
    for i in range(n):
        for j in range(n):
            minor = np.delete(np.delete(A, i, axis=0), j, axis=1)
            adj[j, i] = (-1) ** (i + j) * np.linalg.det(minor)
    return adj


def test_the_module_ships_its_rules(shipped):
    assert shipped("linalg") == set(la.__all__)


# ----- forward mode: jax.jvp runs the frule, jax.grad the rrule ---------------------------------
_B = np.stack([la._M3Z, la._M3Z.T + 0.3 * np.eye(3)])  # a batch of two complex matrices


@pytest.mark.parametrize("f, args, static, options", [  # inputs beyond the examples: batches, dtypes
    (la.norm, (la._M43.T.astype(np.complex64) + 0.2j,), ("nuc",), {}),
    (la.normalize, (la._M43.astype(np.float32),), (), dict(axis=0)),
    (la.det, (_B,), (), dict(full=True)),
    (la.slogdet, (np.stack([la._M3, -la._M3.T]).astype(np.float32),), (), {}),
    (la.logdet, (la._M3Z.T,), (), {}),
    (la.inv, (_B.astype(np.complex64),), (), {}),
    (la.pinv, (la._M43.T + 0.5j * la._M43.T[::-1],), (), {}),
], ids=["norm-nuc-complex64", "normalize-axis-float32", "det-batch-complex", "slogdet-batch-float32",
        "logdet-complex", "inv-batch-complex64", "pinv-wide-complex"])
def test_jax_jvp_runs_the_frule_and_jax_grad_the_rrule(f, args, static, options, check_forward_mode):
    check_forward_mode(f, *args, static=static, **options)


# ----- value added: where plain JAX is NaN, wrong, or does more work ---------------------------
@pytest.mark.parametrize("ord, x", [(None, jnp.zeros(3)), (3, jnp.zeros(3)), ("fro", jnp.zeros((2, 2)))])
def test_norm_has_a_zero_subgradient_at_zero_where_jax_is_nan(ord, x):
    assert np.isnan(jax.grad(lambda x: jnp.linalg.norm(x, ord))(x)).all()
    np.testing.assert_array_equal(jax.grad(lambda x: la.norm(x, ord))(x), np.zeros(x.shape))


def test_norm_and_normalize_forward_mode_is_finite_at_zero_where_jax_is_nan():
    x, x_dot = jnp.zeros(3), jnp.array([1.0, -2.0, 0.5])
    assert np.isnan(jax.jvp(jnp.linalg.norm, (x,), (x_dot,))[1])
    assert float(jax.jvp(la.norm, (x,), (x_dot,))[1]) == 0.0
    np.testing.assert_array_equal(jax.jvp(la.normalize, (x,), (x_dot,))[1], np.zeros(3))


def test_normalize_is_finite_at_zero_where_jax_is_nan():
    x, w = jnp.zeros(3), jnp.array([1.0, -2.0, 0.5])
    assert np.isnan(jax.grad(lambda x: w @ (x / jnp.linalg.norm(x)))(x)).all()
    np.testing.assert_array_equal(la.normalize(x), np.zeros(3))
    np.testing.assert_array_equal(jax.grad(lambda x: w @ la.normalize(x))(x), np.zeros(3))
    x = jnp.array([0.3, -1.0, 2.0])  # and agrees with JAX away from 0
    np.testing.assert_allclose(jax.grad(lambda x: w @ la.normalize(x))(x),
                               jax.grad(lambda x: w @ (x / jnp.linalg.norm(x)))(x), rtol=1e-12)


# 3-4-5 at the ends of the range: JAX squares the entries (underflow to 0 / overflow to inf).
# True values: ||(3, 4)||_2 = 5, gradient (3, 4) / 5; ||(3, 4)||_3 = 91^(1/3) = 4.497941445275415,
# gradient (a / y)^2 = (9, 16) / 91^(2/3); all scale with the entries (degree 1, degree 0).
_P3 = 91 ** (1 / 3)


@pytest.mark.parametrize("scale, dtype, jax_value", [(1e-170, np.float64, 0.0), (1e20, np.float32, np.inf)],
                         ids=["tiny-float64", "huge-float32"])
@pytest.mark.parametrize("ord, shape, true_value, true_gradient", [
    (None, (2,), 5.0, [0.6, 0.8]),
    (2, (2,), 5.0, [0.6, 0.8]),
    ("fro", (1, 2), 5.0, [0.6, 0.8]),
    (3, (2,), _P3, [9 / _P3**2, 16 / _P3**2]),
], ids=["none", "2", "fro", "3"])
def test_norm_is_scaled_where_jax_underflows_or_overflows(scale, dtype, jax_value, ord, shape, true_value,
                                                          true_gradient):
    x = (np.array([3.0, 4.0]) * scale).astype(dtype).reshape(shape)
    assert float(jnp.linalg.norm(x, ord)) == jax_value
    rtol = 1e-6 if dtype == np.float32 else 1e-14
    np.testing.assert_allclose(float(la.norm(x, ord)), true_value * scale, rtol=rtol)  # eager: the primal
    np.testing.assert_allclose(float(jax.jit(lambda x: la.norm(x, ord))(x)), true_value * scale, rtol=rtol)
    for grad in (jax.grad(lambda x: la.norm(x, ord)), jax.jit(jax.grad(lambda x: la.norm(x, ord)))):
        np.testing.assert_allclose(grad(x).ravel(), true_gradient, rtol=rtol)
    x_dot = np.array([1.0, -2.0], dtype).reshape(shape)  # forward mode: <gradient, x_dot>
    np.testing.assert_allclose(jax.jvp(lambda x: la.norm(x, ord), (x,), (x_dot,))[1],
                               np.dot(true_gradient, [1.0, -2.0]), rtol=rtol)


@pytest.mark.parametrize("scale, dtype, jax_value", [(1e-170, np.float64, np.inf), (1e20, np.float32, 0.0)],
                         ids=["tiny-float64", "huge-float32"])
def test_normalize_is_scaled_where_jax_is_infinite_or_zero(scale, dtype, jax_value):
    x = (np.array([3.0, 4.0]) * scale).astype(dtype)
    np.testing.assert_array_equal(x / jnp.linalg.norm(x), [jax_value, jax_value])  # x / 0, x / inf
    rtol = 1e-6 if dtype == np.float32 else 1e-14
    np.testing.assert_allclose(la.normalize(x), [0.6, 0.8], rtol=rtol)
    # the Jacobian of x / ||x|| is (I - y y^T) / ||x||, y = (0.6, 0.8): times ||x|| = 5 scale
    true = np.array([[0.64, -0.48], [-0.48, 0.36]])
    np.testing.assert_allclose(jax.jacrev(la.normalize)(x) * (5 * scale), true, rtol=rtol, atol=1e-7)
    np.testing.assert_allclose(jax.jacfwd(la.normalize)(x) * (5 * scale), true, rtol=rtol, atol=1e-7)


def test_norm_with_a_negative_p_and_a_zero_entry_has_the_zero_subgradient():
    x = jnp.array([0.0, 1.0, 2.0])  # ||x||_p = 0 for every p < 0, on a neighbourhood of x_1 = 0 too
    assert np.isnan(jax.grad(lambda x: jnp.linalg.norm(x, -1))(x)).any()
    assert float(la.norm(x, -1)) == 0.0
    np.testing.assert_array_equal(jax.grad(lambda x: la.norm(x, -1))(x), np.zeros(3))  # was inf for x_2, x_3


# ----- a float p is differentiated (ChainRules' norm(x, p)) -------------------------------------
def test_norm_differentiates_a_float_p_traced_or_not():
    x = jnp.array([3.0, 4.0])
    # d/dp (3^p + 4^p)^(1/p) at p = 2: (y / p) sum (a / y)^p log(a / y), y = 5
    true_dp = 2.5 * (0.36 * np.log(0.6) + 0.64 * np.log(0.8))
    with pytest.raises((TypeError, ValueError)):  # plain JAX: ord must be static (hashable, concrete)
        jax.grad(lambda p: jnp.linalg.norm(x, p))(2.0)
    for grad in (jax.grad(la.norm, argnums=(0, 1)), jax.jit(jax.grad(la.norm, argnums=(0, 1)))):
        x_bar, p_bar = grad(x, 2.0)
        np.testing.assert_allclose(x_bar, [0.6, 0.8], rtol=1e-14)
        np.testing.assert_allclose(p_bar, true_dp, rtol=1e-14)
    np.testing.assert_allclose(jax.jvp(la.norm, (x, 2.0), (jnp.zeros(2), 1.0))[1], true_dp, rtol=1e-14)
    _, back = rules.rrule(la.norm, x, 2.0)  # eagerly too: a float p gets its cotangent
    np.testing.assert_allclose(back(1.0)[2], true_dp, rtol=1e-14)


@pytest.mark.parametrize("p, value, x_bar, p_bar", [
    (np.inf, 4.0, [0.0, 1.0], 0.0),  # max |x|; its limit d/dp is 0
    (-np.inf, 3.0, [1.0, 0.0], 0.0),  # min |x|
    (0.0, 2.0, [0.0, 0.0], np.nan),  # the count of nonzero entries: the norm jumps at p = 0 (ChainRules: 0)
    (0.5, (np.sqrt(3) + 2) ** 2, [1 + 2 / np.sqrt(3), 1 + np.sqrt(3) / 2], None),  # (sum a^p)^(1/p - 1) a^(p - 1)
    (-1.0, 12 / 7, [(12 / 7) ** 2 / 9, (12 / 7) ** 2 / 16], None),  # y = 1 / (1/3 + 1/4)
], ids=["inf", "-inf", "0", "0.5", "-1"])
def test_norm_with_a_traced_p_at_every_kind_of_p(p, value, x_bar, p_bar):
    x = jnp.array([3.0, 4.0])
    assert float(jnp.linalg.norm(x, p)) == pytest.approx(value, rel=1e-14)  # JAX's value (a static ord)
    y, (got_x_bar, got_p_bar) = jax.jit(jax.value_and_grad(la.norm, argnums=(0, 1)))(x, p)
    assert float(y) == pytest.approx(value, rel=1e-14)
    np.testing.assert_allclose(got_x_bar, x_bar, rtol=1e-14)
    if p_bar is None:  # finite p != 0: the closed form, by finite differences
        p_bar = (jnp.linalg.norm(x, p + 1e-6) - jnp.linalg.norm(x, p - 1e-6)) / 2e-6
        np.testing.assert_allclose(got_p_bar, p_bar, rtol=1e-8)
    else:
        np.testing.assert_array_equal(got_p_bar, p_bar)


_RNG = np.random.default_rng(7)


def _chainrules_input(p, complex_):
    """ChainRules' test inputs for norm(x, p): randn(3), with the max (min) entry well separated for
    p = Inf (-Inf), so that finite differences stay on one side of the kink."""
    x = _RNG.normal(size=3) + (1j * _RNG.normal(size=3) if complex_ else 0)
    if p == np.inf:
        x[-1] = 1000 * _RNG.uniform()
    elif p == -np.inf:
        x = 1000 * x
        x[-1] = _RNG.uniform()
    return x


@pytest.mark.parametrize("complex_", [False, True], ids=["real", "complex"])
@pytest.mark.parametrize("p", [1.0, 2.0, 2.5, np.inf, -np.inf, 0.5, 3.0])
def test_norm_with_a_float_p_passes_the_testers_on_chainrules_inputs(p, complex_):
    x = _chainrules_input(p, complex_)
    test_rrule(la.norm, x, p)
    test_frule(la.norm, x, p)


@pytest.mark.parametrize("p", [-1.0, 2.0, 2.5])
def test_norm_of_a_scalar_with_a_float_p_passes_the_testers(p):  # ChainRules' scalar norm(x, p)
    test_rrule(la.norm, np.array([-0.7]), p)
    test_frule(la.norm, np.array([0.4 + 0.9j]), p)


@pytest.mark.parametrize("complex_", [False, True], ids=["real", "complex"])
def test_normalize_passes_the_testers_on_chainrules_inputs(complex_):
    test_rrule(la.normalize, _chainrules_input(2.0, complex_))


@pytest.mark.parametrize("complex_", [False, True], ids=["real", "complex"])
@pytest.mark.parametrize("p", [1.0, 2.0, -np.inf, np.inf, 2.5, 3])  # ChainRules' normalize(x, p) set, and a static int
def test_normalize_with_p_passes_the_testers_on_chainrules_inputs_and_is_x_over_its_p_norm(p, complex_):
    x = _chainrules_input(p, complex_)
    np.testing.assert_allclose(la.normalize(x, None, p), x / np.linalg.norm(x, p), rtol=1e-13)
    test_rrule(la.normalize, x, None, p)
    test_frule(la.normalize, x, None, p)


def test_normalize_differentiates_a_float_p_as_finite_differences_do_and_is_zero_at_zero():
    x = jnp.array([0.6, -1.2, 0.9])
    w = jnp.array([0.3, -0.5, 0.8])
    loss = lambda x, p: w @ la.normalize(x, None, p)  # noqa: E731
    fd = (loss(x, 2.5 + 1e-6) - loss(x, 2.5 - 1e-6)) / 2e-6
    np.testing.assert_allclose(jax.grad(loss, argnums=1)(x, 2.5), fd, rtol=1e-7)
    np.testing.assert_allclose(jax.jvp(lambda p: loss(x, p), (2.5,), (1.0,))[1], fd, rtol=1e-7)
    for p in (1.0, 3, np.inf, -1.0):
        np.testing.assert_array_equal(la.normalize(jnp.zeros(3), None, p), np.zeros(3))
        np.testing.assert_array_equal(jax.grad(loss)(jnp.zeros(3), p), np.zeros(3))
    # scaled: the 2.5-norm of [3e-170, 4e-170] underflows when computed as plain JAX does
    tiny = jnp.array([3e-170, 4e-170])
    np.testing.assert_allclose(la.normalize(tiny, None, 2.5), la.normalize(jnp.array([3.0, 4.0]), None, 2.5), rtol=1e-14)


# ----- zero seeds ---------------------------------------------------------------------------------
def test_norm_and_normalize_pass_zero_seeds_through_as_chainrules_does():
    x = jnp.array([0.6, -1.2, 0.9])
    assert rules.rrule(la.norm, x)[1](ZeroTangent()) == (NoTangent(), ZeroTangent())
    assert rules.rrule(la.norm, x, 2.5)[1](ZeroTangent()) == (NoTangent(), ZeroTangent(), ZeroTangent())
    assert rules.rrule(la.norm, x, 3)[1](ZeroTangent()) == (NoTangent(), ZeroTangent(), NoTangent())
    assert rules.rrule(la.normalize, x)[1](ZeroTangent()) == (NoTangent(), ZeroTangent())
    assert rules.rrule(la.normalize, x, None, 2.5)[1](ZeroTangent()) == (NoTangent(), ZeroTangent(), NoTangent(), ZeroTangent())
    assert rules.frule((NoTangent(), ZeroTangent(), NoTangent(), ZeroTangent()), la.normalize, x, None, 2.5)[1] is ZeroTangent()
    assert rules.frule((NoTangent(), ZeroTangent()), la.norm, x)[1] is ZeroTangent()
    assert rules.frule((NoTangent(), ZeroTangent(), ZeroTangent()), la.norm, x, 2.5)[1] is ZeroTangent()
    assert rules.frule((NoTangent(), ZeroTangent()), la.normalize, x)[1] is ZeroTangent()
    # one tangent zero, the other not: only the other counts
    y_dot = rules.frule((NoTangent(), ZeroTangent(), 1.0), la.norm, x, 2.5)[1]
    _, back = rules.rrule(la.norm, x, 2.5)
    np.testing.assert_allclose(y_dot, back(1.0)[2], rtol=1e-14)


@pytest.mark.parametrize("A", [
    np.array([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [1.0, 0.0, 1.0]]),  # rank 2: rank-one adjugate
    np.array([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 2.0]]),  # rank 2, zero pivot inside
    np.outer([1.0, 2.0, -1.0], [0.5, 1.0, 3.0]),  # rank 1: adjugate 0
])
def test_det_gradient_is_the_adjugate_at_singular_matrices(A):
    expected = _cofactor_adjugate(A).T
    np.testing.assert_allclose(jax.grad(la.det)(A), expected, atol=1e-12)
    np.testing.assert_allclose(jax.jit(jax.grad(la.det))(A), expected, atol=1e-12)
    A_dot = np.array([[0.3, -1.0, 0.2], [0.5, 0.1, -0.7], [1.1, 0.4, 0.6]])  # forward: tr(adj(A) A_dot)
    np.testing.assert_allclose(jax.jvp(la.det, (A,), (A_dot,))[1], np.sum(expected * A_dot), atol=1e-12)
    # (JAX's own det rule is right at these in jax 0.10; jax 0.12's gives 0 at [1, 0] of the
    # second, where the adjugate has -2: this rule does not depend on which JAX runs it)


def _svd_as_one_sided_jacobi(svd, nullspace):
    """`jnp.linalg.svd` as a GPU's one-sided Jacobi SVD returns it: U's columns for zero singular
    values are (A V)_i / s_i, i.e. zero vectors (or, at the noise floor, garbage)."""

    def jacobi_svd(A, *args, **kwargs):
        u, s, vh = svd(A, *args, **kwargs)
        null = (s <= 1e-12 * s[..., :1])[..., None, :]
        fill = jnp.zeros_like(u) if nullspace == "zero" else 0.5 * u[..., :, :1] + 0.1  # not orthogonal
        return jnp.where(null, fill, u), s, vh

    return jacobi_svd


@pytest.mark.parametrize("nullspace", ["zero", "garbage"])
@pytest.mark.parametrize("A", [
    np.array([[1.0, 2.0], [2.0, 4.0]]),  # rank 1 of 2: the adjugate [[4, -2], [-2, 1]]
    np.array([[2.0, 1.0, 0.0], [1.0, 1.0, 1.0], [3.0, 2.0, 1.0]]),  # rank 2: cofactors -1, 2, -2
    np.array([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 2.0]]),  # rank 2, zero pivot inside
    np.outer([1.0, 2.0, -1.0], [0.5, 1.0, 3.0]),  # rank 1 of 3: adjugate 0
])
def test_det_gradient_is_the_adjugate_whatever_the_svd_returns_for_zero_singular_values(monkeypatch, A, nullspace):
    # on a GPU (one-sided Jacobi SVD) U's null vector came back as 0 and det's gradient was 0
    monkeypatch.setattr(jnp.linalg, "svd", _svd_as_one_sided_jacobi(jnp.linalg.svd, nullspace))
    expected = _cofactor_adjugate(A).T
    np.testing.assert_allclose(jax.grad(la.det)(A), expected, atol=1e-12)
    np.testing.assert_allclose(jax.jit(jax.grad(la.det))(A), expected, atol=1e-12)



@pytest.mark.parametrize("axis_type", ["Explicit", "Auto"])
def test_det_differentiates_a_batch_sharded_over_a_named_mesh(axis_type):
    # JAX's own QR (which the adjugate used to complete its singular vectors) fails under jit with
    # an explicit-axes NamedSharding; the Gram-Schmidt completion keeps the batch's sharding
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

    # the root conftest gives JAX 8 CPU devices; a machine with one GPU has 1 device of its default kind
    mesh = jax.make_mesh((2, 4), ("a", "b"), axis_types=(getattr(AxisType, axis_type),) * 2, devices=jax.devices("cpu"))
    A = np.random.default_rng(3).normal(size=(8, 3, 3))
    A[0, 2] = A[0, 0] + A[0, 1]  # singular: a rank-one adjugate
    loss = lambda A: jnp.sum(la.det(A))  # noqa: E731
    want_grad, want_dot = jax.grad(loss)(A), jax.jvp(la.det, (A,), (A,))[1]
    with (jax.sharding.use_mesh(mesh) if hasattr(jax.sharding, "use_mesh") else jax.set_mesh(mesh)):
        sharded = jax.device_put(A, NamedSharding(mesh, P(("a", "b"))))
        grad = jax.jit(jax.grad(loss))(sharded)
        y_dot = jax.jit(lambda A: jax.jvp(la.det, (A,), (A,))[1])(sharded)
    assert grad.sharding.spec[0] == ("a", "b")
    grad = np.asarray(grad)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(grad[0], _cofactor_adjugate(A[0]).T, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(y_dot, want_dot, rtol=1e-10, atol=1e-12)

@pytest.mark.parametrize("A", [
    np.array([[1.0, 2.0], [2.0, 4.0 + 1e-9]]),
    np.array([[2.0, 1.0, 0.0], [1.0, 1.0, 1.0], [3.0, 2.0, 1.0 + 1e-7]]),
    np.array([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0 - 1e-8], [1.0, 0.0, 1.0]]) + 0.3j * np.eye(3)[::-1],
])
def test_det_gradient_is_the_adjugate_near_singular_matrices(A):
    (got,) = jax.vjp(la.det, A)[1](jnp.ones((), A.dtype))  # JAX's convention: adj(A)^T, unconjugated
    np.testing.assert_allclose(got, _cofactor_adjugate(A).T, rtol=1e-7, atol=1e-12)


def _leibniz_det(A):
    """det(A) as the polynomial sum over permutations, in plain JAX: exact derivatives of all orders."""
    n = A.shape[-1]
    terms = [np.linalg.det(np.eye(n)[list(p)]) * jnp.prod(jnp.stack([A[..., i, p[i]] for i in range(n)]), axis=0)
             for p in itertools.permutations(range(n))]
    return sum(terms)


@pytest.mark.parametrize("A", [
    np.eye(3), np.zeros((3, 3)), np.diag([1.0, 2.0, 2.0]),  # repeated singular values: JAX's SVD drops terms
    np.diag([1.0, 1.0, 0.0]),  # rank n-1 at a repeated singular value: JAX's own det Hessian is NaN
    np.outer([1.0, 2.0, 3.0], [1.0, 0.0, 1.0]),  # rank 1: JAX's own det Hessian is off by 6
    np.random.default_rng(4).normal(size=(3, 3)),
])
def test_det_second_derivatives_are_exact_at_repeated_and_zero_singular_values(A):
    expected = _LEIBNIZ_HESSIAN(A)
    for name, second in _DET_SECOND.items():
        np.testing.assert_allclose(second(A), expected, atol=1e-12, err_msg=name)
    if np.linalg.matrix_rank(A) == 1:  # eagerly too (op by op, slower), where JAX's own is off by 6
        np.testing.assert_allclose(jax.hessian(la.det)(A), expected, atol=1e-12)


# compiled once for every matrix above (one shape)
_LEIBNIZ_HESSIAN = jax.jit(jax.hessian(_leibniz_det))
_DET_SECOND = {"fwd-rev": jax.jit(jax.hessian(la.det)), "rev-rev": jax.jit(jax.jacrev(jax.grad(la.det))),
               "fwd-fwd": jax.jit(jax.jacfwd(jax.jacfwd(la.det))),
               "vmap": jax.jit(lambda A: jax.vmap(jax.hessian(la.det))(A[None])[0])}


def test_det_second_derivatives_of_complex_matrices():
    rng = np.random.default_rng(5)
    A_dot, B_dot = rng.normal(size=(2, 3, 3)) + 1j * rng.normal(size=(2, 3, 3))
    for A in (np.eye(3) + 0j, la._M3Z):
        second = lambda f: jax.jvp(lambda B: jax.jvp(f, (B,), (A_dot,))[1], (A,), (B_dot,))[1]  # noqa: E731
        np.testing.assert_allclose(second(la.det), second(_leibniz_det), rtol=1e-12, atol=1e-12)


def test_det_third_derivatives_raise_rather_than_differentiate_the_svd():
    A = np.outer([1.0, 2.0, 3.0], [1.0, 0.0, 1.0])  # through the SVD: a third derivative off by 1.5
    for third in (jax.jacfwd(jax.jacfwd(jax.jacfwd(la.det))), jax.jacrev(jax.jacrev(jax.grad(la.det)))):
        with pytest.raises(NotImplementedError, match=r"`det`.*order three and higher.*jnp.linalg.det"):
            third(A)


def test_slogdet_factorises_once_where_jax_factorises_twice(count_equations):
    A = jnp.asarray(la._M3)
    plain = jax.make_jaxpr(jax.grad(lambda A: jnp.linalg.slogdet(A)[1]))(A)
    ours = jax.make_jaxpr(jax.grad(lambda A: la.slogdet(A)[1]))(A)
    assert (count_equations(plain.jaxpr, "lu"), count_equations(ours.jaxpr, "lu")) == (2, 1)
    np.testing.assert_allclose(jax.grad(lambda A: la.slogdet(A)[1])(A),
                               jax.grad(lambda A: jnp.linalg.slogdet(A)[1])(A), rtol=1e-12)


# ----- documented behaviour -------------------------------------------------------------------
def test_norm_max_ties_share_the_seed_and_inf_may_be_a_float_or_a_string():
    x = jnp.array([1.0, -1.0, 0.5])
    for ord in ("inf", np.inf):  # np.inf is traced under jit (a float p): the same norm and subgradient
        np.testing.assert_allclose(jax.jit(jax.grad(lambda x: la.norm(x, ord)))(x), [0.5, -0.5, 0.0])
        assert float(jax.jit(lambda x: la.norm(x, ord))(x)) == 1.0
    assert float(la.norm(x, np.inf)) == 1.0
    with pytest.raises(TypeError, match="`norm`: a matrix norm needs a static ord"):  # matrix norms: static only
        jax.jit(lambda A: la.norm(A, np.inf))(jnp.eye(2))
    assert float(la.norm(jnp.eye(2), np.inf)) == 1.0  # eagerly a float is static


def test_norm_nuclear_subgradient_drops_zero_singular_values():
    A = jnp.array([[2.0, 0.0], [0.0, 0.0]])
    np.testing.assert_allclose(jax.grad(lambda A: la.norm(A, "nuc"))(A), [[1.0, 0.0], [0.0, 0.0]])


def _polar_derivative(d, X):
    """d/dt of the unitary polar factor of diag(d) + t X at t = 0 (d > 0): the skew matrix
    with entries (X_ij - X_ji) / (d_i + d_j), finite where d has ties."""
    return (X - X.T) / (d[:, None] + d[None, :])


def test_norm_nuclear_hessian_exact_at_repeated_singular_values():
    """The gradient of norm(A, "nuc") at a full-rank A is the polar factor U V^T, smooth where
    singular values repeat (A = I among them); its derivative went through the SVD's frame
    and was NaN there. Forward over reverse and reverse over reverse, against the polar
    factor's derivative (diagonal A) and against differences of the gradient (rotated A)."""
    X = jnp.asarray(np.random.default_rng(3).standard_normal((3, 3)))
    grad = jax.grad(lambda A: la.norm(A, "nuc"))
    for d in (np.ones(3), np.array([1.0, 2.0, 2.0]), np.array([3.0, 0.5, 0.5])):
        A, want = jnp.diag(d), _polar_derivative(d, X)
        np.testing.assert_allclose(jax.jvp(grad, (A,), (X,))[1], want, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(jax.jit(jax.hessian(lambda A: la.norm(A, "nuc")))(A).reshape(9, 9) @ X.ravel(),
                                   want.ravel(), rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(jax.grad(lambda A: jnp.sum(X * grad(A)))(A), want, rtol=1e-12, atol=1e-14)
    Q, _ = np.linalg.qr(np.random.default_rng(4).standard_normal((4, 4)))
    R, _ = np.linalg.qr(np.random.default_rng(5).standard_normal((3, 3)))
    A = jnp.asarray(Q[:, :3] @ np.diag([2.0, 2.0, 1.0]) @ R)  # tall, full rank, a tie
    V = jnp.asarray(np.random.default_rng(6).standard_normal((4, 3)))
    t = 1e-5
    differences = (grad(A + t * V) - grad(A - t * V)) / (2 * t)
    np.testing.assert_allclose(jax.jvp(grad, (A,), (V,))[1], differences, rtol=1e-8, atol=1e-9)
    np.testing.assert_allclose(grad(A), Q[:, :3] @ R, rtol=1e-12, atol=1e-14)


def test_slogdet_sign_gets_no_cotangent_for_real_and_the_exact_one_for_complex():
    A = jnp.asarray(la._M3)
    np.testing.assert_array_equal(jax.grad(lambda A: la.slogdet(A)[0])(A), np.zeros((3, 3)))
    Z, c = jnp.asarray(la._M3Z), 0.7 - 0.4j

    def loss(slogdet):
        return lambda Z: jnp.real(c * slogdet(Z)[0]) + slogdet(Z)[1]

    np.testing.assert_allclose(jax.grad(loss(la.slogdet))(Z), jax.grad(loss(jnp.linalg.slogdet))(Z), rtol=1e-10)


def test_logdet_and_inv_agree_with_jax_where_jax_is_right():
    A = jnp.asarray(la._SPD3)
    np.testing.assert_allclose(jax.grad(la.logdet)(A), jax.grad(lambda A: jnp.linalg.slogdet(A)[1])(A), rtol=1e-12)
    G = jnp.arange(9.0).reshape(3, 3)
    np.testing.assert_allclose(jax.grad(lambda A: jnp.sum(G * la.inv(A)))(A),
                               jax.grad(lambda A: jnp.sum(G * jnp.linalg.inv(A)))(A), rtol=1e-12)


def test_matrix_norm_gradients_agree_with_jax_for_every_static_ord():
    # ord=-2 (the smallest singular value) had the gradient 0: its singular vectors were
    # sliced as [-1:0], an empty slice; away from ties and zeros every ord is smooth
    M = np.array([[2.0, 0.5, -0.3], [0.1, 1.5, 0.4], [-0.2, 0.3, 1.0]])
    for ord in (None, "fro", "nuc", 1, -1, 2, -2, "inf", "-inf"):
        jax_ord = {"inf": np.inf, "-inf": -np.inf}.get(ord, ord) if isinstance(ord, str) else ord
        ours = jax.grad(la.norm)(M, ord)
        theirs = jax.grad(lambda m: jnp.linalg.norm(m, jax_ord))(M)
        np.testing.assert_allclose(ours, theirs, rtol=1e-9, atol=1e-12, err_msg=f"ord={ord!r}")
        assert np.abs(ours).max() > 0


@pytest.mark.parametrize("ord", [2, -2, "nuc"])
def test_matrix_norm_second_derivatives_in_reverse_over_reverse(ord):
    # jacrev(jacrev) raised a bare AssertionError (JAX's transpose of a select whose predicate
    # was the tangent: the svd frame's custom_jvp tested its tangent for NaN) for ord +-2 and
    # complex 'nuc'; the rules' svd now: reverse over reverse equals JAX's own Hessian away
    # from ties (jax.hessian, forward over reverse, worked before)
    M = np.array([[2.0, 0.5, -0.3], [0.1, 1.5, 0.4], [-0.2, 0.3, 1.0]])
    for imag in (0.0, 1.0):
        ours = lambda r: la.norm(r + 1j * imag * M[::-1] if imag else r, ord)  # noqa: E731
        plain = lambda r: jnp.linalg.norm(r + 1j * imag * M[::-1] if imag else r, ord)  # noqa: E731
        rev_rev = jax.jit(jax.jacrev(jax.jacrev(ours)))(M)
        np.testing.assert_allclose(rev_rev, jax.jit(jax.hessian(plain))(M), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("ord", [1, -1, np.inf, -np.inf])
def test_matrix_max_norm_gradient_does_not_hang_on_the_last_bit_of_the_norm(ord):
    # on a GPU, under vmap, the norm came from a reduction in another order than the gradient's
    # own column sums, one ulp apart: no column matched it and the gradient was silently 0
    from rules.library import _norms

    M = jnp.asarray(np.array([[1.0, 0.2, -0.5], [0.3, 2.0, 0.1], [-0.4, 0.6, 1.5], [0.2, -0.1, 0.3]]))
    y = jnp.linalg.norm(M, ord, axis=(1, 0), keepdims=True)
    exact = _norms._norm_gradient(M, ord, "matrix", (1, 0), y)
    off = _norms._norm_gradient(M, ord, "matrix", (1, 0), y * (1 + jnp.finfo(y.dtype).eps))
    np.testing.assert_array_equal(off, exact)
    np.testing.assert_allclose(exact, jax.grad(lambda m: jnp.linalg.norm(m, ord, axis=(1, 0)))(M), rtol=1e-12)


# ----- second derivatives of a float p-norm at a zero entry ---------------------------------------
def _p_norm_derivatives(x, p):
    """||x||_p, its gradient g and Hessian H in closed form (NumPy), right at zero entries too:
    g = sign(t) |t|^(p-1), H = (p-1)/y (diag |t|^(p-2) - g g^T), t = x / y."""
    x = np.asarray(x, dtype=float)
    y = np.sum(np.abs(x) ** p) ** (1 / p)
    t = x / y
    g = np.sign(t) * np.abs(t) ** (p - 1)
    return y, g, (p - 1) / y * (np.diag(np.abs(t) ** (p - 2)) - np.outer(g, g))


def _normalize_hessian(x, p, w):
    """The Hessian of w . x / ||x||_p in closed form, from the norm's."""
    x = np.asarray(x, dtype=float)
    n, g, H = _p_norm_derivatives(x, p)
    wx, wg = w @ x, np.outer(w, g)
    return -(wg + wg.T) / n**2 - wx * H / n**2 + 2 * wx * np.outer(g, g) / n**3


_SECOND = {"forward-over-reverse": lambda f: jax.jacfwd(jax.grad(f)),
           "reverse-over-reverse": lambda f: jax.jacrev(jax.grad(f)), "hessian": jax.hessian}


@pytest.mark.parametrize("mode", _SECOND)
@pytest.mark.parametrize("p", [2.0, 3.0, 2.5])
@pytest.mark.parametrize("x", [[0.0, 3.0, -4.0], [0.6, -1.2, 0.9], [0.0, 0.0, 2.0]],
                         ids=["zero-entry", "ordinary", "two-zeros"])
def test_norm_with_a_float_p_has_the_true_hessian_at_a_zero_entry(p, x, mode):
    # the gradient's "zero entries get 0" mask had zeroed the Hessian there too: p = 2.0 gave 0, not 1 / y
    x = jnp.array(x)
    _, g, H = _p_norm_derivatives(x, p)
    np.testing.assert_allclose(jax.grad(la.norm)(x, p), g, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(_SECOND[mode](lambda x: la.norm(x, p))(x), H, rtol=1e-12, atol=1e-15)
    # traced p (under jit, and as jnp.float64)
    hess = jax.jit(lambda x, p: _SECOND[mode](lambda x: la.norm(x, p))(x))
    np.testing.assert_allclose(hess(x, jnp.float64(p)), H, rtol=1e-12, atol=1e-15)
    if 0.0 not in x.tolist():  # the closed form is plain JAX's away from zero entries
        np.testing.assert_allclose(H, jax.hessian(lambda x: jnp.sum(jnp.abs(x) ** p) ** (1 / p))(x), rtol=1e-12)


@pytest.mark.parametrize("mode", _SECOND)
@pytest.mark.parametrize("p", [2.0, 3.0, 2.5])
@pytest.mark.parametrize("x", [[0.0, 3.0, -4.0], [0.6, -1.2, 0.9]], ids=["zero-entry", "ordinary"])
def test_normalize_with_a_float_p_has_the_true_hessian_at_a_zero_entry(p, x, mode):
    x, w = jnp.array(x), np.array([0.3, -0.5, 0.8])
    loss = lambda x: w @ la.normalize(x, None, p)  # noqa: E731
    H = _normalize_hessian(x, p, w)
    np.testing.assert_allclose(_SECOND[mode](loss)(x), H, rtol=1e-12, atol=1e-15)
    if p == 2.0 or 0.0 not in x.tolist():  # plain JAX agrees where it is right
        plain = jax.hessian(lambda x: w @ (x / jnp.sum(jnp.abs(x) ** p) ** (1 / p)))(x)
        np.testing.assert_allclose(H, plain, rtol=1e-12, atol=1e-15)
    # the component the report probed: x / ||x|| at [0, 3, 4], entry 1 of the Hessian of its second entry
    if p == 2.0:
        e1 = lambda x: la.normalize(x, None, 2.0)[1]  # noqa: E731
        np.testing.assert_allclose(_SECOND[mode](e1)(jnp.array([0.0, 3.0, 4.0])),
                                   jax.hessian(lambda x: (x / jnp.linalg.norm(x))[1])(jnp.array([0.0, 3.0, 4.0])),
                                   rtol=1e-12, atol=1e-15)


def test_norm_with_a_float_p_keeps_its_conventions_at_zero_entries_for_p_up_to_2():
    x = jnp.array([0.0, 3.0, -4.0])
    for p in (0.5, 1.0, 1.5):  # first derivatives unchanged: zero entries get 0
        assert float(jax.grad(la.norm)(x, p)[0]) == 0.0
    assert float(jax.hessian(la.norm)(x, 1.0)[0, 0]) == 0.0  # sign's slope away from its jump
    # 1 < p < 2: the true second derivative at a zero entry is infinite, and is inf (not 0)
    assert float(jax.jacfwd(jax.grad(la.norm))(x, 1.5)[0, 0]) == np.inf


def _complex_p_norm_derivatives(z, p):
    """The gradient g and Hessian H of ||z||_p (p >= 2) in the real variables (Re z_0, Im z_0, Re z_1, ...),
    closed form (NumPy), right at zero entries: H = blockdiag(y^(1-p) (r^(p-2) I + (p-2) r^(p-4) v v^T))
    - (p-1)/y g g^T, v = (Re z_i, Im z_i), r = |z_i|; the block of a zero entry is I / y at p = 2, else 0."""
    z = np.asarray(z)
    v, r = np.stack([z.real, z.imag], -1), np.abs(z)
    y = np.sum(r**p) ** (1 / p)
    with np.errstate(divide="ignore", invalid="ignore"):
        rp2, rp4 = np.where(r == 0, float(p == 2), r ** (p - 2)), np.where(r == 0, 0.0, r ** (p - 4))
    g = (y ** (1 - p) * rp2)[:, None] * v
    H = -(p - 1) / y * np.outer(g.ravel(), g.ravel())
    for i in range(len(z)):
        H[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] += y ** (1 - p) * (rp2[i] * np.eye(2) + (p - 2) * rp4[i] * np.outer(v[i], v[i]))
    return g.ravel(), H


@pytest.mark.parametrize("p", [2.0, 3.0, 2.5])
def test_norm_of_complex_x_with_a_float_p_has_the_true_hessian_at_a_zero_entry(p):
    # complex x kept the zero-entry mask after the real fix: p = 2.0 gave 0 there, not 1 / y
    z = np.array([0.0, 3.0 + 0.5j, 1.0 + 4.0j])
    g, H = _complex_p_norm_derivatives(z, p)

    def f(v, p=p):
        return la.norm(v[0::2] + 1j * v[1::2], p)

    v = jnp.asarray(np.stack([z.real, z.imag], -1).ravel())
    np.testing.assert_allclose(jax.grad(f)(v), g, rtol=1e-13, atol=1e-15)
    for mode, second in _SECOND.items():
        np.testing.assert_allclose(second(f)(v), H, rtol=1e-12, atol=1e-15, err_msg=mode)
    np.testing.assert_allclose(jax.jit(jax.hessian(f))(v, jnp.float64(p)), H, rtol=1e-12, atol=1e-15)


def test_norm_of_complex_x_at_a_zero_entry_for_p_below_2():
    z = jnp.array([0.0, 3.0 + 0.5j, 1.0 + 4.0j])

    def f(v, p):
        return la.norm(v[0::2] + 1j * v[1::2], p)

    v = jnp.stack([z.real, z.imag], -1).ravel()
    for second in _SECOND.values():  # 1 < p < 2: the true second derivative there is infinite: inf
        assert not np.isfinite(float(second(lambda v: f(v, 1.5))(v)[0, 0]))  # (NaN on jax 0.10), not 0
        H1 = second(lambda v: f(v, 1.0))(v)  # p = 1: 0 at the zero entry (its kink), finite elsewhere
        assert np.all(np.asarray(H1[:2]) == 0) and np.all(np.isfinite(H1))
