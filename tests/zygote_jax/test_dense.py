"""USE_CASES.md section 3: a Dense(3 => 2, sigmoid) layer, its mse loss, gradients two ways, SGD."""

import jax
import jax.numpy as jnp
import numpy as np

import zygote_jax


def sigmoid(z):
    return 1 / (1 + jnp.exp(-z))


@jax.tree_util.register_pytree_node_class
class Dense:
    """`Dense(3 => 2, sigmoid)`: y = sigma(W x + b), a mutable object and a pytree."""

    def __init__(self, weight, bias, activation=sigmoid):
        self.weight, self.bias, self.activation = weight, bias, activation

    @classmethod
    def create(cls, n_in, n_out, activation, key):
        return cls(jax.random.normal(key, (n_out, n_in)) / np.sqrt(n_in), jnp.zeros(n_out), activation)

    def __call__(self, x):
        return self.activation(self.weight @ x + self.bias[:, None])

    def tree_flatten(self):
        return (self.weight, self.bias), self.activation

    @classmethod
    def tree_unflatten(cls, activation, children):
        return cls(*children, activation)


def mse(y_hat, y):
    return jnp.mean((y_hat - y) ** 2)


def loss(model, x, y):
    return mse(model(x), y)


def setup():
    model = Dense.create(3, 2, sigmoid, jax.random.PRNGKey(0))
    x = jax.random.normal(jax.random.PRNGKey(1), (3, 1))
    y = jnp.array([[0.2], [0.8]])
    return model, x, y


def hand_derived(model, x, y):
    """dL/dW and dL/db for L = mean((sigma(Wx + b) - y)^2) over the 2 outputs."""
    a = sigmoid(model.weight @ x + model.bias[:, None])
    delta = 2 * (a - y) / a.size * a * (1 - a)  # dL/dz
    return delta @ x.T, jnp.sum(delta, axis=1)


def close(a, b):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, atol=1e-14)


def test_explicit_gradient_matches_the_formula():
    model, x, y = setup()
    dW, db = hand_derived(model, x, y)
    g_model, g_x, g_y = zygote_jax.gradient(loss, model, x, y)
    assert isinstance(g_model, Dense)
    close(g_model.weight, dW)
    close(g_model.bias, db)
    assert g_x.shape == (3, 1) and g_y.shape == (2, 1)
    params = {"weight": model.weight, "bias": model.bias}
    (g,) = zygote_jax.gradient(lambda p: loss(Dense(p["weight"], p["bias"]), x, y), params)
    close(g["weight"], dW)
    close(g["bias"], db)
    g_jit = jax.jit(lambda m: zygote_jax.gradient(loss, m, x, y)[0])(model)
    close(g_jit.weight, dW)


def test_implicit_gradient_matches_the_formula():
    model, x, y = setup()
    dW, db = hand_derived(model, x, y)
    ps = zygote_jax.Params(model)
    assert len(ps) == 2
    gs = zygote_jax.gradient(lambda: loss(model, x, y), ps)
    close(gs[model.weight], dW)
    close(gs[model.bias], db)


def test_sgd_reduces_the_loss():
    model, x, y = setup()
    ps = zygote_jax.Params(model)
    losses = []
    for _ in range(5):
        val, gs = zygote_jax.withgradient(lambda: loss(model, x, y), ps)
        losses.append(float(val))
        ps.update(gs, lambda p, g: p - 1.0 * g)
    assert all(b < a for a, b in zip(losses, losses[1:]))

    step = jax.jit(lambda m: jax.tree_util.tree_map(lambda p, g: p - 1.0 * g, m, zygote_jax.gradient(loss, m, x, y)[0]))
    m = setup()[0]
    explicit = [float(loss(m, x, y))]
    for _ in range(5):
        m = step(m)
        explicit.append(float(loss(m, x, y)))
    close(explicit[:5], losses)
