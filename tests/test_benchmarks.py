"""The benchmark scripts cannot rot: `python -m benchmarks --quick` runs every row once, small.

No timing is asserted (timings belong in benchmarks/RESULTS.md); the run must succeed and
print every table, and the rows that compare compiled programs must find them identical.
"""

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_benchmarks_run_in_quick_mode():
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick"], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for title in ("## Lowering", "## zygote_jax.gradient vs jax.grad", "## zygote_jax.checkpointed", "## Testers",
                  "## Library rules"):
        assert title in result.stdout
    assert "compiled HLO identical" in result.stdout  # the lowering adds no instruction
