"""rules.library.nn_layers: fused layer norm and memory-efficient attention, against plain JAX."""

import contextlib
import io
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.ad_checkpoint import print_saved_residuals

import rules
from rules._check import _check_one
from rules._registry import examples_of, function_name, functions_with_examples
from rules.library import nn_layers as nn

CASES = [
    pytest.param(f, ex, id=f"{function_name(f)}-{k}")
    for f in functions_with_examples(["rules.library.nn_layers"])
    for k, ex in enumerate(examples_of(f))
]


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


def test_the_module_ships_its_rules():
    assert {function_name(f) for f, _ in (c.values for c in CASES)} == set(nn.__all__)


@pytest.mark.parametrize("f, example", CASES)
def test_rule_passes_the_testers(f, example):
    row = _check_one(f, example)
    assert row.status == "ok", row.message
    assert row.lowered == "jit+vmap"


# ----- layer_norm -----------------------------------------------------------------------------
def layer_norm_reference(x, scale, offset, axis=-1, eps=1e-5):
    mean = jnp.mean(x, axis=axis, keepdims=True)
    var = jnp.mean((x - mean) ** 2, axis=axis, keepdims=True)
    return (x - mean) / jnp.sqrt(var + eps) * scale + offset


def test_layer_norm_fused_pullback_agrees_with_autodiff():
    rng = np.random.default_rng(2)
    x, scale, offset, w = (jnp.asarray(rng.normal(size=s)) for s in ((3, 4), (4,), (4,), (3, 4)))
    y, got = run(nn.layer_norm, x, scale, offset, argnums=(0, 1, 2), weights=w)
    reference = lambda x, s, o: layer_norm_reference(x, s[None], o[None])  # noqa: E731
    y_ref, want = run(reference, x, scale, offset, argnums=(0, 1, 2), weights=w)
    np.testing.assert_allclose(y, y_ref, rtol=1e-13)
    for g, e in zip(got, want):
        assert g.shape == e.shape
        np.testing.assert_allclose(g, e, rtol=1e-11, atol=1e-13)


def test_layer_norm_over_several_axes_reduces_scale_over_the_rest():
    x = jnp.asarray(np.random.default_rng(3).normal(size=(2, 3, 4)))
    _, g = run(lambda s: nn.layer_norm(x, s, None, (1, 2)) ** 3, jnp.ones((3, 4)))
    _, g_ref = run(lambda s: layer_norm_reference(x, s[None], 0.0, (1, 2)) ** 3, jnp.ones((3, 4)))
    assert g.shape == (3, 4)
    np.testing.assert_allclose(g, g_ref, rtol=1e-11)


def test_layer_norm_is_accurate_in_float32_where_jax_standardize_cancels():
    x32 = jnp.asarray(1e4 + np.random.default_rng(4).normal(size=(4, 64)), jnp.float32)
    exact = layer_norm_reference(x32.astype(jnp.float64), 1.0, 0.0)  # the same inputs, in float64
    err_ours = float(jnp.max(jnp.abs(nn.layer_norm(x32, None, None) - exact)))
    err_jax = float(jnp.max(jnp.abs(jax.nn.standardize(x32, axis=-1, epsilon=1e-5) - exact)))  # mean(x^2) - mean^2
    assert err_ours < 1e-3 < err_jax


# ----- attention ------------------------------------------------------------------------------
def attention_reference(q, k, v):
    s = jnp.einsum("...nd,...md->...nm", q, k) / math.sqrt(q.shape[-1])
    return jnp.einsum("...nm,...mv->...nv", jax.nn.softmax(s, axis=-1), v)


def test_attention_agrees_with_the_formula_batched_and_with_a_partial_last_chunk():
    rng = np.random.default_rng(5)
    q, k, v, w = (jnp.asarray(rng.normal(size=s)) * 2 for s in ((2, 5, 3), (2, 7, 3), (2, 7, 2), (2, 5, 2)))
    y, got = run(lambda q, k, v: nn.attention(q, k, v, 3), q, k, v, argnums=(0, 1, 2), weights=w)
    y_ref, want = run(attention_reference, q, k, v, argnums=(0, 1, 2), weights=w)
    np.testing.assert_allclose(y, y_ref, rtol=1e-12, atol=1e-14)
    for g, e in zip(got, want):
        np.testing.assert_allclose(g, e, rtol=1e-10, atol=1e-12)


def test_attention_saves_no_n_by_m_residual_and_needs_far_less_memory():
    n = m = 1024
    d = 32
    rng = np.random.default_rng(6)
    q, k, v = (jnp.asarray(rng.normal(size=(s, d)), jnp.float32) for s in (n, m, m))

    def loss(f):
        return lambda q, k, v: jnp.sum(f(q, k, v))

    def residuals(f):  # what reverse mode keeps for the backward pass
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            print_saved_residuals(loss(f), q, k, v)
        return out.getvalue()

    assert f"f32[{n},{m}]" in residuals(attention_reference)
    saved = residuals(nn.attention)
    assert f"f32[{n},{m}]" not in saved and f"f32[{n}] output" in saved  # the per-row log-sum-exp

    # scratch memory of the compiled gradient (forward and backward pass)
    compiled = {
        f: jax.jit(jax.grad(loss(f), argnums=(0, 1, 2))).lower(q, k, v).compile()
        for f in (attention_reference, nn.attention)
    }
    naive, ours = (compiled[f].memory_analysis().temp_size_in_bytes for f in (attention_reference, nn.attention))
    assert naive >= n * m * 4  # at least one n x m float32 array
    assert ours < 0.35 * naive, (ours, naive)  # measured ~0.11 with 128-key chunks
    for g, e in zip(compiled[nn.attention](q, k, v), compiled[attention_reference](q, k, v)):
        assert g.dtype == jnp.float32
        np.testing.assert_allclose(g, e, rtol=1e-3, atol=1e-5)


def test_attention_pullback_is_lazy_and_sweeps_once():
    rng = np.random.default_rng(7)
    q, k, v = (jnp.asarray(rng.normal(size=s)) for s in ((3, 2), (4, 2), (4, 3)))
    _, back = rules.rrule(nn.attention, q, k, v)
    cts = back(jnp.ones((3, 3)))
    assert len(cts) == 4 and cts[0] is rules.NoTangent()
    assert all(isinstance(c, rules.Thunk) for c in cts[1:])  # unperturbed inputs cost nothing
    _, g_v = run(lambda v: attention_reference(q, k, v), v)
    np.testing.assert_allclose(rules.unthunk(cts[3]), g_v, rtol=1e-12)
