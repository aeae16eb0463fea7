"""test_rrule (fast and exact modes) against `jax.test_util.check_grads`: cost and sensitivity.

For inputs of 10^2 .. 10^6 elements, a primitive `x -> sin(x) * x` with a correct rrule is
checked by each tester; we report the median time, the number of evaluations of f, and the
smallest relative error in the rule (the rule scaled by 1 + delta) that each one detects.
Target (issue 3): fast mode at 10^6 elements in under 2x the time of check_grads, while
detecting a 1e-6 relative error in float64 that check_grads misses.

Method: times are medians of 3 runs after one warm-up run. Each call of either checker traces
and compiles its own functions, so compilation is part of what a user waits for; test_rrule
is timed as shipped (with its jit/vmap checks of the lowered primitive) and with those checks
off (`core`: rule vs finite differences only, what check_grads does). Calls of f are counted
by a host callback in f, in a separate run; a vmapped batch of stencil points is one call.
"""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np

from ._common import median_seconds, table

jax.config.update("jax_enable_x64", True)

import rules  # noqa: E402
from rules.testing import test_rrule  # noqa: E402

DELTAS = [1e-2, 1e-3, 1e-4, 1e-5, 1e-6, 1e-7, 1e-8, 1e-9]
_count = [0]


def _bump():
    _count[0] += 1


def make(delta: float, counting: bool = False):
    """The primitive, its rule scaled by (1 + delta)."""

    def fn(x):
        if counting:
            jax.debug.callback(_bump)
        return jnp.sin(x) * x

    prim = rules.primitive(fn)

    @prim.rrule
    def fn_rrule(x):
        def fn_pullback(y_bar):
            return rules.NoTangent(), (1 + delta) * y_bar * (jnp.cos(x) * x + jnp.sin(x))

        return fn(x), fn_pullback

    return prim


def detects_rrule(prim, x, mode) -> bool:
    try:
        test_rrule(prim, x, mode=mode, check_jit=False, check_vmap=False, check_thunked_output_tangent=False)
    except AssertionError:
        return True
    return False


def detects_check_grads(prim, x) -> bool:
    try:
        jax.test_util.check_grads(prim, (x,), order=1, modes=["rev"])
    except AssertionError:
        return True
    return False


def smallest_detected(detect) -> str:
    found = [d for d in DELTAS if detect(d)]
    return f"{min(found):.0e}" if found else "none"


def run(quick: bool = False) -> str:
    sizes = [100, 1000] if quick else [100, 1_000, 10_000, 100_000, 1_000_000]
    repeats = 1 if quick else 3
    rows = []
    for n in sizes:
        x = jnp.asarray(np.random.default_rng(0).uniform(-2, 2, n))
        good = make(0.0)
        modes = ["fast"] + (["exact"] if n <= 10_000 else [])
        t_cg = median_seconds(lambda: jax.test_util.check_grads(good, (x,), order=1, modes=["rev"]), repeats)
        counting = make(0.0, counting=True)
        _count[0] = 0
        jax.test_util.check_grads(counting, (x,), order=1, modes=["rev"])
        jax.effects_barrier()
        evals_cg = _count[0]
        cg_threshold = "-" if quick else smallest_detected(lambda d: detects_check_grads(make(d), x))
        rows.append([n, "check_grads(order=1, rev)", f"{t_cg:.3f}", "1.00", evals_cg, cg_threshold])
        for mode in modes:
            t_full = median_seconds(lambda: test_rrule(good, x, mode=mode), repeats)
            t_core = median_seconds(
                lambda: test_rrule(good, x, mode=mode, check_jit=False, check_vmap=False,
                                   check_thunked_output_tangent=False),
                repeats,
            )
            _count[0] = 0
            test_rrule(counting, x, mode=mode, check_jit=False, check_vmap=False)
            jax.effects_barrier()
            threshold = "-" if quick else smallest_detected(lambda d: detects_rrule(make(d), x, mode))
            rows.append([n, f"test_rrule {mode} (core)", f"{t_core:.3f}", f"{t_core / t_cg:.2f}", _count[0], threshold])
            rows.append([n, f"test_rrule {mode} (+jit, vmap, thunk)", f"{t_full:.3f}", f"{t_full / t_cg:.2f}", "", ""])
    header = ["elements", "checker", "median s", "ratio vs check_grads", "calls of f (a vmapped batch counts once; the large-input loop once per point)", "smallest error detected"]
    return "## Testers: test_rrule vs jax.test_util.check_grads\n\n" + table(header, rows) + "\n\n" + (__doc__ or "").split("\n\n", 1)[1]


if __name__ == "__main__":
    print(run(quick="--quick" in sys.argv))
