"""`python -m rules check`: verify every rule that carries examples, and print a table.

Examples are attached with `@primitive(examples=[...])`, `scalar_rule(..., examples=...)`
or `rules.register_examples(f, [...])`. For every example, `test_rrule` and/or `test_frule`
run on the rules that apply to it. The same selection runs under pytest as
`pytest --rules-check=MODULE` (`rules.testing._plugin`).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import math
import os
import pkgutil
import re
import sys
import time
import traceback
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, TextIO

import jax
import numpy as np

from . import _registry
from ._errors import format_message
from ._registry import examples_of, frule, function_name, functions_with_examples, rrule

__all__ = [
    "CheckRow", "Column", "COLUMNS", "format_table",
    "CheckImportError", "WorkerError", "library_modules", "default_modules", "import_modules", "cases",
    "iter_check", "iter_check_parallel", "default_jobs", "use_compilation_cache", "check_all", "write_json", "write_junit_xml", "main",
]

# ------------------------------------------------------------------------------------------
# Rows and the table
# ------------------------------------------------------------------------------------------


@dataclass
class CheckRow:
    """One (function, example) checked. A new column is a field here plus an entry in `COLUMNS`."""

    function: str
    rules: str
    example: str
    max_error: float | None = None
    lowered: str = "-"
    seconds: float = 0.0
    status: str = "ok"  # "ok", "FAIL" (a tester's check failed) or "ERROR" (the rule crashed)
    message: str = ""
    module: str = ""  # the module that registered the examples
    modes: str = "-"  # what JAX gets from the primitive: "fwd+rev", or "rev" (no forward mode)


@dataclass(frozen=True)
class Column:
    """A column of the table: its title and how a row fills it."""

    title: str
    cell: Callable[[CheckRow], str]


COLUMNS: list[Column] = [
    Column("function", lambda r: r.function),
    Column("rules", lambda r: r.rules),
    Column("modes", lambda r: r.modes),
    Column("example", lambda r: r.example),
    Column("max rel. error", lambda r: "-" if r.max_error is None else f"{r.max_error:.1e}"),
    Column("jit/vmap", lambda r: r.lowered),
    Column("seconds", lambda r: f"{r.seconds:.2f}"),
    Column("status", lambda r: r.status),
]


def table_header() -> str:
    return "| " + " | ".join(c.title for c in COLUMNS) + " |\n" + "|---" * len(COLUMNS) + "|"


def format_row(row: CheckRow) -> str:
    return "| " + " | ".join(c.cell(row) for c in COLUMNS) + " |"


def format_summary(rows: list[CheckRow]) -> str:
    """The count line, then each failure's message."""
    failed = [r for r in rows if r.status != "ok"]
    functions = len({r.function for r in rows})
    counts = f"{len(rows) - len(failed)} passed, {len(failed)} failed"
    lines = [f"{counts}: {len(rows)} examples of {functions} functions checked"]
    lines += [f"\n{r.status} {r.function} ({r.example}):\n{r.message}" for r in failed]
    return "\n".join(lines)


def format_table(rows: list[CheckRow]) -> str:
    return "\n".join([table_header(), *map(format_row, rows), "", format_summary(rows)])


# ------------------------------------------------------------------------------------------
# Which modules, which functions
# ------------------------------------------------------------------------------------------


class CheckImportError(Exception):
    """A module named for checking cannot be found or imported, or registered no examples.

    `__cause__` holds the exception the module's own code raised while importing, if any.
    """

    def describe(self, prefix: str = "") -> str:
        """The message, after the traceback of the module's own error when there is one."""
        cause = self.__cause__
        if cause is None:
            return prefix + str(self)
        tb = cause.__traceback__  # from the module's own frames on: drop ours and importlib's
        while tb is not None and tb.tb_next is not None and _is_import_machinery(tb.tb_frame.f_code.co_filename):
            tb = tb.tb_next
        return "".join(traceback.format_exception(type(cause), cause, tb)) + "\n" + prefix + str(self)


def _is_import_machinery(filename: str) -> bool:
    importlib_dir = os.path.dirname(importlib.__file__)
    return filename == __file__ or filename.startswith(("<frozen", importlib_dir))


def library_modules() -> list[str]:
    """The short names of the modules shipped in `rules.library` (`linalg`, `nn`, ...); not the
    package `rules.library.jax`, whose drop-in namespaces reuse those modules' rules."""
    import rules.library as library

    return sorted(m.name for m in pkgutil.iter_modules(library.__path__) if not m.name.startswith("_") and not m.ispkg)


def default_modules() -> list[str]:
    """Every module shipped in `rules.library`."""
    return [f"rules.library.{name}" for name in library_modules()]


def import_modules(names: Iterable[str]) -> list[str]:
    """Import the modules to check; return the names their examples are registered under.

    A name is a library module (`linalg` means `rules.library.linalg`), a dotted module path
    (`mypkg.rules`) or a file (`path/to/myrules.py`, or a package's folder), imported by path.

    Raises:
      CheckImportError: a module is not found, or raised while importing.
    """
    shipped = set(library_modules())
    done = []
    for name in names:
        if _is_path(name):
            done.append(_import_path(name))
        else:
            done.append(_import_dotted(f"rules.library.{name}" if name in shipped else name, name))
    return done


def _is_path(name: str) -> bool:
    return name.endswith(".py") or os.sep in name or "/" in name


def _import_dotted(module: str, given: str) -> str:
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name is None or not (module == err.name or module.startswith(err.name + ".")):
            raise _import_failed(given, err) from err  # the module exists, an import inside it failed
        raise CheckImportError(
            format_message(
                f"cannot check `{given}`: no module of that name",
                expected=f"a library module ({', '.join(library_modules())}), "
                "a dotted module path that Python can import (`mypkg.rules`) or a .py file",
                got=f"{given} ({err})",
                fix="install the package or add its folder to PYTHONPATH, or pass the file's path",
            )
        ) from None
    except Exception as err:  # noqa: BLE001 - whatever the module raised, reported with its traceback
        raise _import_failed(given, err) from err
    return module


def _import_path(given: str) -> str:
    path = Path(given).resolve()
    file = path / "__init__.py" if path.is_dir() else path
    if not file.is_file() or file.suffix != ".py":
        raise CheckImportError(
            format_message(
                f"cannot check `{given}`: no Python file there",
                expected="a .py file, or a package folder (with __init__.py)",
                got=f"{given} ({'does not exist' if not path.exists() else 'not a Python file'})",
            )
        )
    for name, module in list(sys.modules.items()):  # imported already (by its dotted name)
        module_file = getattr(module, "__file__", None)
        if module_file and Path(module_file).resolve() == file:
            return name
    name = path.stem
    if name in sys.modules or not name.isidentifier():  # `myproject/rules.py` must not replace `rules`
        name = "_rules_check_" + re.sub(r"\W", "_", name) + f"_{len(sys.modules)}"
    spec = importlib.util.spec_from_file_location(
        name, file, submodule_search_locations=[str(path)] if path.is_dir() else None
    )
    assert spec is not None and spec.loader is not None  # a .py file always gets a source loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    if str(path.parent) not in sys.path:  # as for a script: its folder's modules are importable
        sys.path.append(str(path.parent))
    try:
        spec.loader.exec_module(module)
    except Exception as err:  # noqa: BLE001 - reported with its traceback
        del sys.modules[name]
        raise _import_failed(given, err) from err
    return name


def _import_failed(given: str, err: BaseException) -> CheckImportError:
    return CheckImportError(
        format_message(
            f"cannot check `{given}`: importing it raised {type(err).__name__} (traceback above)",
            got=str(err),
            fix="fix the module until `import` succeeds on its own",
        )
    )


def module_of(f: Any) -> str:
    """The module that registered `f`'s examples."""
    return _registry._example_modules.get(_registry.rule_key(f), "")


def cases(modules: Iterable[str] | None = None) -> list[tuple[Any, tuple]]:
    """Every (function, example) to check: those registered by `modules` or their submodules
    (`mypkg` includes `mypkg.linalg`), or, without `modules`, all of them."""
    functions = functions_with_examples()
    if modules is not None:
        wanted = tuple(modules)
        within = lambda name: any(name == m or name.startswith(m + ".") for m in wanted)  # noqa: E731
        functions = [f for f in functions if within(module_of(f))]
    return [(f, example) for f in functions for example in examples_of(f)]


# ------------------------------------------------------------------------------------------
# Running the checks
# ------------------------------------------------------------------------------------------


def _describe(example: tuple) -> str:
    from .testing._compare import WithTangent

    parts = []
    for x in example:
        x = x.primal if isinstance(x, WithTangent) else x
        leaves = jax.tree_util.tree_leaves(x)
        if len(leaves) == 1 and leaves[0] is x and hasattr(x, "dtype"):
            dtype = np.dtype(x.dtype)
            parts.append(f"{dtype.kind}{dtype.itemsize * 8}{list(np.shape(x))}")
        elif isinstance(x, (bool, int, float, complex, str)) or x is None:
            parts.append(repr(x))
        elif callable(x):
            parts.append(getattr(x, "__name__", type(x).__name__))
        else:
            parts.append(f"{type(x).__name__}({len(leaves)} leaves)")
    return ", ".join(parts)


def _check_one(f: Any, example: tuple, *, reraise: bool = False) -> CheckRow:
    """Check one example with the testers. A crash in the rule becomes an "ERROR" row, or
    propagates with `reraise=True` (the pytest plugin shows its traceback)."""
    from .testing import test_frule, test_rrule
    from .testing._compare import WithTangent

    primals = tuple(x.primal if isinstance(x, WithTangent) else x for x in example)
    has_rr, has_fr = rrule.lookup(f, primals) is not None, frule.lookup(f, primals) is not None
    kinds = "+".join(k for k, on in (("rrule", has_rr), ("frule", has_fr)) if on) or "none"
    start = time.perf_counter()
    row = CheckRow(function_name(f), kinds, _describe(example), module=module_of(f))
    if kinds == "none":
        row.status, row.message = "FAIL", "examples given, but no rule applies to them"
        return row
    try:
        reports = []
        if has_rr:
            reports.append(test_rrule(f, *example))
        if has_fr:
            reports.append(test_frule(f, *example))
        row.max_error = max(r.max_error for r in reports)
        row.modes = "fwd+rev" if any(r.modes == "fwd+rev" for r in reports) else "rev"
        lowered = {c for r in reports for c in r.checks if c.startswith("jax.")}
        row.lowered = "jit+vmap" if any("jit" in c for c in lowered) and "jax.vmap" in lowered else ",".join(sorted(lowered)) or "-"
    except AssertionError as err:
        row.status, row.message = "FAIL", str(err)
    except Exception as err:  # noqa: BLE001 - a crash in a rule is reported as a row, not a traceback
        if reraise:
            raise
        row.status, row.message = "ERROR", f"{type(err).__name__}: {err}"
    row.seconds = time.perf_counter() - start
    return row


def iter_check(todo: list[tuple[Any, tuple]], progress: TextIO | None = None) -> Iterator[CheckRow]:
    """Check each (function, example) of `todo`, yielding its row as soon as it is done.

    `progress` gets `[n/total] function example ...` before each check: rewritten in place
    on a terminal, one line each otherwise (a CI log shows what is running).
    """
    yield from _iter_from(todo, progress, 0)


def _iter_from(todo: list[tuple[Any, tuple]], progress: TextIO | None, done: int) -> Iterator[CheckRow]:
    """`iter_check` of `todo[done:]`, its progress lines counted over all of `todo`."""
    live = progress is not None and progress.isatty()
    for n, (f, example) in enumerate(todo[done:], done + 1):
        if progress is not None:
            line = f"[{n}/{len(todo)}] {function_name(f)} {_describe(example)} ..."
            progress.write(f"\r\033[K{line}" if live else f"{line}\n")
            progress.flush()
        row = _check_one(f, example)
        if live and progress is not None:
            progress.write("\r\033[K")
            progress.flush()
        yield row


# ----- in worker processes -------------------------------------------------------------------
# JAX compiles each check's programs on one core; `--jobs N` spreads the examples over N
# processes. Functions and examples are not picklable (lambdas, closures), so each worker
# imports the same modules, lists the same cases in the same order, and is sent indices.
_WORKER_CASES: list[tuple[Any, tuple]] = []
_WORKER_PROBLEM: list[str] = []


class WorkerError(Exception):
    """A worker process of `check --jobs` cannot check the examples it is sent."""


def _worker_start(given: list[str], explicit: bool, expected: list[tuple[str, str]], cache_dir: str | None) -> None:
    jax.config.update("jax_enable_x64", True)
    if cache_dir:
        use_compilation_cache(cache_dir)
    try:
        imported = import_modules(given)
    except CheckImportError as err:
        _WORKER_PROBLEM.append(f"importing the modules failed: {err}")
        return
    _WORKER_CASES[:] = cases(imported if explicit else None)
    listed = [(function_name(f), _describe(example)) for f, example in _WORKER_CASES]
    if listed != expected:  # a module that registers examples differently on each import
        _WORKER_PROBLEM.append("a worker's import of the modules registered other examples than this process's")


def _worker_check(n: int) -> CheckRow:
    if _WORKER_PROBLEM:  # raised here, not in the initializer: the pool reports it, without tracebacks
        raise WorkerError(_WORKER_PROBLEM[0])
    return _check_one(*_WORKER_CASES[n])


def use_compilation_cache(directory: str) -> None:
    """Keep every compiled program in `directory` (JAX's persistent compilation cache), the
    checks' small ones included: a later check that compiles the same program (an unchanged
    rule) reads it instead. JAX keys an entry by the program itself, its compile options and
    the JAX and jaxlib versions, so a changed rule or JAX compiles anew."""
    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def default_jobs(n_cases: int) -> int:
    """Worker processes for `n_cases` examples: one per core, but one process (no workers)
    below 32 examples, where starting JAX in a new process costs more than it saves."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return 1 if n_cases < 32 else max(1, min(cores, n_cases // 16))


def iter_check_parallel(
    todo: list[tuple[Any, tuple]], given: list[str], explicit: bool, jobs: int, progress: TextIO | None = None,
    cache_dir: str | None = None,
) -> Iterator[CheckRow]:
    """`iter_check` over `jobs` worker processes, which import the modules `given` (as
    `import_modules` names them; `explicit`: only their cases, else every case registered).
    Rows come in `todo`'s order, each as soon as it and those before it are done. If the
    workers cannot check (their imports list other examples, or a worker dies), the examples
    not done yet are checked in this process, after a line on stderr saying why."""
    import concurrent.futures as futures
    import multiprocessing
    from concurrent.futures.process import BrokenProcessPool

    expected = [(function_name(f), _describe(example)) for f, example in todo]
    live = progress is not None and progress.isatty()
    context = multiprocessing.get_context("spawn")  # JAX's threads do not survive fork
    done = 0
    with futures.ProcessPoolExecutor(jobs, mp_context=context, initializer=_worker_start,
                                     initargs=(list(given), explicit, expected, cache_dir)) as pool:
        pending = [pool.submit(_worker_check, n) for n in range(len(todo))]
        for n, future in enumerate(pending, 1):
            if progress is not None:
                f, example = todo[n - 1]
                line = f"[{n}/{len(todo)}] {function_name(f)} {_describe(example)} ..."
                progress.write(f"\r\033[K{line}" if live else f"{line}\n")
                progress.flush()
            try:
                row = future.result()
            except (WorkerError, BrokenProcessPool) as err:
                for later in pending:
                    later.cancel()
                print(f"python -m rules check: the worker processes cannot check ({err or type(err).__name__}); "
                      f"checking the {len(todo) - done} examples left in this process", file=sys.stderr, flush=True)
                break
            if live and progress is not None:
                progress.write("\r\033[K")
                progress.flush()
            done += 1
            yield row
    if done < len(todo):
        yield from _iter_from(todo, progress, done)


def check_all(modules: Iterable[str] | None = None, progress: TextIO | None = None) -> list[CheckRow]:
    """Run the testers on every example of every function that has examples.

    With `modules`, only the functions whose examples those modules (or their submodules)
    registered.
    """
    return list(iter_check(cases(modules), progress))


# ------------------------------------------------------------------------------------------
# Reports for CI
# ------------------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    return str(value) if isinstance(value, float) and not math.isfinite(value) else value


def write_json(path: str | os.PathLike, rows: list[CheckRow], modules: list[str], seconds: float) -> None:
    """`{"modules", "summary": {passed, failed, examples, functions, seconds}, "rows": [...]}`,
    a row with every field of `CheckRow` (`max_error` null when not measured)."""
    failed = sum(r.status != "ok" for r in rows)
    report = {
        "modules": modules,
        "summary": {
            "passed": len(rows) - failed, "failed": failed, "examples": len(rows),
            "functions": len({r.function for r in rows}), "seconds": round(seconds, 3),
        },
        "rows": [{k: _plain(v) for k, v in asdict(r).items()} for r in rows],
    }
    Path(path).write_text(json.dumps(report, indent=2) + "\n")


_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f]")


def write_junit_xml(path: str | os.PathLike, rows: list[CheckRow], seconds: float) -> None:
    """One `<testcase classname=MODULE name="function[example]">` per row; a FAIL row
    carries `<failure>`, an ERROR row `<error>`, both with the tester's message."""
    clean = lambda text: _NOT_XML.sub("?", text)  # noqa: E731
    suite = ET.Element(
        "testsuite", name="python -m rules check", tests=str(len(rows)),
        failures=str(sum(r.status == "FAIL" for r in rows)), errors=str(sum(r.status == "ERROR" for r in rows)),
        skipped="0", time=f"{seconds:.3f}",
    )
    for r in rows:
        case = ET.SubElement(suite, "testcase", classname=r.module or "rules",
                             name=clean(f"{r.function}[{r.example}]"), time=f"{r.seconds:.3f}")
        if r.status != "ok":
            kind = "failure" if r.status == "FAIL" else "error"
            message = clean(r.message)
            ET.SubElement(case, kind, message=message.splitlines()[0] if message else r.status).text = message
        ET.SubElement(case, "system-out").text = clean("; ".join(f"{c.title}: {c.cell(r)}" for c in COLUMNS))
    root = ET.Element("testsuites")
    root.append(suite)
    ET.indent(root)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)


# ------------------------------------------------------------------------------------------
# The command line
# ------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m rules", description="Tools for rule authors.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    check = commands.add_parser(
        "check",
        help="verify every rule that carries examples",
        description="Verify every rule that carries examples against finite differences and "
        "through JAX (jit, vmap), printing a table row as each example is done (progress on "
        "stderr).",
        epilog="exit status: 0 all passed, 1 a rule failed, 2 usage or import error",
    )
    check.add_argument(
        "modules", nargs="*", metavar="MODULE",
        help="what to check: a library module (linalg means rules.library.linalg), a dotted "
        "module path (mypkg.rules, with its submodules) or a file (path/to/myrules.py); "
        "default: every module in rules.library",
    )
    check.add_argument(
        "-j", "--jobs", type=int, default=0, metavar="N",
        help="worker processes checking examples in parallel; default 0: one per core from 32 "
        "examples on, else 1 (no workers)",
    )
    check.add_argument(
        "--cache-dir", metavar="DIR",
        help="keep the compiled programs in DIR (JAX's persistent compilation cache): a second check of "
        "unchanged rules compiles nothing (the library: 60 s -> 16 s on 2 cores, jax 0.12); keep DIR between CI runs",
    )
    check.add_argument("--json", metavar="PATH", help="also write the rows and a summary as JSON")
    check.add_argument("--junit-xml", metavar="PATH", help="also write a JUnit XML report (for CI test views)")
    return parser


def _error(message: str) -> int:
    print(message, file=sys.stderr, flush=True)
    return 2


def main(argv: list[str] | None = None) -> int:
    """`python -m rules check [MODULE ...] [--jobs N] [--cache-dir DIR] [--json PATH] [--junit-xml PATH]`;
    returns the exit status."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exit:  # --help (0) or a usage error (2), printed by argparse
        return exit.code if isinstance(exit.code, int) else 2
    for report in (args.json, args.junit_xml):
        try:
            if report:
                Path(report).resolve().parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            return _error(f"python -m rules check: cannot write a report to `{report}`: {err}")
    jax.config.update("jax_enable_x64", True)  # examples and finite differences in float64
    if args.cache_dir:
        try:
            Path(args.cache_dir).mkdir(parents=True, exist_ok=True)
        except OSError as err:
            return _error(f"python -m rules check: cannot use `{args.cache_dir}` as the cache directory: {err}")
        use_compilation_cache(args.cache_dir)
    try:
        imported = import_modules(args.modules or default_modules())
    except CheckImportError as err:
        return _error(err.describe(prefix="python -m rules check: "))
    todo = cases(imported if args.modules else None)
    if not todo:
        return _error(
            format_message(
                f"python -m rules check: nothing to check in {', '.join(args.modules)}",
                got="no function with examples registered by these modules",
                fix="attach examples with `@rules.primitive(examples=[(x,)])`, "
                "`rules.scalar_rule(..., examples=...)` or `rules.register_examples(f, [(x,)])`",
            )
        )

    start = time.perf_counter()
    shown = [f"{name} ({given})" if _is_path(given) else name for given, name in zip(args.modules, imported)]
    print(f"python -m rules check: {len(imported)} module(s): {', '.join(shown or imported)}\n", flush=True)
    print(table_header(), flush=True)
    if args.jobs < 0:
        return _error(f"python -m rules check: --jobs must be 0 (one per core) or more, got {args.jobs}")
    jobs = args.jobs or default_jobs(len(todo))
    if jobs > 1:
        given = args.modules or default_modules()
        checked = iter_check_parallel(todo, given, bool(args.modules), jobs, progress=sys.stderr,
                                      cache_dir=args.cache_dir)
    else:
        checked = iter_check(todo, progress=sys.stderr)
    rows = []
    for row in checked:
        rows.append(row)
        print(format_row(row), flush=True)
    seconds = time.perf_counter() - start
    print("\n" + format_summary(rows), flush=True)
    print(f"\n({seconds:.1f} s)", flush=True)
    if args.json:
        write_json(args.json, rows, imported, seconds)
    if args.junit_xml:
        write_junit_xml(args.junit_xml, rows, seconds)
    return 0 if all(r.status == "ok" for r in rows) else 1
