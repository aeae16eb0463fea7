"""The test suite's wall time and CPU time: README's test command, as CI runs it.

A fresh `python -m pytest -n auto -p no:cacheprovider` subprocess over tests/ (its workers,
JAX's import, every compilation, the notebooks and the benchmarks' quick run included), its
wall time read around the subprocess and its CPU time (user + system, all its processes) from
the operating system. Target (issue 13): <= 4 minutes on 2 cores.

Side by side, the same command with XLA's default CPU emitters
(`XLA_FLAGS=--xla_cpu_use_fusion_emitters=true`), the baseline: the root conftest.py has
XLA:CPU generate fused loops with its elemental emitter, and the suite's time is mostly
compilation (about 6300 programs compiled in the workers, ~85% of their time in JAX's
trace-lower-compile pipeline). The suite's setting runs first, then the baseline. The CPU
time is the steadier number on a shared machine: the wall time of one commit moved between
4:20 and 5:06 within one day here. Each run starts with an empty compilation cache of its
own (the root conftest.py keeps compiled programs in `.jax_cache/`, which would make the
second and later runs read the first's), so both are timed as CI's first run is. Quick mode (and `tests/test_benchmarks.py`, which runs it)
does not run the suite, which would run itself.
"""

from __future__ import annotations

import os
import pathlib
import re
import resource
import subprocess
import sys
import tempfile
import time

from ._common import table

TARGET_S = 240.0
DEFAULT_EMITTERS = "--xla_cpu_use_fusion_emitters=true"


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _suite(root: pathlib.Path, env: dict[str, str]) -> tuple[float, float, str, int]:
    """Wall seconds, CPU seconds, pytest's summary line and the exit status of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with tempfile.TemporaryDirectory() as cache:  # cold, as CI's first run
        start = time.perf_counter()
        # README's command (pyproject's addopts add -q; a second -q would hide the summary line)
        out = subprocess.run([sys.executable, "-m", "pytest", "-n", "auto", "-p", "no:cacheprovider"],
                             cwd=root, capture_output=True, text=True, env=dict(env, JAX_COMPILATION_CACHE_DIR=cache))
        wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    summary = next((line for line in reversed(out.stdout.splitlines()) if re.search(r"\d+ (passed|failed)", line)),
                   f"exit status {out.returncode}")
    return wall, cpu, summary.strip("= "), out.returncode


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}:{seconds % 60:04.1f} ({seconds:.0f} s)"


def run(quick: bool = False) -> str:
    head = "## Test suite: `python -m pytest -n auto`\n\n"
    if quick:
        return head + "(not run in quick mode: the suite would run itself)"
    root = pathlib.Path(__file__).resolve().parent.parent
    ours = dict(os.environ)
    baseline = dict(os.environ, XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} {DEFAULT_EMITTERS}".strip())
    wall, cpu, summary, status = _suite(root, ours)
    base_wall, base_cpu, base_summary, _ = _suite(root, baseline)
    verdict = "met" if wall <= TARGET_S and status == 0 else "MISSED"
    rows = [
        [f"README's command, the suite's settings ({_cores()} cores)", f"{_minutes(wall)}; target <= 240 s: {verdict}",
         f"{cpu:.0f} s", summary],
        ["baseline: XLA's default CPU emitters", _minutes(base_wall), f"{base_cpu:.0f} s", base_summary],
        ["ratio (settings / baseline)", f"{wall / base_wall:.2f}", f"{cpu / base_cpu:.2f}", ""],
    ]
    return head + table(["run", "wall time", "CPU time (user + system)", "result"], rows) + "\n\n" + (
        (__doc__ or "").split("\n\n", 1)[1])


if __name__ == "__main__":
    print(run(quick="--quick" in sys.argv))
