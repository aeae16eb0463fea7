"""`pytest --rules-audit`: check every custom derivative a test suite calls, without a test of it.

While the suite runs, each call of a `jax.custom_vjp`, a `jax.custom_jvp` or a
`rules.primitive` made with concrete inputs that returns is recorded (its function and a copy
of its arguments, up to `PER_FUNCTION` distinct argument signatures per function: arrays by
shape and dtype, other arguments by value). After the last
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
from .._zeros import NoTangent
from ._compare import with_tangent
from ._testers import _TESTER_OPTIONS, test_frule, test_rrule

__all__ = ["RulesAuditPlugin", "AuditItem"]

PER_FUNCTION = 3  # distinct argument signatures recorded per function
_SKIPPED_PACKAGES = ("jax", "jaxlib", "rules", "zygote_jax")  # their own rules are checked elsewhere


def _skipped(f: Any) -> bool:
    """Whether f belongs to JAX or to this package (by the module of the function it wraps)."""
    module = str(getattr(f, "__module__", "") or "")
    return any(module == p or module.startswith(p + ".") for p in _SKIPPED_PACKAGES)


def _signature(leaves: list, treedef: Any) -> tuple:
    """Arrays by shape and dtype, any other leaf by type and value: `f(x, "sum")` and
    `f(x, "mean")` (a static argument) are two calls to check."""
    return str(treedef), tuple((np.shape(x), str(x.dtype)) if isinstance(x, (jax.Array, np.ndarray, np.generic))
                               else ((), f"{type(x).__name__}={x!r}") for x in leaves)


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
            pending = None if self._busy else self.copied(f, args, kwargs)  # before f may change them
            self._busy, outer = True, self._busy
            try:
                out = original(f, *args, **kwargs)
            finally:
                self._busy = outer
            if pending is not None:  # a call that raised is not recorded: its inputs are not f's domain
                self.keep(f, *pending)
            return out

        return call

    def uninstall(self) -> None:
        while self._saved:
            cls, original = self._saved.pop()
            cls.__call__ = original  # type: ignore[method-assign]

    def copied(self, f: Any, args: tuple, kwargs: dict) -> tuple | None:
        """`(signature, (args, kwargs) copied)` of a call to record, or None (f is JAX's or ours,
        traced, recorded enough; whatever fails here, the user's call goes on unchanged)."""
        try:
            leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
            if _skipped(f) or any(isinstance(leaf, jax.core.Tracer) for leaf in leaves):
                return None  # traced: no values to check with
            signature, seen = _signature(leaves, treedef), self.calls.get(id(f), (f, []))[1]
            if len(seen) >= self.per_function or any(s == signature for s, _, _ in seen):
                return None
            return signature, jax.tree_util.tree_unflatten(treedef, [_host_copy(leaf) for leaf in leaves])
        except Exception:  # noqa: BLE001 - an argument that cannot be read or copied: not recorded
            return None

    def keep(self, f: Any, signature: tuple, copied: tuple) -> None:
        _, seen = self.calls.setdefault(id(f), (f, []))
        if len(seen) < self.per_function and all(s != signature for s, _, _ in seen):
            seen.append((signature, *copied))


def _checks(f: Any, args: tuple, kwargs: dict) -> list[tuple[str, Any]]:
    """The testers that apply to one recorded call: (label, call), or (label, why not)."""
    fixed = set(getattr(f, "nondiff_argnums", ()) or ())  # JAX's static arguments: not perturbed
    marked = tuple(with_tangent(a, NoTangent()) if i in fixed else a for i, a in enumerate(args))
    forward = isinstance(f, jax.custom_jvp) or isinstance(f, Primitive) and frule.lookup(f, args) is not None
    if clash := sorted(set(kwargs) & _TESTER_OPTIONS):  # f's keywords named like the testers' own
        if isinstance(f, Primitive):  # its rules are found by f itself: it cannot be wrapped
            return [("not checked", f"keyword argument(s) {', '.join(clash)} of f are named like the testers' own "
                                    "options: check it with a test of its own")]
        f = functools.partial(f, **{k: kwargs[k] for k in clash})  # JAX's derivative of f, found through it
        kwargs = {k: v for k, v in kwargs.items() if k not in clash}
    reverse = not isinstance(f, Primitive) or rrule.lookup(f, args) is not None  # a custom_vjp: reverse only
    testers = [("test_frule", test_frule)] * forward + [("test_rrule", test_rrule)] * reverse
    return [(label, functools.partial(tester, f, *marked, **kwargs)) for label, tester in testers]


class AuditFailed(Exception):
    """A recorded custom derivative failed a tester (the message lists each failing call)."""


class AuditItem(pytest.Item):
    """Every recorded call of one function, checked by the testers."""

    def __init__(self, *, f: Any, calls: list, **kwargs: Any):
        super().__init__(**kwargs)
        self.f, self.calls = f, calls

    def runtest(self) -> None:
        failures, unchecked, checked = [], [], 0
        for signature, args, kwargs in self.calls:
            shapes = ", ".join(f"{dtype}{list(shape)}" for shape, dtype in signature[1])
            for label, check in _checks(self.f, args, kwargs):
                if isinstance(check, str):  # why it cannot be checked
                    unchecked.append(f"at ({shapes}): {check}")
                    continue
                checked += 1
                try:
                    check()
                except AssertionError as err:
                    failures.append(f"{label} at ({shapes}):\n{err}")
        self.user_properties.append(("checked", checked))
        if failures:
            raise AuditFailed("\n\n".join(failures + [f"not checked {u}" for u in unchecked]))
        if unchecked:
            pytest.skip("not checked " + "; ".join(unchecked))

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
            raise pytest.UsageError("--rules-audit records the calls made in this process; run it without "
                                    "pytest-xdist's -n (or with -p no:xdist)")
        if not hasattr(jax, "enable_x64") and not jax.config.jax_enable_x64:
            raise pytest.UsageError("--rules-audit differences in float64: enable jax_enable_x64 on this JAX")
        self.recorder, self.ran = _Recorder(), False

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtestloop(self, session: pytest.Session):
        self.recorder.install()
        try:
            outcome = yield
        finally:
            self.recorder.uninstall()
        if (outcome.excinfo is not None or session.shouldfail or session.shouldstop
                or session.config.option.collectonly):
            return  # the run stopped (pytest.exit, Ctrl-C, -x, --maxfail) or ran nothing
        self.ran = True
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
        done = "checked" if self.ran else "not checked: the run stopped before the audit"
        terminalreporter.write_line(f"rules-audit: {n} function(s) with custom derivatives recorded, {done}")

