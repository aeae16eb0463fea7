"""Tests for rules/_check.py and the pytest plugin (rules_pytest, rules/testing/_plugin.py).

`python -m rules check` and `pytest --rules-check` run as subprocesses on tiny modules written
to a temporary folder, never on the whole library (tests/rules/library check every shipped
example in-process). The rest runs in-process, with the example registry swapped for a copy so
that the tiny modules' registrations do not outlive the test.
"""

import io
import json
import os
import pathlib
import subprocess
import sys
import textwrap
import tomllib
import xml.etree.ElementTree as ET

import pytest

import rules
import rules._check
import rules._registry
from rules._check import CheckRow, cases, check_all, format_table, import_modules, main

ROOT = pathlib.Path(__file__).resolve().parents[2]
HEADER = "| function | rules | modes | example | max rel. error | jit/vmap | seconds | status |"

TINY = '''
"""Tiny rules for the check tests: one right, one wrong."""

import jax.numpy as jnp
import numpy as np

import rules
from rules import NoTangent


@rules.primitive(examples=[(np.array([0.3, -1.2, 0.7]),)])
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

GOOD = '''
"""One right rule, with two examples."""

import numpy as np

import rules


@rules.primitive(examples=[(np.array([0.5, 2.0]),), (np.array([[1.5, -1.0]], np.float32),)])
def good_cube(x):
    return x**3


@good_cube.rrule
def good_cube_rrule(x):
    def good_cube_pullback(y_bar):
        return rules.NoTangent(), y_bar * 3 * x**2

    return good_cube(x), good_cube_pullback
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


def _env(**extra):
    env = dict(os.environ, JAX_PLATFORMS="cpu", **extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def _check(*args, cwd):
    return subprocess.run([sys.executable, "-m", "rules", *args], capture_output=True, text=True,
                          env=_env(), cwd=cwd, timeout=300)


def _pytest(*args, cwd):
    """A nested pytest in `cwd` (its own pytest.ini: not this repo's configuration), with only
    this plugin (no auto-loaded ones), as the entry point in pyproject.toml loads it."""
    (cwd / "pytest.ini").write_text("[pytest]\n")
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "rules_pytest", "-p", "no:cacheprovider", *args],
                          capture_output=True, text=True, env=_env(PYTEST_DISABLE_PLUGIN_AUTOLOAD="1"),
                          cwd=cwd, timeout=300)


def _write(folder, relative, source):
    path = folder / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source))
    return path


@pytest.fixture
def fresh_examples(monkeypatch):
    """Registrations of examples made during the test go into copies, dropped afterwards."""
    monkeypatch.setattr(rules._registry, "_examples", dict(rules._registry._examples))
    monkeypatch.setattr(rules._registry, "_example_modules", dict(rules._registry._example_modules))


@pytest.fixture
def scratch(tmp_path, monkeypatch, fresh_examples):
    """A folder on sys.path for tiny modules; the modules imported from it are forgotten after."""
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        if str(getattr(sys.modules[name], "__file__", "") or "").startswith(str(tmp_path)):
            del sys.modules[name]


# ------------------------------------------------------------------------------------------
# The command, in a subprocess
# ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    """`check zj_cli_pkg.wrong good.py --json --junit-xml` in a folder holding those modules."""
    folder = tmp_path_factory.mktemp("check")
    _write(folder, "zj_cli_pkg/__init__.py", "")
    _write(folder, "zj_cli_pkg/wrong.py", TINY)
    _write(folder, "more/zj_cli_good.py", GOOD)
    proc = _check("check", "zj_cli_pkg.wrong", "more/zj_cli_good.py",
                  "--json", "reports/check.json", "--junit-xml", "reports/check.xml", cwd=folder)
    return proc, folder


def test_dotted_module_path_and_file_path(checked):
    proc, _ = checked
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = proc.stdout
    assert "2 module(s): zj_cli_pkg.wrong, zj_cli_good (more/zj_cli_good.py)" in out
    assert HEADER in out
    assert "| good_sin | rrule | fwd+rev | f64[3] |" in out and "| good_cube | rrule | fwd+rev | f32[1, 2] |" in out
    assert "| bad_sin | rrule | - | f64[3] | - | - |" in out and out.count("| FAIL |") == 1
    assert "3 passed, 1 failed: 4 examples of 3 functions checked" in out
    assert "FAIL bad_sin (f64[3]):\ntest_rrule(bad_sin): cotangent does not match finite differences" in out


def test_progress_lines_on_stderr_when_piped(checked):
    proc, _ = checked
    progress = [line for line in proc.stderr.splitlines() if line.startswith("[")]
    assert progress == [
        "[1/4] good_sin f64[3] ...", "[2/4] bad_sin f64[3] ...",
        "[3/4] good_cube f64[2] ...", "[4/4] good_cube f32[1, 2] ...",
    ]


def test_json_report(checked):
    _, folder = checked
    report = json.loads((folder / "reports" / "check.json").read_text())
    assert report["modules"] == ["zj_cli_pkg.wrong", "zj_cli_good"]
    summary = report["summary"]
    assert (summary["passed"], summary["failed"], summary["examples"], summary["functions"]) == (3, 1, 4, 3)
    rows = {(r["function"], r["example"]): r for r in report["rows"]}
    bad, good = rows[("bad_sin", "f64[3]")], rows[("good_cube", "f64[2]")]
    assert (bad["status"], bad["max_error"], bad["module"]) == ("FAIL", None, "zj_cli_pkg.wrong")
    assert "cotangent does not match finite differences" in bad["message"]
    assert (good["status"], good["rules"], good["lowered"]) == ("ok", "rrule", "jit+vmap")
    assert good["module"] == "zj_cli_good"
    assert good["max_error"] < 1e-8


def test_junit_xml_report(checked):
    _, folder = checked
    suite = ET.parse(folder / "reports" / "check.xml").getroot().find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("4", "1", "0")
    cases_ = {case.get("name"): case for case in suite.iter("testcase")}
    assert set(cases_) == {"good_sin[f64[3]]", "bad_sin[f64[3]]", "good_cube[f64[2]]", "good_cube[f32[1, 2]]"}
    bad = cases_["bad_sin[f64[3]]"]
    assert bad.get("classname") == "zj_cli_pkg.wrong"
    failure = bad.find("failure")
    assert failure.get("message") == "test_rrule(bad_sin): cotangent does not match finite differences"
    assert "argument: argument 1 (x)" in failure.text
    assert cases_["good_cube[f64[2]]"].find("failure") is None
    assert "max rel. error: " in cases_["good_cube[f64[2]]"].find("system-out").text


def test_jobs_check_in_worker_processes_with_the_same_rows_in_the_same_order(checked):
    """`--jobs 2`: two worker processes import the same modules (a dotted name and a file)
    and check the examples they are sent; the table is the one `--jobs 1` printed."""
    proc, folder = checked
    again = _check("check", "zj_cli_pkg.wrong", "more/zj_cli_good.py", "--jobs", "2", cwd=folder)
    assert again.returncode == 1, again.stdout + again.stderr
    rows = lambda out: [line.rsplit("|", 3)[0] for line in out.splitlines() if line.startswith("| ")]  # noqa: E731
    assert rows(again.stdout) == rows(proc.stdout) and len(rows(proc.stdout)) == 5  # header and 4 rows
    assert "3 passed, 1 failed: 4 examples of 3 functions checked" in again.stdout


def test_jobs_fall_back_to_this_process_when_workers_list_other_examples(tmp_path):
    """A module that registers examples differently in a worker process (here: one more in
    the main process) cannot be checked by workers: the examples are checked in the main
    process, after a line saying why, with no traceback."""
    _write(tmp_path, "zj_unsteady.py", GOOD + textwrap.dedent('''
        import multiprocessing

        if multiprocessing.parent_process() is None:  # the main process only
            rules.register_examples(good_cube, [(np.array([1.0, 2.0, 3.0]),)])
    '''))
    proc = _check("check", "zj_unsteady", "--jobs", "2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 passed, 0 failed: 3 examples of 1 functions checked" in proc.stdout
    assert "the worker processes cannot check" in proc.stderr and "checking the 3 examples left" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_cache_dir_keeps_the_compiled_programs_for_the_next_check(tmp_path):
    """`--cache-dir DIR`: JAX's persistent compilation cache, also for the checks' small
    programs; a second check (here by worker processes) reads them and gives the same rows."""
    _write(tmp_path, "zj_cached.py", GOOD)
    cache = tmp_path / "xla-cache"
    first = _check("check", "zj_cached", "--cache-dir", str(cache), cwd=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    entries = set(p.name for p in cache.iterdir())
    assert len(entries) >= 4  # the rule, finite differences and lowered programs of two examples
    again = _check("check", "zj_cached", "--cache-dir", str(cache), "--jobs", "2", cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    rows = lambda out: [line.rsplit("|", 3)[0] for line in out.splitlines() if line.startswith("| ")]  # noqa: E731
    assert rows(again.stdout) == rows(first.stdout)
    assert set(p.name for p in cache.iterdir()) == entries  # every program read, none compiled anew


def test_help_exits_0_and_lists_the_options(tmp_path):
    proc = _check("check", "--help", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: python -m rules check")
    for text in ("MODULE", "--jobs N", "--cache-dir DIR", "--json PATH", "--junit-xml PATH", "mypkg.rules", "path/to/myrules.py",
                 "exit status: 0 all passed, 1 a rule failed, 2 usage or import error"):
        assert text in proc.stdout


def test_bad_module_name_exits_2_with_a_clear_message(tmp_path):
    proc = _check("check", "zj_no_such_module", cwd=tmp_path)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "cannot check `zj_no_such_module`: no module of that name" in proc.stderr
    assert "a library module (elementwise, implicit, linalg," in proc.stderr


# ------------------------------------------------------------------------------------------
# In-process: module names, selection, rows, main
# ------------------------------------------------------------------------------------------


def test_import_modules_short_dotted_and_path_names(scratch):
    _write(scratch, "zj_imp_pkg/__init__.py", "")
    _write(scratch, "zj_imp_pkg/sub.py", GOOD)
    file = _write(scratch, "elsewhere/zj_imp_file.py", TINY)
    clash = _write(scratch, "proj/rules.py", EXTRA)  # must not replace the package `rules`
    names = import_modules(["nondiff", "zj_imp_pkg.sub", str(file), str(clash)])
    assert names[:3] == ["rules.library.nondiff", "zj_imp_pkg.sub", "zj_imp_file"]
    assert names[3] != "rules" and sys.modules["rules"] is rules
    assert sys.modules[names[3]].__file__ == str(clash)
    assert import_modules([str(scratch / "zj_imp_pkg" / "sub.py")]) == ["zj_imp_pkg.sub"]  # imported already
    assert {rules._registry.function_name(f) for f, _ in cases([names[3]])} == {"crash_pow", "no_rule"}


def test_import_errors(scratch):
    _write(scratch, "zj_raises.py", "raise ValueError('oops in the module')\n")
    _write(scratch, "zj_needs.py", "import zj_missing_dependency\n")
    with pytest.raises(rules._check.CheckImportError, match="no module of that name") as info:
        import_modules(["zj_nope.rules"])
    assert info.value.__cause__ is None
    with pytest.raises(rules._check.CheckImportError, match="no Python file there"):
        import_modules([str(scratch / "missing.py")])
    for name, error in [("zj_raises", "ValueError: oops in the module"),
                        ("zj_needs", "No module named 'zj_missing_dependency'")]:
        with pytest.raises(rules._check.CheckImportError, match="importing it raised") as info:
            import_modules([name])
        text = info.value.describe()
        assert text.startswith("Traceback") and f'{name}.py", line 1, in <module>' in text and error in text
        assert "importlib" not in text and "_check.py" not in text  # the module's own frames only


def test_cases_select_a_module_and_its_submodules(scratch):
    _write(scratch, "zj_sel/__init__.py", "from . import a, b\n")
    _write(scratch, "zj_sel/a.py", TINY)
    _write(scratch, "zj_sel/b.py", GOOD)
    _write(scratch, "zj_sel_other.py", EXTRA)
    import_modules(["zj_sel", "zj_sel_other"])

    def names(modules):
        return sorted(rules._registry.function_name(f) for f, _ in cases(modules))

    assert names(["zj_sel"]) == ["bad_sin", "good_cube", "good_cube", "good_sin"]
    assert names(["zj_sel.b"]) == ["good_cube", "good_cube"]
    assert names(["zj_sel.a", "zj_sel_other"]) == ["bad_sin", "crash_pow", "good_sin", "no_rule"]
    assert cases(["zj_se"]) == [] and cases(["no_such_module_registered_anything"]) == []


def test_check_all_rows(scratch):
    _write(scratch, "zj_rows.py", TINY + EXTRA)
    import_modules(["zj_rows"])
    progress = io.StringIO()
    rows = check_all(modules=["zj_rows"], progress=progress)
    assert all(isinstance(r, CheckRow) and r.module == "zj_rows" for r in rows)
    by = {(r.function, r.example): r for r in rows}
    assert set(by) == {("good_sin", "f64[3]"), ("bad_sin", "f64[3]"), ("crash_pow", "f64[2], 3"), ("no_rule", "f64[1]")}

    good = by[("good_sin", "f64[3]")]
    assert (good.rules, good.status, good.lowered, good.message) == ("rrule", "ok", "jit+vmap", "")
    assert good.modes == "fwd+rev"  # an rrule alone: forward mode transposes its pullback
    assert good.max_error is not None and good.max_error < 1e-8 and good.seconds > 0

    bad = by[("bad_sin", "f64[3]")]
    assert (bad.rules, bad.status, bad.max_error) == ("rrule", "FAIL", None)
    assert "test_rrule(bad_sin): cotangent does not match finite differences" in bad.message

    crash = by[("crash_pow", "f64[2], 3")]
    assert (crash.rules, crash.status, crash.message) == ("frule", "ERROR", "RuntimeError: boom")
    with pytest.raises(RuntimeError, match="boom"):  # the pytest plugin shows the traceback
        rules._check._check_one(*cases(["zj_rows"])[2], reraise=True)

    none = by[("no_rule", "f64[1]")]
    assert (none.rules, none.status) == ("none", "FAIL") and "no rule applies" in none.message

    assert progress.getvalue().splitlines()[-1] == "[4/4] no_rule f64[1] ..."  # not a terminal: lines

    table = format_table(rows)
    assert table.splitlines()[:2] == [HEADER, "|---|---|---|---|---|---|---|---|"]
    assert "1 passed, 3 failed: 4 examples of 4 functions checked" in table
    assert "\nFAIL bad_sin (f64[3]):\n" in table and "\nERROR crash_pow (f64[2], 3):\n" in table


class _Stream(io.StringIO):
    """What a pipe has received: the text up to the last flush."""

    flushed = ""

    def flush(self):
        self.flushed = self.getvalue()


def test_rows_are_printed_and_flushed_as_each_check_finishes(scratch, monkeypatch):
    _write(scratch, "zj_stream.py", TINY)
    out, err, seen = _Stream(), _Stream(), []
    check_one = rules._check._check_one

    def spy(f, example, **kwargs):
        seen.append((out.flushed, err.flushed))
        return check_one(f, example, **kwargs)

    monkeypatch.setattr(rules._check, "_check_one", spy)
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    assert main(["check", "zj_stream"]) == 1
    (out1, err1), (out2, err2) = seen
    assert "1 module(s): zj_stream" in out1 and HEADER in out1 and "| good_sin |" not in out1
    assert err1.endswith("[1/2] good_sin f64[3] ...\n")
    assert "| good_sin | rrule | fwd+rev | f64[3] |" in out2 and "| bad_sin |" not in out2  # before the 2nd check starts
    assert err2.endswith("[2/2] bad_sin f64[3] ...\n")
    assert "| bad_sin | rrule | - | f64[3] |" in out.flushed and "1 passed, 1 failed" in out.flushed


def test_main_exit_status(scratch, capsys):
    _write(scratch, "zj_pass.py", GOOD)
    _write(scratch, "zj_fail.py", TINY)
    _write(scratch, "zj_empty.py", "X = 1\n")
    assert main(["check", "zj_pass"]) == 0
    assert main(["check", "zj_fail"]) == 1
    capsys.readouterr()
    assert main(["check", "--help"]) == 0 and "--junit-xml" in capsys.readouterr().out
    for argv, message in [([], "required: COMMAND"), (["frobnicate"], "invalid choice"),
                          (["check", "--bogus"], "unrecognized arguments: --bogus"),
                          (["check", "zj_empty"], "nothing to check in zj_empty"),
                          (["check", "zj_nope"], "cannot check `zj_nope`: no module of that name"),
                          (["check", "zj_pass", "--jobs", "-1"], "--jobs must be 0 (one per core) or more")]:
        assert main(argv) == 2, argv
        assert message in capsys.readouterr().err


def test_default_jobs_one_process_below_32_examples_then_one_per_core(monkeypatch):
    from rules._check import default_jobs

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    assert [default_jobs(n) for n in (1, 31, 32, 48, 64, 1000)] == [1, 1, 2, 3, 4, 4]


def test_no_arguments_checks_the_whole_library(monkeypatch, capsys):
    checked = []

    def fake_check_one(f, example, **kwargs):  # selection only: the checks run in tests/rules/library
        checked.append(f)
        return CheckRow(rules._registry.function_name(f), "rrule", "x")

    monkeypatch.setattr(rules._check, "_check_one", fake_check_one)
    assert main(["check", "--jobs", "1"]) == 0  # in this process, where the fake is
    out = capsys.readouterr().out
    assert f"{len(rules._check.library_modules())} module(s): rules.library.elementwise, rules.library.implicit," in out
    assert len(rules._check.library_modules()) == 14  # the topic modules; not the drop-in package rules.library.jax
    # everything registered in this process: the library, and whatever other tests registered
    library = [f for f, _ in cases(["rules.library"])]
    assert checked == [f for f, _ in cases()] and len(library) > 100 and set(library) <= set(checked)


# ------------------------------------------------------------------------------------------
# The pytest plugin, in a subprocess
# ------------------------------------------------------------------------------------------


def test_pytest_plugin_one_item_per_example(tmp_path):
    _write(tmp_path, "zj_plugin_rules.py", TINY)
    _write(tmp_path, "test_other.py", "def test_other():\n    pass\n")
    proc = _pytest("--rules-check=zj_plugin_rules", "-m", "rules_check", "-rA", "--junitxml=junit.xml", cwd=tmp_path)
    out = proc.stdout
    assert proc.returncode == 1, out + proc.stderr
    assert "1 failed, 1 passed, 1 deselected" in out  # `-m rules_check` keeps the rule checks only
    assert "PASSED rules-check/zj_plugin_rules::good_sin[f64[3]]" in out
    assert "FAILED rules-check/zj_plugin_rules::bad_sin[f64[3]]" in out
    failure = out.split("zj_plugin_rules: bad_sin[f64[3]]", 1)[1]
    assert failure.lstrip("_ \n").startswith("test_rrule(bad_sin): cotangent does not match finite differences\n"
                                             "  argument: argument 1 (x)")
    junit = {case.get("name"): case for case in ET.parse(tmp_path / "junit.xml").getroot().iter("testcase")}
    assert junit["bad_sin[f64[3]]"].get("classname") == "rules-check.zj_plugin_rules"
    assert "test_rrule(bad_sin)" in junit["bad_sin[f64[3]]"].find("failure").text


def test_pytest_plugin_is_inert_without_the_option(tmp_path):
    _write(tmp_path, "test_inert.py", """
        import sys

        def test_nothing_imported(request):
            assert request.config.getoption("rules_check") == []
            assert "jax" not in sys.modules and "rules" not in sys.modules
    """)
    proc = _pytest(cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed" in proc.stdout


def test_pytest_plugin_bad_module_is_a_collection_error(tmp_path):
    proc = _pytest("--rules-check=zj_no_such_module", cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "ERROR collecting rules-check/zj_no_such_module" in proc.stdout
    assert "cannot check `zj_no_such_module`: no module of that name" in proc.stdout


def test_pytest_plugin_entry_point_is_declared():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["pytest11"] == {"rules_pytest": "rules_pytest"}  # named as `-p` names it
