"""Primitives given the modules of the JAX ecosystem: equinox modules, flax nnx Params.

Their tangents are structural (`Tangent(Module, field=...)`); a rule returning a plain array
in their place is an error that names the primitive and shows the `Tangent` to return.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import rules
from rules import NoTangent, Tangent


class Affine(eqx.Module):
    w: jax.Array
    b: jax.Array


def affine_primitive(name, pullback):
    def apply(m, x):
        return m.w * x + m.b

    prim = rules.primitive(apply, name=name)
    prim.rrule(lambda m, x: (prim(m, x), lambda y_bar: pullback(y_bar, m, x)))
    return prim


def test_an_equinox_module_argument_gets_its_structural_tangent(maybe_jit):
    prim = affine_primitive("affine_ok", lambda g, m, x: (NoTangent(), Tangent(Affine, w=7 * g * x, b=g), g * m.w))
    m = Affine(jnp.array(2.0), jnp.array(1.0))
    grads = maybe_jit(jax.grad(prim))(m, 3.0)
    assert isinstance(grads, Affine)
    assert float(grads.w) == 21.0 and float(grads.b) == 1.0  # the rule's (7x) w cotangent


def test_a_plain_array_for_an_equinox_module_names_the_primitive_and_the_tangent_to_return():
    prim = affine_primitive("affine_wrong", lambda g, m, x: (NoTangent(), g * x, g * m.w))
    with pytest.raises(rules.TangentStructureError) as err:
        jax.grad(prim)(Affine(jnp.array(2.0), jnp.array(1.0)), 3.0)
    message = str(err.value)
    assert message.startswith("`affine_wrong`")  # the primitive's own name, not `apply`
    assert "argument 1 (m)" in message and "got:      an array of shape ()" in message
    assert "Tangent(Affine, w=..., b=...)" in message


def test_an_nnx_param_argument_keeps_its_structure():
    scale = rules.primitive(lambda p, x: p[...] * x, name="scale")
    scale.rrule(lambda p, x: (scale(p, x), lambda g: (NoTangent(), Tangent(nnx.Param, value=g * x), g * p[...])))
    grads = jax.grad(scale)(nnx.Param(jnp.array(2.0)), 3.0)
    assert isinstance(grads, nnx.Param) and float(grads[...]) == 3.0

    wrong = rules.primitive(lambda p, x: p[...] * x, name="scale_wrong")
    wrong.rrule(lambda p, x: (wrong(p, x), lambda g: (NoTangent(), g * x, g * p[...])))
    with pytest.raises(rules.TangentStructureError, match=r"Tangent\(Param, value=\.\.\.\)"):
        jax.grad(wrong)(nnx.Param(jnp.array(2.0)), 3.0)
    np.testing.assert_allclose(jax.grad(lambda x: scale(nnx.Param(jnp.array(2.0)), x))(3.0), 2.0)
