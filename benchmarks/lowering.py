"""The lowering is free: a primitive's rules against the same rules hand-written in JAX.

Rows (issue 7, 1-4), each measured side by side in one run:
1. `jax.jit(jax.grad)` of a 10^6-element function through a primitive with an rrule vs the
   same rule hand-written with `jax.custom_vjp` vs native `jax.grad` (target ratio <= 1.02
   against the hand-written one), and the number of instructions in the compiled HLO
   (target: equal to the hand-written one).
2. Trace + compile time of the same (target <= 1.2x the hand-written one).
3. Eager, small inputs: the primitive called without differentiation vs the plain function
   (target <= 1.2x), and eager `jax.grad` through it vs the hand-written `custom_vjp`
   (target <= 1.1x); a jitted call of it vs the jitted `custom_vjp` (target <= 1.1x: jax.jit
   must keep its cached trace and fast dispatch).
4. An frule-only primitive vs hand-written `jax.custom_jvp`: `jax.jvp` and `jax.grad` under
   jit (target <= 1.02).
5. Both modes (issue 11): a primitive with an frule and an rrule, `jax.jvp` under jit vs the
   hand-written `custom_jvp` and `jax.grad` under jit vs the hand-written `custom_vjp`
   (target <= 1.02 each, compiled HLO compared); and an rrule alone in forward mode (its
   pullback transposed) vs the hand-written `custom_jvp`.
6. Two outputs (issue 22): an rrule with two differentiable outputs, whose pullback runs
   once the zero pattern is known, vs the hand-written `custom_vjp` with symbolic zeros that
   stores its residuals: `jax.grad` under jit of a loss of both outputs and of one (target
   <= 1.02, compiled HLO compared: the forward pass's closure is called), and inside a
   `lax.scan` (the backward loop runs the rrule again: recomputes, stores less; shown).

Method: medians over repetitions after a warm-up, the two sides of a ratio measured
alternately (compilation excluded, except in row 2, which times `jit(...).lower(x).compile()`
of a fresh function each repetition). Compiled programs are compared instruction by
instruction in `compile().as_text()`, metadata removed.
"""

from __future__ import annotations

import re
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from ._common import median_seconds, paired_medians, table

import rules  # noqa: E402

# ----- the function, three ways --------------------------------------------------------------


def f_plain(x):
    return jnp.sin(x) * jnp.exp(x)


def make_primitive():
    def h_plain(x):  # a fresh function per call: compile_seconds must not hit any cache
        return f_plain(x)

    prim = rules.primitive(h_plain)

    @prim.rrule
    def f_rrule(x):
        y = f_plain(x)

        def f_pullback(y_bar):
            return rules.NoTangent(), y_bar * (jnp.cos(x) * jnp.exp(x) + y)

        return y, f_pullback

    return prim


def make_custom_vjp():
    f = jax.custom_vjp(f_plain)

    def fwd(x):
        y = f_plain(x)
        return y, (x, y)

    def bwd(res, y_bar):
        x, y = res
        return (y_bar * (jnp.cos(x) * jnp.exp(x) + y),)

    f.defvjp(fwd, bwd)
    return f


def make_frule_primitive():
    def g_plain(x):  # its own function: rules are keyed on the wrapped function
        return f_plain(x)

    prim = rules.primitive(g_plain)

    @prim.frule
    def f_frule(tangents, x):
        _, x_dot = tangents
        y = f_plain(x)
        return y, (jnp.cos(x) * jnp.exp(x) + y) * x_dot

    prim.frule_impl = f_frule  # row 5 gives it to a primitive that has an rrule too
    return prim


def make_custom_jvp():
    f = jax.custom_jvp(f_plain)

    @f.defjvp
    def f_jvp(primals, tangents):
        (x,), (x_dot,) = primals, tangents
        y = f_plain(x)
        return y, (jnp.cos(x) * jnp.exp(x) + y) * x_dot

    return f


def make_both_rules_primitive():
    """Row 1's rrule primitive (a fresh function) given row 4's frule as well."""
    prim = make_primitive()
    prim.frule(make_frule_primitive().frule_impl)
    return prim


def pair_plain(x):
    return jnp.sin(x) * jnp.exp(x), jnp.cos(x) ** 2


def _pair_partials(x):
    return jnp.cos(x) * jnp.exp(x) + jnp.sin(x) * jnp.exp(x), -2 * jnp.cos(x) * jnp.sin(x)


def make_pair_primitive():
    def pair(x):  # a fresh function per call
        return pair_plain(x)

    prim = rules.primitive(pair)

    @prim.rrule
    def pair_rrule(x):
        y, d = pair_plain(x), _pair_partials(x)

        def pair_pullback(y_bar):
            x_bar = rules.ZeroTangent()
            for g, di in zip(y_bar, d):
                if not isinstance(g, rules.AbstractZero):
                    x_bar = x_bar + g * di
            return rules.NoTangent(), x_bar

        return y, pair_pullback

    return prim


def make_pair_custom_vjp():
    f = jax.custom_vjp(pair_plain)

    def fwd(x):
        return pair_plain(x.value), _pair_partials(x.value)

    def bwd(d, y_bar):
        parts = [g * di for g, di in zip(y_bar, d) if not isinstance(g, jax.custom_derivatives.SymbolicZero)]
        return (sum(parts[1:], parts[0]),)

    f.defvjp(fwd, bwd, symbolic_zeros=True)
    return f


def pair_losses(f):
    """jit(grad) of a loss of both outputs, of the first only, and of both through a lax.scan."""
    def scanned(x):
        def step(c, _):
            a, b = f(c)
            return a + b, jnp.sum(a)

        return jnp.sum(jax.lax.scan(step, x, None, length=8)[0])

    return {
        "both outputs": lambda x: jnp.sum(sum(f(x))),  # one call, both cotangents nonzero
        "first output": lambda x: jnp.sum(f(x)[0]),
        "lax.scan, 8 steps": scanned,
    }


def loss_of(f):
    return lambda x: jnp.sum(f(x))


def hlo_instructions(fn, x) -> list[str]:
    """The compiled program's instructions, without metadata (names of source lines)."""
    text = jax.jit(fn).lower(x).compile().as_text()
    lines = re.findall(r"^\s+(?:ROOT\s+)?%?[\w.\-]+ = .*$", text, flags=re.M)
    return [re.sub(r",? metadata=\{[^}]*\}", "", line).strip() for line in lines]


def compile_seconds(make, x, repeats) -> float:
    times = []
    for _ in range(repeats):
        fn = jax.grad(loss_of(make()))  # a fresh function: nothing cached
        start = time.perf_counter()
        jax.jit(fn).lower(x).compile()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def verdict(ratio: float, target: float) -> str:
    return f"{ratio:.3f} ({'met' if ratio <= target else 'MISSED'}: <= {target})"


def run(quick: bool = False) -> str:
    n = 10_000 if quick else 1_000_000
    reps = 3 if quick else 30
    x = jnp.asarray(np.random.default_rng(0).uniform(-1, 1, n).astype(np.float32))
    prim, hand, frule_prim, hand_jvp = make_primitive(), make_custom_vjp(), make_frule_primitive(), make_custom_jvp()
    rows = []

    # 1. jit(grad), 10^6 elements
    g_prim, g_hand, g_native = (jax.jit(jax.grad(loss_of(f))) for f in (prim, hand, f_plain))
    np.testing.assert_allclose(g_prim(x), g_hand(x), rtol=1e-6)
    t_prim, t_hand = paired_medians(lambda: g_prim(x), lambda: g_hand(x), reps)
    t_native = median_seconds(lambda: g_native(x), reps)
    h_prim, h_hand = hlo_instructions(jax.grad(loss_of(prim)), x), hlo_instructions(jax.grad(loss_of(hand)), x)
    same = "identical" if h_prim == h_hand else "DIFFERENT"
    rows.append([f"1. jit(grad), n={n}", "primitive rrule", f"{t_prim * 1e3:.3f} ms", verdict(t_prim / t_hand, 1.02),
                 f"compiled HLO {same}: {len(h_prim)} vs {len(h_hand)} instructions"])
    rows.append(["", "native jax.grad", f"{t_native * 1e3:.3f} ms", f"{t_native / t_hand:.3f}", ""])

    # 2. trace + compile
    c_prim, c_hand = compile_seconds(make_primitive, x, 3 if quick else 10), compile_seconds(make_custom_vjp, x, 3 if quick else 10)
    rows.append(["2. trace + compile", "primitive rrule", f"{c_prim * 1e3:.1f} ms", verdict(c_prim / c_hand, 1.2), ""])

    # 3. eager, small
    small = jnp.asarray(np.linspace(-1, 1, 8))
    e_prim, e_plain = paired_medians(lambda: prim(small), lambda: f_plain(small), reps * 10)
    rows.append(["3. eager call, n=8", "primitive (no AD)", f"{e_prim * 1e6:.1f} us", verdict(e_prim / e_plain, 1.2), "vs the plain function"])
    eg_prim, eg_hand = paired_medians(lambda: jax.grad(loss_of(prim))(small), lambda: jax.grad(loss_of(hand))(small), reps * 3)
    rows.append(["3. eager grad, n=8", "primitive rrule", f"{eg_prim * 1e6:.1f} us", verdict(eg_prim / eg_hand, 1.1), "vs hand-written custom_vjp"])
    jit_prim, jit_hand = jax.jit(prim), jax.jit(hand)
    jax.block_until_ready((jit_prim(small), jit_hand(small)))
    d_prim, d_hand = paired_medians(lambda: jit_prim(small), lambda: jit_hand(small), reps * 10)
    rows.append(["3. jitted call, n=8", "primitive rrule", f"{d_prim * 1e6:.1f} us", verdict(d_prim / d_hand, 1.1),
                 "vs jitted custom_vjp: dispatch (a trace per call would show here)"])

    # 4. frule-only vs custom_jvp
    tangent = jnp.ones_like(x)
    j_prim = jax.jit(lambda x, t: jax.jvp(frule_prim, (x,), (t,)))
    j_hand = jax.jit(lambda x, t: jax.jvp(hand_jvp, (x,), (t,)))
    tj_prim, tj_hand = paired_medians(lambda: j_prim(x, tangent), lambda: j_hand(x, tangent), reps)
    hj_prim = hlo_instructions(lambda x: jax.jvp(frule_prim, (x,), (x,)), x)
    hj_jvp = hlo_instructions(lambda x: jax.jvp(hand_jvp, (x,), (x,)), x)
    rows.append([f"4. jit(jvp), n={n}", "primitive frule", f"{tj_prim * 1e3:.3f} ms", verdict(tj_prim / tj_hand, 1.02),
                 f"vs custom_jvp; compiled HLO {'identical' if hj_prim == hj_jvp else 'DIFFERENT'}: "
                 f"{len(hj_prim)} vs {len(hj_jvp)} instructions"])
    gf_prim, gf_hand = jax.jit(jax.grad(loss_of(frule_prim))), jax.jit(jax.grad(loss_of(hand_jvp)))
    tg_prim, tg_hand = paired_medians(lambda: gf_prim(x), lambda: gf_hand(x), reps)
    rows.append([f"4. jit(grad), n={n}", "primitive frule", f"{tg_prim * 1e3:.3f} ms", verdict(tg_prim / tg_hand, 1.02), "by transposition, vs custom_jvp"])

    # 5. both rules: each mode against its single-mode hand-written counterpart
    both = make_both_rules_primitive()
    jvp_of = lambda f: (lambda x, t: jax.jvp(f, (x,), (t,)))  # noqa: E731
    j_both = jax.jit(jvp_of(both))
    np.testing.assert_allclose(j_both(x, tangent)[1], j_hand(x, tangent)[1], rtol=1e-6)
    tb_prim, tb_hand = paired_medians(lambda: j_both(x, tangent), lambda: j_hand(x, tangent), reps)
    hj_both, hj_hand = hlo_instructions(lambda x: jvp_of(both)(x, x), x), hlo_instructions(lambda x: jvp_of(hand_jvp)(x, x), x)
    rows.append([f"5. jit(jvp), n={n}", "primitive frule + rrule", f"{tb_prim * 1e3:.3f} ms", verdict(tb_prim / tb_hand, 1.02),
                 f"vs custom_jvp; compiled HLO {'identical' if hj_both == hj_hand else 'DIFFERENT'}: "
                 f"{len(hj_both)} vs {len(hj_hand)} instructions"])
    gb_prim = jax.jit(jax.grad(loss_of(both)))
    tgb_prim, tgb_hand = paired_medians(lambda: gb_prim(x), lambda: g_hand(x), reps)
    hg_both = hlo_instructions(jax.grad(loss_of(both)), x)
    rows.append([f"5. jit(grad), n={n}", "primitive frule + rrule", f"{tgb_prim * 1e3:.3f} ms", verdict(tgb_prim / tgb_hand, 1.02),
                 f"vs custom_vjp; compiled HLO {'identical' if hg_both == h_hand else 'DIFFERENT'}: "
                 f"{len(hg_both)} vs {len(h_hand)} instructions"])
    j_t = jax.jit(jvp_of(prim))  # the rrule-only primitive of row 1, in forward mode
    np.testing.assert_allclose(j_t(x, tangent)[1], j_hand(x, tangent)[1], rtol=1e-6)
    tt_prim, tt_hand = paired_medians(lambda: j_t(x, tangent), lambda: j_hand(x, tangent), reps)
    hj_t = hlo_instructions(lambda x: jvp_of(prim)(x, x), x)
    rows.append([f"5. jit(jvp), n={n}", "primitive rrule alone", f"{tt_prim * 1e3:.3f} ms", f"{tt_prim / tt_hand:.3f}",
                 f"transposed pullback vs custom_jvp; compiled HLO {'identical' if hj_t == hj_hand else 'DIFFERENT'}: "
                 f"{len(hj_t)} vs {len(hj_hand)} instructions"])

    # 6. two outputs: the backward pass replays the rrule
    pair_prim, pair_hand = pair_losses(make_pair_primitive()), pair_losses(make_pair_custom_vjp())
    for what in pair_prim:
        gp, gh = jax.jit(jax.grad(pair_prim[what])), jax.jit(jax.grad(pair_hand[what]))
        np.testing.assert_allclose(gp(x), gh(x), rtol=1e-5)
        tp, th = paired_medians(lambda: gp(x), lambda: gh(x), reps)
        hp, hh = hlo_instructions(jax.grad(pair_prim[what]), x), hlo_instructions(jax.grad(pair_hand[what]), x)
        scan = what.startswith("lax.scan")
        rows.append([f"6. jit(grad), n={n}" if what == "both outputs" else "", f"two-output rrule, {what}", f"{tp * 1e3:.3f} ms",
                     f"{tp / th:.3f} (recomputed, not stored)" if scan else verdict(tp / th, 1.02),
                     f"vs custom_vjp(symbolic_zeros); compiled HLO {'identical' if hp == hh else 'DIFFERENT'}: "
                     f"{len(hp)} vs {len(hh)} instructions"])

    header = ["row", "what", "time", "ratio vs hand-written (target)", "notes"]
    where = f"Measured on jax {jax.__version__}, Python {sys.version.split()[0]}, {jax.default_backend()}.\n\n"
    return ("## Lowering: primitives vs hand-written custom_vjp / custom_jvp\n\n" + where + table(header, rows)
            + "\n\n" + __doc__.split("\n\n", 2)[2])


if __name__ == "__main__":
    print(run(quick="--quick" in sys.argv))
