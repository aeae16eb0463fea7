"""`pytest --rules-check=MODULE`: the checks of `python -m rules check MODULE` as pytest items.

One item per (function, example), named `function[example]` under a collector
`rules-check/MODULE` and marked `rules_check`; a failing check shows the tester's message, a
crashing rule its traceback. Registered by the `rules_pytest` entry point only when the
option is given.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any, cast

import jax
import pytest

from .. import _check
from .._check import CheckImportError, _check_one, _describe, cases, import_modules
from .._registry import function_name

__all__ = ["RulesCheckPlugin", "RulesCheckModule", "RuleExampleItem", "RuleCheckFailed"]

_RULES_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


class RuleCheckFailed(Exception):
    """A rule failed a tester's check; the message is the tester's."""


class RulesCheckPlugin:
    """Adds a `RulesCheckModule` per `--rules-check` argument to the collected items."""

    def __init__(self, config: pytest.Config, targets: list[str]):
        self.targets = targets
        jax.config.update("jax_enable_x64", True)  # examples and finite differences in float64
        config.addinivalue_line("markers", "rules_check: a rule checked on one of its examples (--rules-check)")

    @pytest.hookimpl(tryfirst=True)  # before -k / -m deselect
    def pytest_collection_modifyitems(self, session: pytest.Session, items: list[pytest.Item]) -> None:
        for target in self.targets:  # JUnit XML reads `rules-check/a/b.py::f[x]` as class `rules-check.a.b`
            name = "rules-check/" + os.path.normpath(target).strip(os.sep)
            collector = RulesCheckModule.from_parent(session, name=name, nodeid=name, target=target)
            items.extend(session.genitems(collector))  # reports collection errors as pytest does


class RulesCheckModule(pytest.Collector):
    """The (function, example) pairs whose examples one module (or its submodules) registered."""

    def __init__(self, *, target: str, **kwargs: Any):
        super().__init__(**kwargs)
        self.target = target

    def collect(self) -> list[pytest.Item]:
        todo = cases(import_modules([self.target]))
        if not todo:
            raise CheckImportError(
                f"--rules-check={self.target}: no function with examples registered by `{self.target}`; "
                "attach examples with `@rules.primitive(examples=[(x,)])` or `rules.register_examples(f, [(x,)])`"
            )
        seen: Counter[str] = Counter()
        items: list[pytest.Item] = []
        for f, example in todo:
            name = f"{function_name(f)}[{_describe(example)}]"
            seen[name] += 1
            if seen[name] > 1:  # two examples alike in dtype and shape
                name = f"{name[:-1]}-{seen[name]}]"
            items.append(RuleExampleItem.from_parent(self, name=name, f=f, example=example))
        return items

    # no `style`, as pytest's own Collector.repr_failure (which ignores the override check too)
    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException]) -> Any:  # type: ignore[override]
        if isinstance(excinfo.value, CheckImportError):
            return excinfo.value.describe()
        return super().repr_failure(excinfo)


class RuleExampleItem(pytest.Item):
    """`test_rrule` / `test_frule` on one example, as `python -m rules check` runs them."""

    def __init__(self, *, f: Any, example: tuple, **kwargs: Any):
        super().__init__(**kwargs)
        self.f, self.example = f, example
        self.add_marker("rules_check")

    def runtest(self) -> None:
        row = _check_one(self.f, self.example, reraise=True)
        self.user_properties += [("rules", row.rules), ("max_error", row.max_error), ("jit/vmap", row.lowered)]
        if row.status != "ok":
            raise RuleCheckFailed(row.message)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if isinstance(excinfo.value, RuleCheckFailed):
            return str(excinfo.value)
        if not self.config.getoption("fulltrace", False):  # from the check on, and the rule's frames only
            checked = excinfo.traceback.cut(path=_check.__file__)
            in_rule = checked.filter(lambda entry: not str(entry.path).startswith(_RULES_DIR))
            excinfo.traceback = in_rule or checked
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, f"{cast(RulesCheckModule, self.parent).target}: {self.name}"
