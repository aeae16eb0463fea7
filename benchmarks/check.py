"""`python -m rules check` on the whole library: wall time, in one process and with workers.

Each run is a fresh `python -m rules check` subprocess (JAX's import, the library's import and
every compilation included, as a user or CI pays them), its wall time read around the
subprocess. `--jobs 1` checks every example in the one process; the default spreads them
over one worker process per core (2 here), and is run three times: the median is reported,
with every run. Target (issue 13): the whole library in <= 25 s on 2 cores. Quick mode
checks one small module once, with the default (one process, for so few examples).

Where the time went (one process, before this issue's last changes): XLA's compilation of
about 990 programs took half, JAX's lowering of them to MLIR a fifth, tracing an eighth.
Lowering and compiling a program costs ~25 ms however small it is. So: the testers compile
small programs at XLA:CPU's optimization level 0 with its elemental emitter in one LLVM
module (98 ms -> 43 ms per program, on the library's 948 check programs); each tester call
compiles one program (the lowered primitive's checks traced into the rule's own), not two
or three, from its one trace; and test_frule reuses the finite-difference evaluation that
test_rrule's exact check compiled for the same function. Side by side, alternating runs in
one hour: 60.5 and 63.9 s before these changes, 24.7 and 26.0 s after all but the last;
the last one alone moved three pairs from 25.7-28.1 s to 22.6-26.0 s. This machine's speed
moves by ~15% within the hour: the median above is of one such hour. Since issue 25 every
check traces its code anew and a compilation is found by the lowered module's text (no
trace is kept, no jaxpr printed for a key): side by side in one process 38.8 s before and
41.3 s after, the finite differences of a repeated function now lowered again before their
compilation is reused.

jax 0.12's XLA compiles each small program ~2.7x slower than jax 0.10's (every fused kernel
through MLIR, ~7 ms each; rules/testing/README.md), and the check's first run there takes
about a minute. The row "cache warm" is a second check with `--cache-dir`, reading the programs that
a first one (not timed) wrote to a new folder; the other rows compile everything.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time

from ._common import table

REPEATS = 3  # default runs, their median reported: the shared 2-core machine moves one by ~3 s


def _timed(args: list[str]) -> tuple[float, str]:
    start = time.perf_counter()
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}  # only `--cache-dir` keeps any
    proc = subprocess.run([sys.executable, "-m", "rules", "check", *args], capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        command = " ".join(["python -m rules check", *args])
        raise RuntimeError(f"`{command}` failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    summary = next(line for line in proc.stdout.splitlines() if " passed, " in line)
    return seconds, summary


def run(quick: bool = False) -> str:
    modules = ["nondiff"] if quick else []
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    folder = tempfile.mkdtemp(prefix="rules-check-cache-")
    variants = [("--jobs 1 (one process)", ["--jobs", "1"], 1), (f"default ({cores} cores)", [], REPEATS),
                (f"default ({cores} cores), cache warm", ["--cache-dir", folder], 1)]
    if quick:  # one small module is checked in one process either way (below 32 examples): once
        variants = [(f"default ({cores} cores)", [], 1)]
    try:
        if not quick:
            _timed(["--cache-dir", folder])  # fills the folder for the "cache warm" row
        rows = [_row(modules, label, extra, repeats, quick) for label, extra, repeats in variants]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    header = ["modules", "processes", "wall time", "result"]
    import jax  # the version the subprocesses run

    where = f"Measured on jax {jax.__version__}, Python {sys.version.split()[0]} ({cores} cores).\n\n"
    return "## python -m rules check\n\n" + where + table(header, rows) + "\n\n" + __doc__.split("\n\n", 1)[1]


def _row(modules: list[str], label: str, extra: list[str], repeats: int, quick: bool) -> list[str]:
    """One table row: `repeats` runs of the check with `extra` options, their median."""
    runs = [_timed(modules + extra) for _ in range(repeats)]
    times = sorted(seconds for seconds, _ in runs)
    seconds = times[len(times) // 2]
    spread = f" (runs: {', '.join(f'{t:.1f}' for t in times)})" if repeats > 1 else ""
    timed_cold = not extra  # the target: the default, every core, compiling everything
    target = "" if quick or not timed_cold else " (target <= 25 s: " + ("met)" if seconds <= 25 else "MISSED)")
    return [" ".join(modules) or "whole library", label, f"{seconds:.1f} s{target}{spread}", runs[0][1]]


if __name__ == "__main__":
    print(run(quick="--quick" in sys.argv))
