"""The packages type-check: `python -m mypy`, configured in pyproject.toml, finds no error.

The packages ship `py.typed` (PEP 561), so their annotations are part of the API; a change
that makes them inconsistent fails here rather than in a user's type checker.
"""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_mypy_finds_no_error(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "mypy_cache")],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Success: no issues found" in proc.stdout
