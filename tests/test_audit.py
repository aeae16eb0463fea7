"""`pytest --rules-audit` on a small project (tests/data/audit_project): its own tests run as
they are, and every custom derivative they called eagerly is then checked, one item each."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

PROJECT = pathlib.Path(__file__).parent / "data" / "audit_project"


def _pytest(*options: str, tmp_path: pathlib.Path) -> subprocess.CompletedProcess:
    ini = tmp_path / "pytest.ini"
    ini.write_text("[pytest]\npython_files = check_*.py\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PROJECT), os.environ.get("PYTHONPATH", "")]),
           "JAX_PLATFORMS": "cpu"}
    return subprocess.run([sys.executable, "-m", "pytest", "-c", str(ini), "--rootdir", str(PROJECT), "--confcutdir", str(PROJECT),
                           "-p", "no:xdist",
                           "-p", "no:cacheprovider", "-rA", *options, str(PROJECT)],
                          capture_output=True, text=True, env=env, cwd=PROJECT, timeout=300)


def test_the_audit_checks_each_custom_derivative_the_tests_called(tmp_path):
    done = _pytest("--rules-audit", tmp_path=tmp_path)
    out = done.stdout
    assert done.returncode == 1, out[-4000:]  # one rule is wrong
    # noisy: a keyword named like a tester option; outer: a custom_jvp calling a custom_vjp;
    # norm2: its call that raised (outside its domain) is not checked, its other call is
    for passed in ("softclip", "smooth_relu", "cube", "noisy", "outer", "norm2"):
        assert f"PASSED rules-audit::{passed}" in out, out[-4000:]
    assert "FAILED rules-audit::scaled_square" in out, out[-4000:]
    assert "cotangent does not match finite differences" in out and "argument 1 (x)" in out
    # a static argument is part of a call's signature: the call with "mean" is checked too
    assert "FAILED rules-audit::reduce - test_rrule at (float32[3], str='mean'" in out, out[-4000:]
    assert "not checked at (float32[3], float=0.5[]): keyword argument(s) rtol" in out  # tolerant: a primitive
    assert "only_traced" not in out  # called only under jit, with tracers: not recorded
    assert "PASSED check_myrules.py::test_values" in out and "PASSED check_myrules.py::test_under_jit_only" in out
    assert "rules-audit: 9 function(s) with custom derivatives recorded, checked" in out


def test_a_run_that_stops_early_is_not_audited(tmp_path, monkeypatch):
    monkeypatch.setenv("ZJ_AUDIT_EXIT", "1")  # a test calls pytest.exit
    done = _pytest("--rules-audit", tmp_path=tmp_path)
    assert "PASSED rules-audit" not in done.stdout and "previous item was not torn down" not in done.stdout
    assert "recorded, not checked: the run stopped before the audit" in done.stdout, done.stdout[-3000:]


def test_without_the_option_nothing_is_audited(tmp_path):
    done = _pytest(tmp_path=tmp_path)
    assert done.returncode == 0 and "rules-audit" not in done.stdout, done.stdout[-3000:]


def test_the_audit_refuses_xdist_workers(tmp_path):
    done = _pytest("--rules-audit", "-p", "xdist", "-n", "2", tmp_path=tmp_path)
    assert done.returncode != 0 and "without pytest-xdist" in (done.stdout + done.stderr)
