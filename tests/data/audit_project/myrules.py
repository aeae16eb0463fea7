"""A small project with custom derivatives, as a user writes them (audited by tests/test_audit.py)."""

import jax
import jax.numpy as jnp

import rules


@jax.custom_vjp
def softclip(x):
    return jnp.tanh(x)


softclip.defvjp(lambda x: (jnp.tanh(x), x), lambda x, g: (g * (1 - jnp.tanh(x) ** 2),))


@jax.custom_jvp
def smooth_relu(x):
    return jnp.logaddexp(x, 0.0)


@smooth_relu.defjvp
def _smooth_relu_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return smooth_relu(x), jax.nn.sigmoid(x) * t


@jax.custom_vjp
def scaled_square(x, scale):
    return scale * x * x


def _scaled_square_fwd(x, scale):
    return scaled_square(x, scale), (x, scale)


def _scaled_square_bwd(res, g):
    x, scale = res
    return 2.02 * scale * x * g, jnp.sum(g * x * x)  # wrong: 2.02 where 2 is right


scaled_square.defvjp(_scaled_square_fwd, _scaled_square_bwd)


@rules.primitive
def cube(x):
    return x**3


@cube.rrule
def _cube_rrule(x):
    return cube(x), lambda y_bar: (rules.NoTangent(), 3 * x**2 * rules.unthunk(y_bar))


def only_traced(x):
    """Called only under jax.jit in the tests: never recorded."""
    return softclip(x) * 2
