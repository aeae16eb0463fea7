"""zygote_jax.gradient against jax.grad (issue 7, row 5).

The same loss, a small MLP on 1024 examples, differentiated by `zygote_jax.gradient` and by
`jax.grad`, both under `jax.jit` (target ratio <= 1.02) and eagerly (overhead reported).

Method: medians over repetitions after a warm-up, the two sides measured alternately.
"""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np

from ._common import paired_medians, table

import zygote_jax  # noqa: E402


def loss(params, x, y):
    w1, b1, w2, b2 = params
    h = jnp.tanh(x @ w1 + b1)
    return jnp.mean((h @ w2 + b2 - y) ** 2)


def run(quick: bool = False) -> str:
    rng = np.random.default_rng(0)
    n, d, hidden = (256, 16, 32) if quick else (1024, 64, 256)
    params = tuple(jnp.asarray(rng.standard_normal(s) * 0.1, jnp.float32) for s in [(d, hidden), (hidden,), (hidden, 1), (1,)])
    x = jnp.asarray(rng.standard_normal((n, d)), jnp.float32)
    y = jnp.asarray(rng.standard_normal((n, 1)), jnp.float32)
    reps = 5 if quick else 50
    z_jit = jax.jit(lambda p, x, y: zygote_jax.gradient(loss, p, x, y)[0])
    j_jit = jax.jit(lambda p, x, y: jax.grad(loss)(p, x, y))
    for a, b in zip(z_jit(params, x, y), j_jit(params, x, y)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    tz, tj = paired_medians(lambda: z_jit(params, x, y), lambda: j_jit(params, x, y), reps)
    ez, ej = paired_medians(lambda: zygote_jax.gradient(loss, params, x, y)[0],
                            lambda: jax.grad(loss)(params, x, y), max(3, reps // 5))
    rows = [
        [f"jit, n={n}", f"{tz * 1e3:.3f} ms", f"{tj * 1e3:.3f} ms",
         f"{tz / tj:.3f} ({'met' if tz / tj <= 1.02 else 'MISSED'}: <= 1.02)"],
        [f"eager, n={n}", f"{ez * 1e3:.2f} ms", f"{ej * 1e3:.2f} ms", f"{ez / ej:.3f} (reported)"],
    ]
    header = ["mode", "zygote_jax.gradient", "jax.grad", "ratio (target)"]
    return "## zygote_jax.gradient vs jax.grad\n\n" + table(header, rows) + "\n\n" + __doc__.split("\n\n", 2)[2]


if __name__ == "__main__":
    print(run(quick="--quick" in sys.argv))
