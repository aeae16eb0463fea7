"""A small project with custom derivatives, as a user writes them (audited by tests/test_audit.py)."""

import functools

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


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def reduce(x, how):
    return jnp.sum(x) if how == "sum" else jnp.mean(x)


def _reduce_fwd(x, how):
    return reduce(x, how), x


def _reduce_bwd(how, x, g):
    return (jnp.full_like(x, g if how == "sum" else 1.01 * g / x.size),)  # wrong for "mean" only


reduce.defvjp(_reduce_fwd, _reduce_bwd)


@jax.custom_vjp
def norm2(x):
    if x.ndim != 1:
        raise ValueError("norm2 takes a vector")
    return jnp.sum(x * x)


norm2.defvjp(lambda x: (norm2(x), x), lambda x, g: (2 * g * x,))


@jax.custom_vjp
def noisy(x, seed):
    return jnp.sin(x) * seed


noisy.defvjp(lambda x, seed: (noisy(x, seed), (x, seed)), lambda r, g: (g * jnp.cos(r[0]) * r[1], jnp.sum(g * jnp.sin(r[0]))))


@rules.primitive
def tolerant(x, *, rtol):
    return x * rtol


@tolerant.rrule
def _tolerant_rrule(x, *, rtol):
    return tolerant(x, rtol=rtol), lambda y_bar: (rules.NoTangent(), rules.unthunk(y_bar) * rtol)


@jax.custom_jvp
def outer(x):
    """A custom_jvp whose body calls a custom_vjp: its own rule gives JAX forward mode."""
    return softclip(x) * x


outer.defjvp(lambda p, t: (outer(*p), ((1 - jnp.tanh(p[0]) ** 2) * p[0] + jnp.tanh(p[0])) * t[0]))
