"""`pytest --rules-audit`: check every custom derivative a test suite calls, without a test of it.

While the suite runs, each call of a `jax.custom_vjp`, a `jax.custom_jvp` or a
`rules.primitive` made with concrete inputs is recorded (its function and a copy of its
arguments, up to `PER_FUNCTION` distinct argument signatures per function). After the last
test, one report item per function checks each recorded call with the testers:
`test_rrule` for a `jax.custom_vjp` (JAX's own `jax.vjp`, so its bwd), `test_frule` and
`test_rrule` for a `jax.custom_jvp`, and for a primitive the tester of each rule it has.

Not recorded: calls made only with tracers (inside `jax.jit`, `jax.grad`, `vmap`...), whose
values do not exist until the compiled program runs (a function called only under jit is
checked where a test also calls it eagerly); functions of JAX itself and of this package
(`python -m rules check` checks the library's); arguments that cannot be copied to the host.
Registered by the `rules_pytest` entry point only when the option is given.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import numpy as np
import pytest

from .._primitive import Primitive
from .._registry import frule, function_name, rrule

__all__ = ["RulesAuditPlugin", "AuditItem"]

PER_FUNCTION = 3  # distinct argument signatures recorded per function
_SKIPPED_PACKAGES = ("jax", "jaxlib", "rules", "zygote_jax")  # their own rules are checked elsewhere


def _skipped(f: Any) -> bool:
    """Whether f belongs to JAX or to this package (by the module of the function it wraps)."""
    module = str(getattr(f, "__module__", "") or "")
    return any(module == p or module.startswith(p + ".") for p in _SKIPPED_PACKAGES)


def _signature(leaves: list, treedef: Any) -> tuple:
    return str(treedef), tuple((np.shape(x), str(getattr(x, "dtype", type(x).__name__))) for x in leaves)


def _host_copy(leaf: Any) -> Any:
    """A leaf as the audit keeps it: arrays copied to NumPy (the caller may donate or change
    its own), other values as they are."""
    if isinstance(leaf, (jax.Array, np.ndarray)):
        dtype = getattr(leaf, "dtype", None)
        if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.extended):
            return leaf  # a typed PRNG key: immutable, no NumPy view
        return np.array(leaf, copy=True)
    return leaf


class _Recorder:
    """Wraps the `__call__` of the recorded classes for the length of the run."""

    def __init__(self, per_function: int = PER_FUNCTION):
        self.per_function = per_function
        self.calls: dict[int, tuple[Any, list]] = {}  # id(f) -> (f, [(signature, args, kwargs)])
        self._saved: list[tuple[type, Any]] = []
        self._busy = False  # the recorded function calling another: only the outermost counts

    def install(self) -> None:
        for cls in (jax.custom_vjp, jax.custom_jvp, Primitive):
            self._saved.append((cls, cls.__call__))
            cls.__call__ = self._recording(cls.__call__)  # type: ignore[method-assign]

    def _recording(self, original: Any) -> Any:
        @functools.wraps(original)
        def call(f: Any, *args: Any, **kwargs: Any) -> Any:
            if not self._busy:
                self.record(f, args, kwargs)
            self._busy, outer = True, self._busy
            try:
                return original(f, *args, **kwargs)
            finally:
                self._busy = outer

        return call

    def uninstall(self) -> None:
        while self._saved:
            cls, original = self._saved.pop()
            cls.__call__ = original  # type: ignore[method-assign]

    def record(self, f: Any, args: tuple, kwargs: dict) -> None:
        if _skipped(f):
            return
        leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
        if any(isinstance(leaf, jax.core.Tracer) for leaf in leaves):
            return  # traced: no values to check with
        _, seen = self.calls.setdefault(id(f), (f, []))
        signature = _signature(leaves, treedef)
        if len(seen) >= self.per_function or any(s == signature for s, _, _ in seen):
            return
        try:
            copied = jax.tree_util.tree_unflatten(treedef, [_host_copy(leaf) for leaf in leaves])
        except Exception:  # noqa: BLE001 - an argument that cannot be copied is not recorded
            return
        seen.append((signature, *copied))


def _checks(f: Any, args: tuple, kwargs: dict) -> list[tuple[str, Any]]:
    """The testers that apply to one recorded call: (label, call)."""
    from . import test_frule, test_rrule
    from ._compare import with_tangent
    from .._zeros import NoTangent

    fixed = set(getattr(f, "nondiff_argnums", ()) or ())  # JAX's static arguments: not perturbed
    marked = tuple(with_tangent(a, NoTangent()) if i in fixed else a for i, a in enumerate(args))
    if isinstance(f, Primitive):
        out = []
        if rrule.lookup(f, args) is not None:
            out.append(("test_rrule", lambda: test_rrule(f, *marked, **kwargs)))
        if frule.lookup(f, args) is not None:
            out.append(("test_frule", lambda: test_frule(f, *marked, **kwargs)))
        return out
    if isinstance(f, jax.custom_jvp):
        return [("test_frule", lambda: test_frule(f, *marked, **kwargs)),
                ("test_rrule", lambda: test_rrule(f, *marked, **kwargs))]
    return [("test_rrule", lambda: test_rrule(f, *marked, **kwargs))]


class AuditFailed(Exception):
    """A recorded custom derivative failed a tester (the message lists each failing call)."""


class AuditItem(pytest.Item):
    """Every recorded call of one function, checked by the testers."""

    def __init__(self, *, f: Any, calls: list, **kwargs: Any):
        super().__init__(**kwargs)
        self.f, self.calls = f, calls

    def runtest(self) -> None:
        failures, checked = [], 0
        for signature, args, kwargs in self.calls:
            for label, check in _checks(self.f, args, kwargs):
                checked += 1
                try:
                    check()
                except AssertionError as err:
                    shapes = ", ".join(f"{dtype}{list(shape)}" for shape, dtype in signature[1])
                    failures.append(f"{label} at ({shapes}):\n{err}")
        self.user_properties.append(("checked", checked))
        if failures:
            raise AuditFailed("\n\n".join(failures))

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if isinstance(excinfo.value, AuditFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, f"rules-audit: {self.name}"


class RulesAuditPlugin:
    """Records calls while the tests run (`pytest_runtestloop`), then runs an `AuditItem` per
    recorded function."""

    def __init__(self, config: pytest.Config):
        if getattr(config.option, "numprocesses", None) or getattr(config.option, "dist", "no") != "no":
            raise pytest.UsageError(
                "--rules-audit records the calls made in this process; run it without pytest-xdist's -n "
                "(or with -p no:xdist)"
            )
        if not hasattr(jax, "enable_x64") and not jax.config.jax_enable_x64:
            raise pytest.UsageError("--rules-audit differences in float64: enable jax_enable_x64 on this JAX")
        self.recorder = _Recorder()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtestloop(self, session: pytest.Session):
        self.recorder.install()
        try:
            yield
        finally:
            self.recorder.uninstall()
        if session.shouldfail or session.shouldstop or session.config.option.collectonly:
            return
        items = [
            AuditItem.from_parent(session, name=f"rules-audit::{function_name(f)}",
                                  nodeid=f"rules-audit::{function_name(f)}", f=f, calls=calls)
            for f, calls in self.recorder.calls.values() if calls
        ]
        for k, item in enumerate(items):
            nextitem = items[k + 1] if k + 1 < len(items) else None
            item.ihook.pytest_runtest_protocol(item=item, nextitem=nextitem)
            if session.shouldfail or session.shouldstop:
                break

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        n = sum(1 for _, calls in self.recorder.calls.values() if calls)
        terminalreporter.write_line(f"rules-audit: {n} function(s) with custom derivatives recorded and checked")

