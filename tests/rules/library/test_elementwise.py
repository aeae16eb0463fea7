"""rules.library.elementwise: every rule verified by the testers, and what it does better."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rules


def test_the_module_ships_its_rules(shipped):
    assert len(shipped("elementwise")) >= 45


def test_rrule_keyed_on_the_jax_function_answers_like_chainrules():
    y, back = rules.rrule(jnp.sin, 0.5)
    assert float(y) == pytest.approx(np.sin(0.5))
    f_bar, x_bar = back(1.0)
    assert f_bar is rules.NoTangent()
    assert float(x_bar) == pytest.approx(np.cos(0.5))


def test_rrule_via_ad_composition_uses_the_registered_rule():
    # rrule_via_ad prefers the registered rule: the pullback is the library's, not jax.vjp.
    _, back = rules.rrule_via_ad(jnp.tanh, jnp.array([0.2, -0.4]))
    expected = 1 - jnp.tanh(jnp.array([0.2, -0.4])) ** 2
    np.testing.assert_allclose(rules.unthunk(back(1.0)[1]), expected, rtol=1e-12)


def test_abs_has_a_zero_subgradient_at_zero_where_jax_has_one():
    pabs = rules.primitive(jnp.abs)
    assert float(jax.grad(jnp.abs)(0.0)) == 1.0  # JAX picks one side
    assert float(jax.grad(pabs)(0.0)) == 0.0  # ChainRules: sign(0) == 0
    (z_bar,) = jax.vjp(pabs, 0j)[1](1.0)
    assert complex(z_bar) == 0j and not np.isnan(complex(z_bar))


def test_abs_of_complex_uses_the_real_part_of_the_seed():
    pabs = rules.primitive(jnp.abs)
    z = jnp.array(3.0 + 4.0j)
    np.testing.assert_allclose(jax.grad(lambda z: pabs(z))(z), jax.grad(lambda z: jnp.abs(z))(z), rtol=1e-12)


def test_hypot_and_sinc_are_finite_at_the_origin():
    phypot, psinc = rules.primitive(jnp.hypot), rules.primitive(jnp.sinc)
    grads = jax.grad(phypot, argnums=(0, 1))(0.0, 0.0)
    assert all(np.isfinite(float(g)) for g in grads)
    assert float(jax.grad(psinc)(0.0)) == 0.0


def test_scalar_rules_broadcast_and_reduce():
    a, b = jnp.ones((2, 3)), jnp.array([[1.0, 2.0, 3.0]])
    _, back = rules.rrule(jnp.multiply, a, b)
    _, a_bar, b_bar = back(jnp.ones((2, 3)))
    assert rules.unthunk(a_bar).shape == (2, 3)
    np.testing.assert_allclose(rules.unthunk(b_bar), jnp.full((1, 3), 2.0))
