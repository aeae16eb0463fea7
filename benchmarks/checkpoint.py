"""zygote_jax.checkpointed: the same gradient with less memory (issue 4).

A stack of 8 blocks, each four layers `x -> tanh(x @ W_k)` deep, on a (1024, 256) float32
batch, differentiated by `zygote_jax.gradient` with each block plain or wrapped in
`zygote_jax.checkpointed` (which keeps a block's input and recomputes its four layers).

Method: "stored between passes" is the size of the residuals the forward pass keeps for the
backward pass (the arrays held by the function `jax.vjp` returns, weights and inputs
included); "XLA scratch" is the compiled gradient's
`memory_analysis().temp_size_in_bytes`, reported as measured: on XLA:CPU it does not fall
with checkpointing here, as the recomputed blocks need their own buffers and the plain
program's residuals are counted once. Times are medians after a warm-up, measured
alternately.
"""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np

from ._common import paired_medians, table

import zygote_jax  # noqa: E402


def block(x, w):
    for _ in range(4):
        x = jnp.tanh(x @ w)
    return x


def make_loss(checkpoint: bool):
    def loss(ws, x):
        for w in ws:
            x = zygote_jax.checkpointed(block, x, w) if checkpoint else block(x, w)
        return jnp.sum(x**2)

    return loss


def residual_bytes(loss, ws, x) -> int:
    """Bytes of the arrays the forward pass keeps for the backward pass."""
    _, back = jax.vjp(loss, ws, x)
    return sum(leaf.nbytes for leaf in jax.tree_util.tree_leaves(back) if hasattr(leaf, "nbytes"))


def run(quick: bool = False) -> str:
    n, d, depth = (128, 64, 4) if quick else (1024, 256, 8)
    rng = np.random.default_rng(0)
    ws = [jnp.asarray(rng.standard_normal((d, d)) / np.sqrt(d), jnp.float32) for _ in range(depth)]
    x = jnp.asarray(rng.standard_normal((n, d)), jnp.float32)
    grads = {c: jax.jit(lambda ws, x, c=c: zygote_jax.gradient(make_loss(c), ws, x)[0]) for c in (True, False)}
    for a, b in zip(grads[True](ws, x), grads[False](ws, x)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    mem = {c: int(grads[c].lower(ws, x).compile().memory_analysis().temp_size_in_bytes) for c in (True, False)}
    stored = {c: residual_bytes(make_loss(c), ws, x) for c in (True, False)}
    tc, tp = paired_medians(lambda: grads[True](ws, x), lambda: grads[False](ws, x), 3 if quick else 20)
    mib = lambda b: f"{b / 2**20:.2f} MiB"  # noqa: E731
    rows = [[f"{depth} blocks of 4 layers, batch {n}x{d}", f"{mib(stored[True])} / {mib(stored[False])}",
             f"{stored[True] / stored[False]:.3f}", f"{mib(mem[True])} / {mib(mem[False])}",
             f"{tc * 1e3:.2f} / {tp * 1e3:.2f} ms", f"{tc / tp:.2f}"]]
    header = ["model", "stored between passes, checkpointed / plain", "ratio", "XLA scratch, checkpointed / plain",
              "time checkpointed / plain", "time ratio"]
    return "## zygote_jax.checkpointed vs plain\n\n" + table(header, rows) + "\n\n" + __doc__.split("\n\n", 2)[2]


if __name__ == "__main__":
    print(run(quick="--quick" in sys.argv))
