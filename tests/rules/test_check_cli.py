"""Tests for rules/_check.py: `python -m rules check [MODULE ...]`.

Three subprocesses (the real command on a shipped module, on a module with a wrong rule, and
`--help`); everything else runs in-process on tiny modules written to a temporary folder,
with the example registry swapped for a copy so their registrations do not outlive the test.
"""

import io
import os
import subprocess
import sys
import textwrap

import pytest

import rules._registry
from rules._check import CheckRow, check_all, format_table, import_modules, main

HEADER = "| function | rules | example | max rel. error | jit/vmap | seconds | status |"

TINY = '''
"""Tiny rules for the `python -m rules check` tests: one right, one wrong, one that crashes."""

import jax.numpy as jnp
import numpy as np

import rules
from rules import NoTangent


@rules.primitive(examples=[(np.array([0.3, -1.2, 0.7]),), (np.array([[0.5, 1.5]], np.float32),)])
def good_sin(x):
    return jnp.sin(x)


@good_sin.rrule
def good_sin_rrule(x):
    def good_sin_pullback(y_bar):
        return NoTangent(), y_bar * jnp.cos(x)

    return good_sin(x), good_sin_pullback


@rules.primitive(examples=[(np.array([0.3, -1.2, 0.7]),)])
def bad_sin(x):
    return jnp.sin(x)


@bad_sin.rrule
def bad_sin_rrule(x):
    def bad_sin_pullback(y_bar):
        return NoTangent(), 1.001 * y_bar * jnp.cos(x)  # deliberately wrong

    return bad_sin(x), bad_sin_pullback
'''

EXTRA = '''
import numpy as np

import rules


@rules.primitive(examples=[(np.array([1.0, 2.0]), 3)])
def crash_pow(x, n):
    return x ** n


@crash_pow.frule
def crash_pow_frule(tangents, x, n):
    raise RuntimeError("boom")


@rules.primitive(examples=[(np.array([1.0]),)])
def no_rule(x):
    return x
'''


def _run(*args, pythonpath=None):
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(pythonpath), env.get("PYTHONPATH", "")) if p)
    return subprocess.run([sys.executable, "-m", "rules", *args], capture_output=True, text=True, env=env,
                          timeout=300)


@pytest.fixture
def fresh_examples(monkeypatch):
    """Registrations of examples made during the test go into copies, dropped afterwards."""
    monkeypatch.setattr(rules._registry, "_examples", dict(rules._registry._examples))
    monkeypatch.setattr(rules._registry, "_example_modules", dict(rules._registry._example_modules))


def _write_module(tmp_path, monkeypatch, name, source):
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)


# ------------------------------------------------------------------------------------------
# The command, in a subprocess
# ------------------------------------------------------------------------------------------


def test_check_shipped_module_passes_and_lists_only_that_module():
    proc = _run("check", "nondiff")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "1 module(s): rules.library.nondiff" in out
    assert HEADER in out
    assert "| jax.numpy.floor | rrule+frule | f64[3] |" in out
    assert "jax.numpy.sin " not in out and "jax.numpy.exp " not in out  # elementwise is not checked
    rows = [line for line in out.splitlines() if line.startswith("| jax.")]
    assert rows and all(line.endswith("| ok |") for line in rows)
    assert f"{len(rows)} passed, 0 failed: {len(rows)} examples of" in out


def test_check_module_with_a_wrong_rule_exits_1_and_names_it(tmp_path):
    (tmp_path / "zj_cli_wrong_rules.py").write_text(textwrap.dedent(TINY))
    proc = _run("check", "zj_cli_wrong_rules", pythonpath=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = proc.stdout
    assert "1 module(s): zj_cli_wrong_rules" in out
    assert "| good_sin | rrule | f64[3] |" in out and "| good_sin | rrule | f32[1, 2] |" in out
    assert "| bad_sin | rrule | f64[3] |" in out and "| FAIL |" in out
    assert "2 passed, 1 failed: 3 examples of 2 functions checked" in out
    assert "FAIL bad_sin (f64[3]):" in out
    assert "test_rrule(bad_sin): cotangent does not match finite differences" in out
    assert "argument: argument 1" in out


def test_help_exits_0():
    proc = _run("--help")
    assert proc.returncode == 0
    assert proc.stdout.startswith("usage: python -m rules check [MODULE ...]")


# ------------------------------------------------------------------------------------------
# In-process: check_all, CheckRow, format_table, main
# ------------------------------------------------------------------------------------------


def test_check_all_rows(tmp_path, monkeypatch, fresh_examples):
    name = "zj_cli_tiny_rules"
    _write_module(tmp_path, monkeypatch, name, TINY + EXTRA)
    assert import_modules([name]) == [name]
    progress = io.StringIO()
    rows = check_all(modules=[name], progress=progress)
    assert all(isinstance(r, CheckRow) for r in rows)
    by = {(r.function, r.example): r for r in rows}
    assert set(by) == {
        ("good_sin", "f64[3]"), ("good_sin", "f32[1, 2]"), ("bad_sin", "f64[3]"),
        ("crash_pow", "f64[2], 3"), ("no_rule", "f64[1]"),
    }

    good = by[("good_sin", "f64[3]")]
    assert (good.rules, good.status, good.lowered, good.message) == ("rrule", "ok", "jit+vmap", "")
    assert good.max_error is not None and good.max_error < 1e-8 and good.seconds > 0
    good32 = by[("good_sin", "f32[1, 2]")]
    assert good32.status == "ok" and good32.max_error < 1e-4

    bad = by[("bad_sin", "f64[3]")]
    assert (bad.rules, bad.status, bad.max_error) == ("rrule", "FAIL", None)
    assert "test_rrule(bad_sin): cotangent does not match finite differences" in bad.message

    crash = by[("crash_pow", "f64[2], 3")]
    assert (crash.rules, crash.status, crash.message) == ("frule", "ERROR", "RuntimeError: boom")

    none = by[("no_rule", "f64[1]")]
    assert (none.rules, none.status) == ("none", "FAIL") and "no rule applies" in none.message

    assert "[5/5] no_rule" in progress.getvalue()  # the progress line

    table = format_table(rows)
    assert table.splitlines()[0] == HEADER
    assert "2 passed, 3 failed: 5 examples of 4 functions checked" in table
    assert "\nFAIL bad_sin (f64[3]):\n" in table and "\nERROR crash_pow (f64[2], 3):\n" in table


def test_check_all_selects_by_module(tmp_path, monkeypatch, fresh_examples):
    _write_module(tmp_path, monkeypatch, "zj_cli_select_a", TINY)
    _write_module(tmp_path, monkeypatch, "zj_cli_select_b", EXTRA)
    import_modules(["zj_cli_select_a", "zj_cli_select_b"])
    assert {r.function for r in check_all(modules=["zj_cli_select_b"])} == {"crash_pow", "no_rule"}
    assert check_all(modules=["no_such_module_registered_anything"]) == []


def test_main_in_process(tmp_path, monkeypatch, fresh_examples, capsys):
    assert main(["--help"]) == 0
    assert main([]) == 2 and main(["frobnicate"]) == 2
    assert capsys.readouterr().out.count("usage: python -m rules check") == 3

    _write_module(tmp_path, monkeypatch, "zj_cli_main_rules", TINY)
    assert main(["check", "zj_cli_main_rules"]) == 1
    out = capsys.readouterr().out
    assert HEADER in out and "FAIL bad_sin" in out
