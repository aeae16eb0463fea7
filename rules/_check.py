"""`python -m rules check`: verify every rule that carries examples, and print a table.

Examples are attached with `@primitive(examples=[...])`, `scalar_rule(..., examples=...)`
or `rules.register_examples(f, [...])`. For every example, `test_rrule` and/or `test_frule`
run on the rules that apply to it.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import time
from dataclasses import dataclass
from typing import Any, Iterable, TextIO

import jax
import numpy as np

from ._registry import examples_of, frule, function_name, functions_with_examples, rrule

__all__ = ["CheckRow", "default_modules", "import_modules", "check_all", "format_table", "main"]


@dataclass
class CheckRow:
    function: str
    rules: str
    example: str
    max_error: float | None
    lowered: str
    seconds: float
    status: str
    message: str = ""


def default_modules() -> list[str]:
    """Every module shipped in `rules.library`."""
    import rules.library as library

    return [f"rules.library.{m.name}" for m in pkgutil.iter_modules(library.__path__) if not m.name.startswith("_")]


def import_modules(names: Iterable[str]) -> list[str]:
    """Import the named modules (`elementwise` means `rules.library.elementwise`)."""
    done = []
    for name in names:
        if name.startswith("rules."):
            importlib.import_module(name)
            done.append(name)
            continue
        try:
            importlib.import_module(f"rules.library.{name}")
            done.append(f"rules.library.{name}")
        except ModuleNotFoundError as err:
            if err.name not in (f"rules.library.{name}",):
                raise
            importlib.import_module(name)
            done.append(name)
    return done


def _describe(example: tuple) -> str:
    from .testing._compare import WithTangent

    parts = []
    for x in example:
        x = x.primal if isinstance(x, WithTangent) else x
        leaves = jax.tree_util.tree_leaves(x)
        if len(leaves) == 1 and leaves[0] is x and hasattr(x, "dtype"):
            dtype = np.dtype(x.dtype)
            short = {"f": "f", "c": "c", "i": "i", "u": "u", "b": "b"}.get(dtype.kind, dtype.kind)
            parts.append(f"{short}{dtype.itemsize * 8}{list(np.shape(x))}")
        elif isinstance(x, (bool, int, float, complex, str)) or x is None:
            parts.append(repr(x))
        elif callable(x):
            parts.append(getattr(x, "__name__", type(x).__name__))
        else:
            parts.append(f"{type(x).__name__}({len(leaves)} leaves)")
    return ", ".join(parts)


def _check_one(f: Any, example: tuple) -> CheckRow:
    from .testing import test_frule, test_rrule
    from .testing._compare import WithTangent

    primals = tuple(x.primal if isinstance(x, WithTangent) else x for x in example)
    has_rr, has_fr = rrule.lookup(f, primals) is not None, frule.lookup(f, primals) is not None
    kinds = "+".join(k for k, on in (("rrule", has_rr), ("frule", has_fr)) if on) or "none"
    start = time.perf_counter()
    row = CheckRow(function_name(f), kinds, _describe(example), None, "-", 0.0, "ok")
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
        lowered = {c for r in reports for c in r.checks if c.startswith("jax.")}
        row.lowered = "jit+vmap" if any("jit" in c for c in lowered) and "jax.vmap" in lowered else ",".join(sorted(lowered)) or "-"
    except AssertionError as err:
        row.status, row.message = "FAIL", str(err)
    except Exception as err:  # noqa: BLE001 - a crash in a rule is reported as a row, not a traceback
        row.status, row.message = "ERROR", f"{type(err).__name__}: {err}"
    row.seconds = time.perf_counter() - start
    return row


def check_all(modules: Iterable[str] | None = None, progress: TextIO | None = None) -> list[CheckRow]:
    """Run the testers on every example of every function that has examples.

    With `modules`, only the functions whose examples those modules registered.
    """
    todo = [(f, ex) for f in functions_with_examples(modules) for ex in examples_of(f)]
    rows = []
    for n, (f, example) in enumerate(todo, 1):
        if progress is not None:
            progress.write(f"\r\033[K[{n}/{len(todo)}] {function_name(f)}")
            progress.flush()
        rows.append(_check_one(f, example))
    if progress is not None:
        progress.write("\r\033[K")
        progress.flush()
    return rows


def format_table(rows: list[CheckRow]) -> str:
    lines = [
        "| function | rules | example | max rel. error | jit/vmap | seconds | status |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        err = "-" if r.max_error is None else f"{r.max_error:.1e}"
        lines.append(f"| {r.function} | {r.rules} | {r.example} | {err} | {r.lowered} | {r.seconds:.2f} | {r.status} |")
    failed = [r for r in rows if r.status != "ok"]
    functions = len({r.function for r in rows})
    lines.append("")
    lines.append(
        f"{len(rows) - len(failed)} passed, {len(failed)} failed: {len(rows)} examples of {functions} functions checked"
    )
    for r in failed:
        lines.append(f"\n{r.status} {r.function} ({r.example}):\n{r.message}")
    return "\n".join(lines)


USAGE = """usage: python -m rules check [MODULE ...]

Verify every rule that carries examples against finite differences and through JAX
(jit, vmap), and print a table. MODULE names a module to import first (`elementwise`
means `rules.library.elementwise`); default: every module in rules.library.
Exit status 1 if any check fails."""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] != "check":
        print(USAGE)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    jax.config.update("jax_enable_x64", True)  # examples and finite differences in float64
    modules = argv[1:] or default_modules()
    imported = import_modules(modules)
    progress = sys.stderr if sys.stderr.isatty() else None
    start = time.perf_counter()
    rows = check_all(imported if argv[1:] else None, progress)
    print(f"python -m rules check: {len(imported)} module(s): {', '.join(imported) or '-'}\n")
    print(format_table(rows))
    print(f"\n({time.perf_counter() - start:.1f} s)")
    return 0 if rows and all(r.status == "ok" for r in rows) else 1
