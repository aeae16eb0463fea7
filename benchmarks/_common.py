"""Shared helpers: timing medians and markdown tables."""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable


def median_seconds(fn: Callable[[], Any], repeats: int, warmup: int = 1) -> float:
    """Median wall time of `fn()` over `repeats` runs after `warmup` runs (results blocked on)."""
    import jax

    for _ in range(warmup):
        jax.block_until_ready(fn())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def paired_medians(fa: Callable[[], Any], fb: Callable[[], Any], repeats: int) -> tuple[float, float]:
    """Median wall times of `fa()` and `fb()`, measured alternately so drift hits both alike."""
    import jax

    jax.block_until_ready(fa())
    jax.block_until_ready(fb())
    ta, tb = [], []
    for _ in range(repeats):
        for fn, out in ((fa, ta), (fb, tb)):
            start = time.perf_counter()
            jax.block_until_ready(fn())
            out.append(time.perf_counter() - start)
    return statistics.median(ta), statistics.median(tb)


def table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
