"""Params over module libraries: flax nnx (mutable Variables) and equinox (immutable pytrees)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from zygote_jax import GradientError, Params, gradient

nnx = pytest.importorskip("flax.nnx")
eqx = pytest.importorskip("equinox")


def close(a, b):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, atol=1e-12)


X = jnp.array([[1.0, -2.0], [0.5, 3.0]])


class Block(nnx.Module):
    def __init__(self, rngs):
        self.linear = nnx.Linear(2, 3, rngs=rngs)
        self.norm = nnx.BatchNorm(3, use_running_average=True, rngs=rngs)

    def __call__(self, x):
        return self.norm(self.linear(x))


def nnx_loss(model):
    return jnp.sum(jnp.tanh(model(X)) ** 2)


def test_nnx_params_are_the_param_variables():
    model = Block(nnx.Rngs(0))
    ps = Params(model)
    assert len(ps) == 4  # kernel, bias, scale, bias; not the BatchStat mean and var
    assert model.linear.kernel in ps and model.linear.kernel[...] in ps
    assert model.norm.mean not in ps and model.norm.mean[...] not in ps


def test_nnx_gradient_agrees_with_nnx_grad_and_restores_the_variables():
    model = Block(nnx.Rngs(0))
    kernel = model.linear.kernel.get_raw_value()
    ps = Params(model)
    gs = gradient(lambda: nnx_loss(model), ps)
    expected = nnx.grad(nnx_loss)(model)
    close(gs[model.linear.kernel], expected["linear"]["kernel"][...])  # keyed by the Variable
    close(gs[model.linear.kernel[...]], expected["linear"]["kernel"][...])  # or by its array
    close(gs[model.norm.scale], expected["norm"]["scale"][...])
    assert float(jnp.abs(gs[model.linear.bias]).sum()) > 0
    assert model.linear.kernel.get_raw_value() is kernel


def test_nnx_update_writes_through_the_variables():
    model = Block(nnx.Rngs(0))
    ps = Params(model)
    before = nnx_loss(model)
    for _ in range(3):
        gs = gradient(lambda: nnx_loss(model), ps)
        ps.update(gs, lambda p, g: p - 0.1 * g)
    assert nnx_loss(model) < before
    assert model.linear.kernel[...] in ps and isinstance(model.linear.kernel, nnx.Param)


def test_nnx_arrays_given_directly():
    model = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
    gs = gradient(lambda: jnp.sum(model(X) ** 2), Params([model.kernel[...]]))
    expected = nnx.grad(lambda m: jnp.sum(m(X) ** 2))(model)
    close(gs[model.kernel], expected["kernel"][...])
    assert model.bias not in gs


def test_equinox_module_given_to_params_is_an_error_naming_the_fix():
    model = eqx.nn.Linear(2, 3, key=jax.random.PRNGKey(0))
    for given in (model, [model]):
        with pytest.raises(GradientError, match="(?s)`Params`.*Linear.*immutable.*gradient\\(loss, model\\)"):
            Params(given)


def test_equinox_module_held_by_a_mutable_object_is_rebuilt():
    class Holder:
        pass

    holder = Holder()
    holder.model = eqx.nn.Linear(2, 3, key=jax.random.PRNGKey(0))
    original = holder.model

    def loss(m):
        return jnp.sum(jax.vmap(m)(X) ** 2)

    gs = gradient(lambda: loss(holder.model), Params(holder))
    expected = eqx.filter_grad(loss)(original)
    close(gs[original.weight], expected.weight)
    close(gs[original.bias], expected.bias)
    assert holder.model is original
