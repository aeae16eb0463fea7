"""rules.library.nn: every rule verified by the testers, and what each does better than plain JAX.

The value-added tests compare against plain JAX (`jax.nn`, or the textbook formula
differentiated by JAX): NaN/inf there, finite here; and agreement wherever both are fine.
Computations are jitted as a whole, which compiles once instead of op by op.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import rules
from rules.library import nn
from rules.library.jax import nn as rnn
from rules.library.jax import numpy as rnp
from rules.library.jax.scipy import special as rsp


def value_and_grad(f, argnums=0, weights=None):
    """jit(x -> (f(x), grad of sum(weights * f(x)))): the value and the gradient of a scalar loss."""

    def loss(*args):
        y = f(*args)
        return jnp.sum(y if weights is None else weights * y), y

    return jax.jit(jax.value_and_grad(loss, argnums=argnums, has_aux=True))


def run(f, *args, argnums=0, weights=None):
    (_, y), g = value_and_grad(f, argnums, weights)(*args)
    return y, g


def finite(*trees):
    return all(bool(jnp.all(jnp.isfinite(a))) for a in jax.tree_util.tree_leaves(trees))


def test_the_module_ships_its_rules(shipped):
    assert shipped("nn") == set(nn.__all__)


# ----- logsumexp, softmax, log_softmax --------------------------------------------------------
MASKED = jnp.array([[-jnp.inf, -jnp.inf, -jnp.inf], [0.5, -jnp.inf, 2.0], [1.0, -0.3, 0.2]])
W = jnp.array([[1.0, -2.0, 0.5], [0.3, 0.7, 1.0], [-1.0, 0.4, 2.0]])


def jax_logsumexp(x):
    return jax.nn.logsumexp(x, axis=-1)


def test_logsumexp_all_minus_inf_row_has_zero_gradient_where_jax_has_nan():
    y_jax, g_jax = run(jax_logsumexp, MASKED)
    y, g = run(nn.logsumexp, MASKED)
    assert not finite(g_jax[0]) and float(y_jax[0]) == -np.inf  # JAX: NaN gradient on the masked row
    assert float(y[0]) == -np.inf and finite(g)
    np.testing.assert_array_equal(g[0], 0.0)
    np.testing.assert_allclose(y[1:], y_jax[1:], rtol=1e-14)
    np.testing.assert_allclose(g[1:], g_jax[1:], rtol=1e-14)


def test_logsumexp_over_axes_agrees_with_jax_for_large_values():
    x = jnp.asarray(np.random.default_rng(1).normal(size=(2, 3, 4))) * 400
    w = jnp.array([1.0, -0.5, 2.0, 0.3])
    y, g = run(lambda x: nn.logsumexp(x, (0, 1)), x, weights=w)
    y_jax, g_jax = run(lambda x: jax.nn.logsumexp(x, axis=(0, 1)), x, weights=w)
    np.testing.assert_allclose(y, y_jax, rtol=1e-14)
    np.testing.assert_allclose(g, g_jax, rtol=1e-12, atol=1e-300)
    assert float(nn.logsumexp(x, None)) == pytest.approx(float(jax.nn.logsumexp(x)), rel=1e-14)


def test_softmax_is_finite_where_the_naive_formula_overflows_and_agrees_with_jax():
    x = jnp.array([[1000.0, 999.0, 0.0], [0.1, 0.2, -0.3], [-3.0, 1.0, 0.0]])

    def naive(x):
        return jnp.exp(x) / jnp.sum(jnp.exp(x), axis=-1, keepdims=True)

    y_naive, g_naive = run(naive, x, weights=W)
    y_jax, g_jax = run(jax.nn.softmax, x, weights=W)
    y, g = run(nn.softmax, x, weights=W)
    assert not finite(y_naive[0]) and not finite(g_naive[0])
    np.testing.assert_allclose(y, y_jax, rtol=1e-14)
    np.testing.assert_allclose(g, g_jax, rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(g[1:], g_naive[1:], rtol=1e-12)


def test_softmax_of_masked_rows_is_zero_with_zero_gradient_where_jax_has_nan():
    y_jax, g_jax = run(jax.nn.softmax, MASKED, weights=W)
    y, g = run(nn.softmax, MASKED, weights=W)
    assert not finite(y_jax[0]) and not finite(g_jax[0])
    np.testing.assert_array_equal(y[0], 0.0)  # a fully masked row has no mass
    np.testing.assert_array_equal(g[0], 0.0)
    np.testing.assert_allclose(y[1:], y_jax[1:], rtol=1e-14)
    np.testing.assert_allclose(g[1:], g_jax[1:], rtol=1e-12, atol=1e-15)


def test_log_softmax_of_masked_rows_has_finite_gradients_where_jax_has_nan():
    def masked_loss(f):  # reads only the finite log-probabilities, as a masked NLL would
        return lambda x: jnp.where(jnp.isfinite(f(x)), f(x), 0.0)

    y_jax, g_jax = run(masked_loss(jax.nn.log_softmax), MASKED, weights=W)
    y, g = run(masked_loss(nn.log_softmax), MASKED, weights=W)
    assert not finite(g_jax[0]) and finite(g)
    assert bool(jnp.all(jnp.isneginf(nn.log_softmax(MASKED)[0])))
    np.testing.assert_allclose(y[1:], y_jax[1:], rtol=1e-14)
    np.testing.assert_allclose(g[1:], g_jax[1:], rtol=1e-12, atol=1e-15)


def test_second_derivatives_agree_with_jax_where_a_row_has_a_single_class_or_is_saturated():
    # the total sum(exp(x - max)) is then exactly 1, where a clamp at 1 would tie and halve its derivative
    for x in (jnp.array([0.3]), jnp.array([1000.0, 0.0]), jnp.array([0.3, -1.0])):
        w = jnp.array([1.0, -2.0])[: x.size]
        for ours, theirs in ((nn.logsumexp, jax.nn.logsumexp),
                             (lambda x: w @ nn.log_softmax(x), lambda x: w @ jax.nn.log_softmax(x))):
            np.testing.assert_allclose(jax.hessian(ours)(x), jax.hessian(theirs)(x), rtol=1e-12, atol=1e-15)


# ----- cross-entropies ------------------------------------------------------------------------
LOGITS = jnp.array([[1e4, 0.0, -1e4], [0.2, -0.1, 0.4]])
ONEHOT = jnp.array([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]])


def test_softmax_cross_entropy_is_finite_for_huge_logits_and_its_gradient_is_softmax_minus_onehot():
    def naive(logits):
        return -jnp.sum(ONEHOT * jnp.log(jnp.exp(logits) / jnp.sum(jnp.exp(logits), axis=-1, keepdims=True)), axis=-1)

    y_naive, g_naive = run(naive, LOGITS)
    y, g = run(lambda l: nn.softmax_cross_entropy(l, ONEHOT), LOGITS)
    assert not finite(y_naive[0]) and not finite(g_naive[0])
    np.testing.assert_allclose(y, -jnp.sum(ONEHOT * jax.nn.log_softmax(LOGITS), axis=-1), rtol=1e-14)
    np.testing.assert_allclose(g, jax.nn.softmax(LOGITS) - ONEHOT, atol=1e-15)
    np.testing.assert_allclose(y[1], y_naive[1], rtol=1e-14)
    np.testing.assert_allclose(g[1], g_naive[1], rtol=1e-12)


def test_sparse_softmax_cross_entropy_gives_int_labels_no_tangent():
    labels = jnp.array([1, 0])
    y, back = rules.rrule(nn.sparse_softmax_cross_entropy, LOGITS, labels)
    f_bar, logits_bar, labels_bar = back(jnp.ones(2))
    assert f_bar is rules.NoTangent() and labels_bar is rules.NoTangent()
    np.testing.assert_allclose(y, nn.softmax_cross_entropy(LOGITS, ONEHOT), rtol=1e-14)
    np.testing.assert_allclose(logits_bar, jax.nn.softmax(LOGITS) - ONEHOT, atol=1e-15)
    _, g = run(nn.sparse_softmax_cross_entropy, LOGITS, labels)  # labels traced as ints
    np.testing.assert_allclose(g, logits_bar, atol=1e-15)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_cross_entropies_of_masked_rows_are_finite_where_optax_has_nan(dtype):
    logits, labels = MASKED.astype(dtype), jnp.array([0, 2, 1])  # an all -inf row, a masked class, a plain row
    pairs = (
        (nn.softmax_cross_entropy, optax.softmax_cross_entropy, jax.nn.one_hot(labels, 3, dtype=dtype)),
        (nn.sparse_softmax_cross_entropy, optax.softmax_cross_entropy_with_integer_labels, labels),
    )
    for ours, theirs, target in pairs:
        y, g = run(ours, logits, target)
        y_optax, g_optax = run(theirs, logits, target)
        assert not finite(y_optax[0], g_optax[0]) and finite(y[1:], g)
        assert float(y[0]) == np.inf  # the target class cannot be reached: the loss says so, the gradient stays finite
        np.testing.assert_array_equal(g[0], -jax.nn.one_hot(labels[0], 3, dtype=dtype))  # no mass to move
        reachable = jnp.isfinite(y_optax)  # optax's soft-label loss is NaN on the masked class too (0 * -inf)
        np.testing.assert_allclose(y[reachable], y_optax[reachable], rtol=1e-6)
        np.testing.assert_allclose(g[1:], g_optax[1:], rtol=1e-6, atol=1e-7)
        assert y.dtype == g.dtype == dtype


def test_sigmoid_binary_cross_entropy_is_finite_where_the_naive_formula_is_not():
    logits = jnp.array([[-1000.0, -40.0, 40.0, 1000.0, 0.3]])
    labels = jnp.array([[1.0, 1.0, 0.0, 0.0, 0.7]])

    def naive(x, t):
        s = jax.nn.sigmoid(x)
        return -t * jnp.log(s) - (1 - t) * jnp.log(1 - s)

    y_naive, g_naive = run(naive, logits, labels)
    y, (g, g_t) = run(nn.sigmoid_binary_cross_entropy, logits, labels, argnums=(0, 1))
    assert not finite(y_naive) and not finite(g_naive)
    assert finite(y, g, g_t)
    np.testing.assert_allclose(y[0, :4], [1000.0, 40.0, 40.0, 1000.0], rtol=1e-15)
    np.testing.assert_allclose(g, jax.nn.sigmoid(logits) - labels, atol=1e-15)
    np.testing.assert_allclose(g_t, -logits)
    np.testing.assert_allclose(y[0, 4], y_naive[0, 4], rtol=1e-14)
    np.testing.assert_allclose(g[0, 4], g_naive[0, 4], rtol=1e-12)
    # labels broadcast over a batch: their cotangent is summed back to their shape
    _, g_b = run(nn.sigmoid_binary_cross_entropy, jnp.concatenate([logits, -logits]), labels, argnums=1)
    np.testing.assert_allclose(g_b, jnp.zeros_like(labels), atol=1e-12)


# ----- activations ----------------------------------------------------------------------------
def test_softplus_and_log_sigmoid_are_finite_where_the_naive_formulas_are_not():
    x = jnp.array([-1000.0, -30.0, 0.4, 30.0, 1000.0])
    assert not finite(run(lambda x: jnp.log(1 + jnp.exp(x)), x)[0])
    assert not finite(run(lambda x: jnp.log(jax.nn.sigmoid(x)), x))
    pairs = (
        (nn.softplus, jax.nn.softplus, jax.nn.sigmoid(x)),
        (nn.log_sigmoid, jax.nn.log_sigmoid, jax.nn.sigmoid(-x)),
    )
    for ours, theirs, slope in pairs:
        y, g = run(ours, x)
        y_jax, g_jax = run(theirs, x)
        np.testing.assert_allclose(y, y_jax, rtol=1e-15)
        np.testing.assert_allclose(g, slope, rtol=1e-15)
        np.testing.assert_allclose(g, g_jax, rtol=1e-14)


def test_second_and_third_derivatives_in_the_tails_are_sigmoids_not_zero(maybe_jit):
    # s = sigmoid(x), r = sigmoid(-x) = 1 - s: softplus^(2) = s r, softplus^(3) = s r (r - s),
    # silu^(2) = s r (2 + x (r - s)). JAX's s (1 - s) is 0 once s rounds to 1 (float64 past ~37,
    # float32 past ~17): the rules' slopes take sigmoid's own rule, s(x) s(-x), instead
    def nth(f, n):
        return f if n == 0 else jax.grad(nth(f, n - 1))

    for x, rtol in ((40.0, 1e-12), (-40.0, 1e-12), (30.0, 1e-12), (np.float32(20.0), 1e-5)):
        s, r = (1 / (1 + np.exp(-np.float64(t))) for t in (x, -x))
        truth = [
            (nn.softplus, 2, s * r), (nn.softplus, 3, s * r * (r - s)), (rnn.softplus, 2, s * r),
            (nn.log_sigmoid, 2, -s * r), (rnn.log_sigmoid, 3, -s * r * (r - s)),
            (lambda z: nn.sigmoid_binary_cross_entropy(z, 0.0), 2, s * r),
            (rnn.silu, 2, s * r * (2 + x * (r - s))), (rnn.swish, 2, s * r * (2 + x * (r - s))),
            (rsp.expit, 1, s * r), (rsp.expit, 2, s * r * (r - s)),
            (lambda a: rnp.logaddexp(a, 0.0), 2, s * r),  # the weights' slope
        ]
        for f, n, want in truth:
            np.testing.assert_allclose(float(maybe_jit(nth(f, n))(x)), want, rtol=rtol, err_msg=f"{f} {n} {x}")
    assert float(jax.grad(jax.grad(jax.nn.softplus))(40.0)) == 0.0  # JAX's own, for contrast


def test_gelu_tanh_form_keeps_its_tail_and_a_finite_gradient_where_jax_does_not():
    x32 = jnp.array([-5.0, -3.0, 0.5, 2.0], jnp.float32)

    def jax_gelu(x):
        return jax.nn.gelu(x, approximate=True)

    reference, reference_grad = run(jax_gelu, x32.astype(jnp.float64))  # float64 still resolves the tail
    y_jax, _ = run(jax_gelu, x32)
    y, g = run(lambda x: nn.gelu(x, True), x32)
    # float32 JAX loses the tail: 1 + tanh(u) cancels to 0 (or to a few ulps of 1, depending
    # on the code generated for tanh), where float64 resolves a value of -2.3e-7
    assert float(reference[0]) < -1e-7 and abs(float(y_jax[0] - reference[0])) > 0.5 * abs(float(reference[0]))
    assert y.dtype == g.dtype == jnp.float32
    np.testing.assert_allclose(y, reference, rtol=1e-5)
    np.testing.assert_allclose(g, reference_grad, rtol=1e-5, atol=1e-12)
    huge = jnp.array([1e20, -1e20], jnp.float32)
    assert not finite(run(jax_gelu, huge)[1])  # 0 * inf in the derivative of the cubic
    np.testing.assert_array_equal(run(lambda x: nn.gelu(x, True), huge)[1], [1.0, 0.0])


def test_gelu_exact_form_agrees_with_jax():
    x = jnp.linspace(-8.0, 8.0, 9)
    y, g = run(nn.gelu, x)
    y_jax, g_jax = run(lambda x: jax.nn.gelu(x, approximate=False), x)
    np.testing.assert_allclose(y, y_jax, rtol=1e-14, atol=1e-300)
    np.testing.assert_allclose(g, g_jax, rtol=1e-12, atol=1e-300)


# ----- mse ------------------------------------------------------------------------------------
def test_mse_agrees_with_the_formula_and_handles_broadcast_complex_and_int_targets():
    y_hat, y = jnp.array([[1.0, 2.0, 4.0], [0.5, -1.0, 0.0]]), jnp.array([[0.0, 2.0, 1.0]])
    loss, got = run(nn.mse, y_hat, y, argnums=(0, 1))
    loss_ref, want = run(lambda a, b: jnp.mean((a - b) ** 2), y_hat, y, argnums=(0, 1))
    assert float(loss) == pytest.approx(float(loss_ref), rel=1e-14)
    for g, e in zip(got, want):
        assert g.shape == e.shape
        np.testing.assert_allclose(g, e, rtol=1e-14)
    # complex: ChainRules' cotangent dL/dRe + i dL/dIm = 2 (y_hat - y) / N
    z, t = jnp.array([1.0 + 2.0j, -1.0j]), jnp.array([0.0j, 1.0 + 0.0j])
    _, back = rules.rrule(nn.mse, z, t)
    np.testing.assert_allclose(rules.unthunk(back(1.0)[1]), z - t, rtol=1e-14)
    # integer targets cannot be perturbed
    _, back = rules.rrule(nn.mse, jnp.array([1.0, 2.0]), jnp.array([1, 0]))
    assert back(1.0)[2] is rules.NoTangent()


# ----- conventions ----------------------------------------------------------------------------
def test_static_arguments_get_no_tangent_and_arity_follows_the_call():
    x = jnp.array([[0.1, 0.2], [0.3, -0.4]])
    assert len(rules.rrule(nn.softmax, x)[1](x)) == 2
    cts = rules.rrule(nn.softmax, x, 0)[1](x)
    assert len(cts) == 3 and cts[2] is rules.NoTangent()
    assert len(rules.rrule(nn.softmax, x, axis=0)[1](x)) == 2  # keywords get no entry
    assert rules.rrule(nn.gelu, x, True)[1](x)[2] is rules.NoTangent()


def test_forward_mode_and_hessians_agree_with_jax():
    x = jnp.array([0.3, -1.0, 2.0])
    np.testing.assert_allclose(jax.jvp(nn.logsumexp, (x,), (x,))[1], jax.jvp(jax.nn.logsumexp, (x,), (x,))[1])
    hessian, expected = jax.jit(jax.hessian(nn.logsumexp))(x), jax.jit(jax.hessian(jax.nn.logsumexp))(x)
    np.testing.assert_allclose(hessian, expected, rtol=1e-12)


@pytest.mark.parametrize("f, args, static", [
    (nn.logsumexp, (nn._M,), ()), (nn.logsumexp, (nn._M32,), (0,)),
    (nn.softmax, (nn._M,), (0,)), (nn.log_softmax, (nn._M32,), ()),
], ids=["logsumexp", "logsumexp-axis0-float32", "softmax-axis0", "log_softmax-float32"])
def test_jax_jvp_runs_the_frule_and_jax_grad_the_rrule(f, args, static, check_forward_mode):
    check_forward_mode(f, *args, static=static)


@pytest.mark.parametrize("name", ["logsumexp", "softmax", "log_softmax"])
def test_forward_mode_of_masked_rows_is_finite_where_jax_has_nan(name):
    x = jnp.array([[-jnp.inf, -jnp.inf, -jnp.inf], [0.0, -jnp.inf, 1.0]])
    x_dot = jnp.array([[0.3, 0.1, -2.0], [1.0, 0.5, 0.2]])
    ours = jax.jit(lambda x, t: jax.jvp(getattr(nn, name), (x,), (t,))[1])(x, x_dot)
    reference = jax.jit(lambda x, t: jax.jvp(lambda x: getattr(jax.nn, name)(x, axis=-1), (x,), (t,))[1])(x, x_dot)
    assert np.isnan(reference[0]).all() and finite(ours)
    np.testing.assert_allclose(ours[1], reference[1], rtol=1e-12)  # the row that is not all -inf
    # and it is the transpose of the rrule there too: <y_bar, J x_dot> = <J^T y_bar, x_dot>
    y_bar = jnp.array([[1.0, -0.5, 2.0], [0.25, 1.5, -1.0]])[..., : ours.shape[-1] if ours.ndim == 2 else 1].reshape(ours.shape)
    x_bar = jax.vjp(getattr(nn, name), x)[1](y_bar)[0]
    np.testing.assert_allclose(jnp.sum(ours * y_bar), jnp.sum(x_bar * x_dot), rtol=1e-12)


# ----- against optax and jax.nn (issue 14: as fast, in float32) -------------------------------
FAMILY = [  # (ours, the reference issue 14 measures against, the target: one-hot, integer labels or a weighting)
    pytest.param(nn.softmax_cross_entropy, optax.softmax_cross_entropy, "onehot", id="softmax_cross_entropy"),
    pytest.param(nn.sparse_softmax_cross_entropy, optax.softmax_cross_entropy_with_integer_labels, "labels",
                 id="sparse_softmax_cross_entropy"),
    pytest.param(nn.log_softmax, jax.nn.log_softmax, "weights", id="log_softmax"),
    pytest.param(nn.logsumexp, lambda x: jax.nn.logsumexp(x, axis=-1), "weights", id="logsumexp"),
    pytest.param(nn.softmax, jax.nn.softmax, "weights", id="softmax"),
]


def family_loss(f, target):
    """A scalar loss of (logits, target) the way training uses `f`: a mean loss, or sum(weights * f(logits))."""
    if target == "weights":
        return lambda logits, w: jnp.sum(w * f(logits))
    return lambda logits, t: jnp.mean(f(logits, t))


def family_target(f, target, logits, rng):
    n, c = logits.shape
    labels = rng.integers(0, c, n).astype(np.int32)
    if target == "onehot":
        return np.eye(c, dtype=np.float32)[labels]
    if target == "labels":
        return labels
    return rng.standard_normal(jax.eval_shape(f, logits).shape).astype(np.float32)


@pytest.mark.parametrize("f, reference, target", FAMILY)
def test_softmax_family_matches_optax_and_jax_nn_in_float32(f, reference, target, maybe_jit):
    rng = np.random.default_rng(14)
    logits = jnp.asarray(3 * rng.standard_normal((64, 10)), jnp.float32)
    t = family_target(f, target, logits, rng)
    args = (logits,) if target == "weights" else (logits, t)
    y, y_ref = maybe_jit(f)(*args), maybe_jit(reference)(*args)
    g = maybe_jit(jax.grad(family_loss(f, target)))(logits, t)
    g_ref = maybe_jit(jax.grad(family_loss(reference, target)))(logits, t)
    assert y.dtype == g.dtype == jnp.float32
    np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-6)  # float32 rounding of O(1) values
    np.testing.assert_allclose(g, g_ref, rtol=1e-5, atol=1e-6)


def compiled_kernels(f, *args):
    """The instructions of XLA's CPU program for `jit(f)(*args)`, parameters, constants and bitcasts aside."""
    cpu = jax.sharding.make_single_device_sharding(jax.devices("cpu")[0])
    specs = [jax.ShapeDtypeStruct(np.shape(a), np.asarray(a).dtype, sharding=cpu) for a in args]
    hlo = jax.jit(f).lower(*specs).compile().as_text()
    entry = hlo[hlo.index("\nENTRY"):].splitlines()[1:]
    ops = [m.group(1) for m in (re.search(r"= .*?\b([a-z][\w-]*)\(", line) for line in entry) if m]
    return [op for op in ops if op not in {"parameter", "constant", "bitcast", "tuple", "get-tuple-element"}]


@pytest.mark.parametrize("f, reference, target", FAMILY)
def test_softmax_family_gradient_compiles_to_no_more_kernels_than_optax_or_jax_nn(f, reference, target):
    # issue 14's size (the CPU backend fuses differently at small ones); compiled, never run
    logits = np.zeros((4096, 1000), np.float32)
    t = family_target(f, target, logits, np.random.default_rng(0))
    ours = compiled_kernels(jax.grad(family_loss(f, target)), logits, t)
    theirs = compiled_kernels(jax.grad(family_loss(reference, target)), logits, t)
    assert len(ours) <= len(theirs), f"ours: {ours}, reference: {theirs}"
