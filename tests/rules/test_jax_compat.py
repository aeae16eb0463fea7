"""rules/_jax_compat.py: the one home of JAX's private and version-dependent names.

The canaries check, against JAX's own rules, the contract the dual-mode lowering is built on
(a primitive's JVP, transpose and batching rules): they fail the day a JAX release changes
it, before users see a wrong or raw error. The footing check (`_dual.check_footing`) turns
such a change into a `LoweringContractError` at the first use.
"""

import os
import pathlib
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rules
from rules import NoTangent, _dual, _jax_compat

ROOT = pathlib.Path(__file__).resolve().parents[2]
needs_dual = pytest.mark.skipif(_jax_compat.DUAL is None, reason=f"no dual-mode lowering: {_jax_compat.DUAL_MISSING}")


@pytest.fixture
def fresh_footing(monkeypatch):
    """The footing check undone: it runs again on the next call, and whatever it registers
    or takes away is put back after the test."""
    _dual.check_footing()
    monkeypatch.setattr(_dual, "_footing", [])
    monkeypatch.setattr(_dual, "_linearize_values", [0])
    table = _jax_compat.LINEARIZATIONS
    if table is not None and _dual.rules_call_p in table:
        monkeypatch.delitem(table, _dual.rules_call_p)
    return monkeypatch


def test_private_jax_names_are_imported_in_one_module():
    found = sorted(
        str(path.relative_to(ROOT))
        for package in ("rules", "zygote_jax", "rules_pytest")
        for path in (ROOT / package).rglob("*.py")
        if re.search(r"jax\._src|jax\.experimental", path.read_text())
    )
    assert found == ["rules/_jax_compat.py"]


@needs_dual
def test_canary_jvp_rules_take_primals_and_tangents_and_return_both():
    x, t = jnp.asarray([0.3, -1.2]), jnp.asarray([1.0, 2.0])
    params = jax.make_jaxpr(jnp.sin)(x).eqns[0].params
    y, y_dot = _jax_compat.DUAL.primitive_jvps[jax.lax.sin_p]((x,), (t,), **params)
    np.testing.assert_allclose(y, jnp.sin(x))
    np.testing.assert_allclose(y_dot, jnp.cos(x) * t)


@needs_dual
def test_canary_transpose_rules_take_cotangents_and_undefined_linear_inputs():
    aval = jax.typeof(jnp.zeros(2))
    ct = jnp.asarray([1.0, -3.0])
    got = _jax_compat.DUAL.primitive_transposes[jax.lax.neg_p](ct, jax.interpreters.ad.UndefinedPrimal(aval))
    np.testing.assert_allclose(got[0], -ct)
    assert _jax_compat.DUAL.is_undefined_primal(jax.interpreters.ad.UndefinedPrimal(aval))
    assert not _jax_compat.DUAL.is_undefined_primal(ct)


@needs_dual
def test_canary_batching_rules_get_the_axis_size_name_and_spmd_axes():
    seen = []

    class Recording(_dual._Hi):
        lowered = None

        def label(self):
            return "recording"

        def expand_flat(self, args):
            return [args[0] * 2]

        def batch(self, axis_data, args, dims):
            seen.append((axis_data.size, axis_data.name, axis_data.spmd_name, axis_data.explicit_mesh_axis, dims))
            return super().batch(axis_data, args, dims)

    op = Recording((jax.typeof(jnp.zeros(2)),), (jax.typeof(jnp.zeros(2)),), ())
    out = jax.vmap(lambda v: op(v)[0], axis_name="i")(jnp.ones((3, 2)))
    np.testing.assert_allclose(out, 2 * np.ones((3, 2)))
    size, name, spmd_name, mesh_axis, dims = seen[0]
    assert (size, name, list(dims)) == (3, "i", [0])
    assert not spmd_name and mesh_axis is None
    np.testing.assert_allclose(jax.make_jaxpr(jax.vmap(lambda v: op(v)[0]))(jnp.ones((3, 2))).out_avals[0].shape, (3, 2))


def test_the_unmapped_aval_fallback_adds_the_batch_axis_as_jax_does():
    aval = jax.typeof(jnp.zeros((2, 5), jnp.float32))
    for axis in (0, 1, 2):
        ours = _jax_compat._unmapped_aval_by_hand(3, axis, aval)
        jaxs = _jax_compat.unmapped_aval(3, axis, aval)
        assert (ours.shape, ours.dtype, ours.weak_type) == (jaxs.shape, jaxs.dtype, jaxs.weak_type)


@needs_dual
def test_the_footing_check_passes_on_this_jax():
    _dual.check_footing()
    assert _dual._footing == [None]


def _sin3():
    @rules.primitive
    def sin3(x):
        return jnp.sin(3 * x)

    @sin3.rrule
    def sin3_rrule(x):
        def sin3_pullback(y_bar):
            return NoTangent(), 3 * jnp.cos(3 * x) * y_bar

        return jnp.sin(3 * x), sin3_pullback

    return sin3


@pytest.mark.skipif(not _dual.ENABLED, reason="the dual-mode lowering is off (ZYGOTE_JAX_LOWERING=custom_vjp, or this JAX lacks its names)")
def test_a_jax_that_breaks_the_contract_fails_loudly_at_the_first_use(fresh_footing):
    """A JAX that calls transpose rules with another signature (simulated): the first
    differentiation raises a rules error naming the JAX version and the fallback, not a raw
    TypeError from inside JAX."""
    monkeypatch = fresh_footing
    original = _jax_compat.DUAL.primitive_transposes[_dual.rules_call_p]
    monkeypatch.setitem(_jax_compat.DUAL.primitive_transposes, _dual.rules_call_p,
                        lambda cts, *args, **params: original(cts, None, *args, **params))
    sin3 = _sin3()
    with pytest.raises(rules.LoweringContractError, match=rf"jax {re.escape(jax.__version__)}(.|\n)*ZYGOTE_JAX_LOWERING=custom_vjp"):
        jax.grad(sin3)(0.5)
    with pytest.raises(rules.LoweringContractError):  # and on every later use, not only the first
        jax.jit(sin3)(0.5)
    monkeypatch.undo()
    np.testing.assert_allclose(jax.grad(sin3)(0.5), 3 * np.cos(1.5))


def test_the_environment_variable_chooses_the_fallback_lowering():
    code = "import rules._dual as d, rules._jax_compat as c; print(d.ENABLED, c.ENABLED)"
    for value, want in (("custom_vjp", "False False"), ("dual", f"{_dual.AVAILABLE} {_dual.AVAILABLE}")):
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "ZYGOTE_JAX_LOWERING": value, "JAX_PLATFORMS": "cpu"})
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.split() == want.split()


def _recording_sin3(seen):
    @rules.primitive
    def sin3(x):
        return jnp.sin(3 * x)

    @sin3.rrule
    def sin3_rrule(x):
        seen.append(type(_jax_compat._core.trace_ctx.trace).__name__)  # the trace the rrule runs on

        def sin3_pullback(y_bar):
            return NoTangent(), 3 * jnp.cos(3 * x) * y_bar

        return jnp.sin(3 * x), sin3_pullback

    return sin3


@pytest.mark.skipif(not _dual.ENABLED, reason="the dual-mode lowering is off")
@pytest.mark.parametrize("route", ["linearization rule", "JVP rule", "JVP rule, no escape"])
def test_the_rrules_forward_pass_runs_on_the_trace_beneath_the_linearization(monkeypatch, route):
    """By the linearization rule, JAX runs the forward pass on the trace beneath; by the JVP
    rule alone, JAX partially evaluates it, and `outside_partial_eval` (a canary of JAX's trace
    context) runs the forward pass beneath that, as JAX runs a custom_vjp's; without it (the
    fallback) the forward pass runs through the partial evaluation. Right on each route."""
    _dual.check_footing()
    if route != "linearization rule" and _dual.rules_call_p in _jax_compat.LINEARIZATIONS:
        monkeypatch.delitem(_jax_compat.LINEARIZATIONS, _dual.rules_call_p)
    if route == "JVP rule, no escape":
        monkeypatch.setattr(_dual, "outside_partial_eval", _jax_compat._no_escape)
    seen: list = []
    sin3 = _recording_sin3(seen)
    x = jnp.asarray([0.5, -1.0])
    want = 3 * np.cos(3 * np.asarray(x))
    np.testing.assert_allclose(jax.grad(lambda v: jnp.sum(sin3(v)))(x), want, rtol=1e-12)
    assert seen == ["JaxprTrace" if route == "JVP rule, no escape" else "EvalTrace"]  # the eager grad
    np.testing.assert_allclose(jax.jit(jax.grad(lambda v: jnp.sum(sin3(v))))(x), want, rtol=1e-12)
    np.testing.assert_allclose(jax.vmap(jax.grad(sin3))(x), want, rtol=1e-12)
    # a concrete primal inside jax.jit, its loss closing over a traced w
    got = jax.jit(lambda w: jax.grad(lambda v: sin3(v) * w)(0.5))(2.0)
    np.testing.assert_allclose(got, 2 * 3 * np.cos(1.5), rtol=1e-12)


def test_canary_the_linearization_contract_is_one_rules_knows():
    """JAX's own linearization rule for sin_p returns 4 values (jax <= 0.11.0) or 5 (structured
    residuals, jax 0.11.1+). Fails the day JAX changes it again: users are still served (by
    the JVP rule alone, tested in test_dual_mode.py), but eager reverse mode gets slower."""
    assert _jax_compat.LINEARIZATIONS is not None, "JAX moved its linearization rules (rules/_jax_compat.py)"
    assert _jax_compat.linearize_contract() in (4, 5)


@pytest.mark.skipif(not _dual.ENABLED, reason="the dual-mode lowering is off")
@pytest.mark.parametrize("contract", ["unknown", "misread"])
def test_a_linearization_contract_not_known_leaves_the_jvp_rule_serving_alone(fresh_footing, contract):
    """`unknown`: the probe does not recognise JAX's contract. `misread`: it claims the other
    arity (what a JAX whose contract changed unforeseen looks like): the footing check sees
    the rule fail, takes it away, and the JVP rule serves; nothing raises, nothing is wrong."""
    known = _jax_compat.linearize_contract()
    claimed = 0 if contract == "unknown" else 9 - known  # 4 <-> 5
    fresh_footing.setattr(_dual, "linearize_contract", lambda: claimed)
    sin3 = _sin3()
    np.testing.assert_allclose(jax.grad(sin3)(0.5), 3 * np.cos(1.5))
    assert _dual._footing == [None]
    assert _dual.rules_call_p not in _jax_compat.LINEARIZATIONS
    np.testing.assert_allclose(jax.jit(jax.grad(sin3))(0.5), 3 * np.cos(1.5))
    np.testing.assert_allclose(jax.linearize(sin3, 0.5)[1](1.0), 3 * np.cos(1.5))
