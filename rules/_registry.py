"""The rule tables `rrule` and `frule`, keyed by function and, optionally, argument types.

Registration is thread-safe and bumps a registry version; every lowering cache is keyed on
the rule it lowered, so a redefinition takes effect on the next call. When a rule of a
function that JAX has already traced is redefined, the lowerings of its primitives are
dropped (with what their closures hold) and JAX's own caches are cleared, so `jax.jit`-compiled
callers pick up the new rule on their next call. JAX offers no public way to drop only the
traces that inlined one function, so every jitted function retraces once after such a
redefinition; redefining rules between the steps of a training loop costs a recompile each.
"""

from __future__ import annotations

import linecache
import re
import sys
import threading
import warnings
import weakref
from types import FrameType
from typing import Any, Callable, Iterable

import jax
import numpy as np

from ._errors import AmbiguousRuleError, RuleDefinitionError, format_message

__all__ = [
    "RuleTable",
    "rrule",
    "frule",
    "has_rrule",
    "has_frule",
    "opt_out",
    "rule_key",
    "registry_version",
    "register_examples",
    "examples_of",
    "function_name",
    "PlainFunctionWarning",
]

_lock = threading.RLock()
_version = 0
# registry key -> the primitives wrapping it whose lowering JAX has traced (weakly held)
_traced: dict[Any, weakref.WeakSet] = {}
# registry keys wrapped by at least one primitive (a rule on them is seen by JAX)
_wrapped: weakref.WeakSet = weakref.WeakSet()
_examples: dict[Any, list[tuple]] = {}
_example_modules: dict[Any, str] = {}
_OPT_OUT: Any = object()  # stored in place of a rule: typed as one


def rule_key(f: Any) -> Any:
    """The registry key of `f`: a primitive answers for the function it wraps."""
    return getattr(f, "__rules_key__", f)


_PUBLIC_JAX_MODULES = ("jax.numpy", "jax.nn", "jax.scipy.special", "jax.lax", "jax.random", "jax.numpy.linalg")


def function_name(f: Any) -> str:
    """A readable name for `f` in messages: `cube`, `jax.numpy.sin`, `jax.nn.sigmoid`."""
    f = rule_key(f)
    name = getattr(f, "__qualname__", None) or getattr(f, "__name__", None) or repr(f)
    module = getattr(f, "__module__", None) or ""
    if module.split(".")[0] != "jax":
        return name
    import importlib

    for public in _PUBLIC_JAX_MODULES:
        try:
            if getattr(importlib.import_module(public), name, None) is f:
                return f"{public}.{name}"
        except ImportError:  # pragma: no cover - a module JAX dropped
            continue
    return f"{module}.{name}"


def registry_version() -> int:
    """A counter bumped by every registration: whether any rule changed since you last looked.

    >>> import rules
    >>> before = rules.registry_version()
    >>> _ = rules.rrule.register(max, plain=True)(lambda *a: (max(*a), lambda g: (rules.NoTangent(),) * (1 + len(a))))
    >>> rules.registry_version() > before
    True

    See also: `rrule`, `frule`.
    """
    return _version


def _bump(key: Any) -> None:
    global _version
    _version += 1
    prims = _traced.pop(key, None)
    if prims is None:
        return
    for prim in list(prims):
        prim._lowered.clear()  # drop the old rule's lowerings (and what their closures hold)
    # JAX's caches of traced callers (jax.jit of a model calling the primitive) inlined the
    # old rule. JAX has no public way to drop only those, so all of its caches are dropped:
    # callers retrace once, on their next call. Only a primitive JAX has traced since its
    # last redefinition costs this.
    _clear_jax_caches()


def _clear_jax_caches() -> None:
    # jax.clear_caches walks JAX's registry of caches, which another thread creating a jit
    # may grow meanwhile ("dictionary/set changed size during iteration"): try again.
    for attempt in range(20):
        try:
            jax.clear_caches()
            return
        except RuntimeError as err:
            if "changed size" not in str(err) or attempt == 19:
                raise


def note_traced(prim: Any) -> None:
    """Record that JAX traced a lowering of primitive `prim` (see `_bump`)."""
    prims = _traced.get(prim.__rules_key__)
    if prims is None:
        with _lock:
            prims = _traced.setdefault(prim.__rules_key__, weakref.WeakSet())
    if prim not in prims:
        with _lock:
            prims.add(prim)


def note_wrapped(key: Any) -> None:
    """Record that a primitive wraps `key`, so rules registered on it reach JAX."""
    try:
        _wrapped.add(key)
    except TypeError:  # not weakly referenceable: it cannot warn either way
        pass


class PlainFunctionWarning(UserWarning):
    """A rule was registered for a plain function, which JAX transformations never consult.

    See also: `primitive`, `rrule`.
    """


def _type_name(t: Any) -> str:
    if isinstance(t, tuple):
        return " | ".join(_type_name(u) for u in t)
    return getattr(t, "__name__", repr(t))


def _signature_text(types: tuple | None) -> str:
    return "(any arguments)" if types is None else "(" + ", ".join(_type_name(t) for t in types) + ")"


def _as_tuple(t: Any) -> tuple:
    return t if isinstance(t, tuple) else (t,)


_PYTHON_SCALAR_OF_KIND = {"b": False, "i": 0, "u": 0, "f": 0.0, "c": 0j}


def _is_instance(arg: Any, t: Any) -> bool:
    """`isinstance`, seeing through JAX tracers to the argument the user passed.

    Under a transformation every argument JAX differentiates or batches is a tracer, an
    instance of `jax.Array`: a weakly typed scalar tracer may also stand for a Python number
    (it matches `float`, `int`, `complex` or `bool` by dtype), any other tracer for a NumPy
    array (it matches `np.ndarray`).
    """
    if isinstance(arg, t):
        return True
    if not isinstance(arg, jax.core.Tracer):
        return False
    aval = jax.typeof(arg)
    if getattr(aval, "weak_type", False) and aval.shape == ():
        return isinstance(_PYTHON_SCALAR_OF_KIND.get(aval.dtype.kind, arg), t)
    return any(issubclass(np.ndarray, u) for u in _as_tuple(t))


def _matches(types: tuple | None, args: tuple) -> bool:
    if types is None:
        return True
    if types and types[-1] is Ellipsis:
        fixed = types[:-1]
        return len(args) >= len(fixed) and all(_is_instance(a, t) for a, t in zip(args, fixed))
    return len(args) == len(types) and all(_is_instance(a, t) for a, t in zip(args, types))


def _narrower(a: Any, b: Any) -> bool:
    """Every type admitted by a is admitted by b."""
    return all(any(issubclass(x, y) for y in _as_tuple(b)) for x in _as_tuple(a))


def _more_specific(a: tuple | None, b: tuple | None) -> bool:
    """a is at least as specific as b, and they differ."""
    if a == b:
        return False
    if b is None:
        return True
    if a is None:
        return False
    a_var, b_var = bool(a) and a[-1] is Ellipsis, bool(b) and b[-1] is Ellipsis
    a_fixed, b_fixed = (a[:-1] if a_var else a), (b[:-1] if b_var else b)
    if a_var and not b_var:
        return False
    if not b_var and len(a_fixed) != len(b_fixed):
        return False
    if len(a_fixed) < len(b_fixed):
        return False
    return all(_narrower(x, y) for x, y in zip(a_fixed, b_fixed))


class RuleTable:
    """A table of rules of one kind (`rrule` or `frule`), callable as ChainRules' function.

    See also: `rrule`, `frule`, `has_rrule`.
    """

    def __init__(self, kind: str):
        self.kind = kind
        self._rules: dict[Any, list[tuple[tuple | None, Any]]] = {}

    def __repr__(self) -> str:
        return f"<rule table {self.kind}: {len(self._rules)} functions>"

    def register(self, f: Any, impl: Callable | None = None, *, types: Iterable | None = None, plain: bool = False):
        """Register `impl` as the rule for `f` (for arguments of `types`); usable as a decorator.

        `f` should be a `rules.Primitive` (or a function a primitive wraps): JAX
        transformations call a plain function's own code and never its rules, so registering
        on one warns (`PlainFunctionWarning`) unless `plain=True` says the rule is meant for
        direct calls (`rrule(f, ...)`, `rrule_via_ad`) or for a `primitive(f)` made later.

        Raises:
          RuleDefinitionError: used as a bare decorator (`@rrule.register` without `(f)`),
            or `types` holds something that is not a class.
        """
        if impl is None and types is None and _bare_decorator_line(sys._getframe(1)):
            raise RuleDefinitionError(
                format_message(
                    f"`@{self.kind}.register` needs the function the rule is for: `@{self.kind}.register(f)`",
                    expected=f"`@{self.kind}.register(f)` above `def f_{self.kind}(...)`, or `@f.{self.kind}` on a primitive f",
                    got=f"`@{self.kind}.register` with no arguments, on `{function_name(f)}`",
                    fix=f"write `@rules.{self.kind}.register(f)`; as written, `{function_name(f)}` itself would "
                    "become the function the rule is for, and no rule would be registered",
                )
            )
        if impl is not _OPT_OUT and not plain:
            warn_if_plain(f, f"{self.kind}.register({function_name(f)})", stacklevel=2)
        key = rule_key(f)
        sig = None if types is None else tuple(types)
        if sig is not None:
            for t in sig:
                if t is not Ellipsis and not all(isinstance(u, type) for u in _as_tuple(t)):
                    raise RuleDefinitionError(
                        format_message(
                            f"`{self.kind}.register({function_name(f)}, types=...)`: not a type: {t!r}",
                            expected="a tuple of classes (or tuples of classes, ending optionally with ...)",
                            got=repr(sig),
                        )
                    )

        def decorator(fn: Callable) -> Callable:
            if fn is not _OPT_OUT and not callable(fn):
                raise RuleDefinitionError(
                    f"`{self.kind}.register({function_name(f)})`: the rule must be callable; got {type(fn).__name__}."
                )
            with _lock:
                entries = [e for e in self._rules.get(key, []) if e[0] != sig]
                entries.append((sig, fn))
                self._rules[key] = entries
                _bump(key)
            return fn

        return decorator if impl is None else decorator(impl)

    def lookup(self, f: Any, args: tuple) -> Callable | None:
        """The implementation that applies to `f(*args)`, or None (also when opted out)."""
        entries = self._rules.get(rule_key(f))
        if not entries:
            return None
        matching = [e for e in entries if _matches(e[0], args)]
        if not matching:
            return None
        best = [e for e in matching if not any(_more_specific(o[0], e[0]) for o in matching)]
        if len(best) > 1:
            raise AmbiguousRuleError(
                format_message(
                    f"`{self.kind}({function_name(f)}, ...)`: {len(best)} rules match and none is more specific",
                    got="arguments of types (" + ", ".join(type(a).__name__ for a in args) + ")",
                    expected="one most specific match among " + ", ".join(_signature_text(e[0]) for e in best),
                    fix="register a rule for the intersection of these signatures, or narrow one of them",
                )
            )
        impl = best[0][1]
        return None if impl is _OPT_OUT else impl

    def functions(self) -> list[Any]:
        """Every function with at least one rule of this kind."""
        return [k for k, entries in self._rules.items() if any(fn is not _OPT_OUT for _, fn in entries)]

    def opt_out(self, f: Any, types: Iterable) -> None:
        self.register(f, _OPT_OUT, types=types)


_BARE_DECORATOR = re.compile(r"^\s*@[\w.]*\bregister\s*(#.*)?$")


def _bare_decorator_line(frame: Any) -> bool:
    """Whether the caller's line is a decorator without arguments (`@rrule.register`)."""
    line = linecache.getline(frame.f_code.co_filename, frame.f_lineno)
    return bool(_BARE_DECORATOR.match(line))


def warn_if_plain(f: Any, api: str, stacklevel: int) -> None:
    """Warn when a rule is registered for a function no primitive wraps (JAX never uses it)."""
    if hasattr(f, "__rules_key__"):
        return
    try:
        if f in _wrapped:
            return
    except TypeError:
        pass
    name = function_name(f)
    short = getattr(f, "__name__", name)
    warnings.warn(
        f"`{api}`: `{name}` is a plain function, so jax.grad, jax.jvp, jax.jit, jax.vmap and "
        f"zygote_jax.gradient never use this rule (JAX differentiates its own code); only direct "
        f"calls (`rules.rrule({short}, ...)`, `rrule_via_ad`) and a `rules.primitive({short})` do. "
        f"Make it a primitive first (`@rules.primitive` on its definition, or `{short} = "
        f"rules.primitive({short})`), or pass `plain=True` to register it for direct calls knowingly.",
        PlainFunctionWarning,
        stacklevel=stacklevel + 1,
    )


class _RRuleTable(RuleTable):
    def __call__(self, f: Any, *args: Any, **kwargs: Any):
        """`rrule(f, *args, **kwargs) -> (y, pullback)`, or None when no rule applies."""
        impl = self.lookup(f, args)
        if impl is None:
            return None
        return check_rrule_result(f, impl(*args, **kwargs))


class _FRuleTable(RuleTable):
    def __call__(self, tangents: tuple, f: Any, *args: Any, **kwargs: Any):
        """`frule((f_dot, *x_dots), f, *args, **kwargs) -> (y, y_dot)`, or None."""
        impl = self.lookup(f, args)
        if impl is None:
            return None
        if not isinstance(tangents, tuple) or len(tangents) != 1 + len(args):
            raise RuleDefinitionError(
                format_message(
                    f"`frule(tangents, {function_name(f)}, ...)`: wrong number of tangents",
                    expected=f"a tuple of {1 + len(args)} tangents (f_dot first, then one per argument)",
                    got=f"{type(tangents).__name__} of length {len(tangents) if isinstance(tangents, tuple) else '?'}",
                    fix="pass (NoTangent(), x1_dot, ..., xn_dot)",
                )
            )
        return check_frule_result(f, impl(tangents, *args, **kwargs))


def check_rrule_result(f: Any, result: Any):
    if result is None:
        raise RuleDefinitionError(
            format_message(
                f"the rrule registered for `{function_name(f)}` returned None",
                expected="a pair (y, pullback)",
                got="None",
                fix="return (y, pullback); to say that no rule applies to some argument types, use "
                "`rules.opt_out` instead of returning None",
            )
        )
    if not (isinstance(result, tuple) and len(result) == 2 and callable(result[1])):
        raise RuleDefinitionError(
            format_message(
                f"the rrule registered for `{function_name(f)}` must return (y, pullback)",
                expected="a tuple (y, pullback) with a callable pullback",
                got=f"{type(result).__name__}"
                + (f" of length {len(result)}" if isinstance(result, tuple) else ""),
            )
        )
    return result


def check_frule_result(f: Any, result: Any):
    if result is None:
        raise RuleDefinitionError(
            format_message(
                f"the frule registered for `{function_name(f)}` returned None",
                expected="a pair (y, y_dot)",
                got="None",
                fix="return (y, y_dot); to say that no rule applies, use `rules.opt_out`",
            )
        )
    if not (isinstance(result, tuple) and len(result) == 2):
        raise RuleDefinitionError(
            format_message(
                f"the frule registered for `{function_name(f)}` must return (y, y_dot)",
                expected="a tuple (y, y_dot)",
                got=f"{type(result).__name__}",
            )
        )
    return result


rrule = _RRuleTable("rrule")
rrule.__doc__ = """`rrule(f, *args, **kwargs) -> (y, pullback)` or None: ChainRules' reverse rule.

`pullback(y_bar)` returns `(f_bar, x1_bar, ..., xn_bar)`, one entry for the function itself
(`NoTangent()` for plain functions) and one per positional argument. Keyword arguments are
never differentiated. Register with `@rrule.register(f)` or `@f.rrule` on a primitive.

>>> import jax.numpy as jnp
>>> import rules
>>> @rules.primitive
... def cube(x):
...     return x ** 3
>>> @rules.rrule.register(cube)
... def cube_rrule(x):
...     def cube_pullback(y_bar):
...         return rules.NoTangent(), y_bar * 3 * x ** 2
...     return cube(x), cube_pullback
>>> y, back = rules.rrule(cube, 2.0)
>>> y, back(1.0)
(8.0, (NoTangent(), 12.0))
>>> rules.rrule(jnp.cosh, 1.0) is None
True

See also: `frule`, `has_rrule`, `rrule_via_ad`, `primitive`.
"""
frule = _FRuleTable("frule")
frule.__doc__ = """`frule((f_dot, *x_dots), f, *args, **kwargs) -> (y, y_dot)` or None: the forward rule.

The implementation receives the tangents first, then the primal arguments:
`def f_frule(tangents, x, y)` with `tangents == (f_dot, x_dot, y_dot)`.

>>> import rules
>>> @rules.primitive
... def square(x):
...     return x * x
>>> @rules.frule.register(square)
... def square_frule(tangents, x):
...     _, x_dot = tangents
...     return square(x), 2 * x * x_dot
>>> rules.frule((rules.NoTangent(), 1.0), square, 3.0)
(9.0, 6.0)

See also: `rrule`, `has_frule`, `frule_via_ad`.
"""


def has_rrule(f: Any, *args: Any) -> bool:
    """Whether an rrule applies to `f(*args)`, answered without calling it.

    >>> import rules
    >>> rules.has_rrule(print, 1.0)
    False

    See also: `rrule`, `has_frule`.
    """
    return rrule.lookup(f, args) is not None


def has_frule(f: Any, *args: Any) -> bool:
    """Whether an frule applies to `f(*args)`, answered without calling it.

    >>> import rules
    >>> rules.has_frule(print, 1.0)
    False

    See also: `frule`, `has_rrule`.
    """
    return frule.lookup(f, args) is not None


def opt_out(f: Any, types: Iterable) -> None:
    """Opt arguments of `types` out of the rules of `f`: for them, no rule applies.

    >>> import rules
    >>> def double(x):
    ...     return 2 * x
    >>> _ = rules.rrule.register(double, plain=True)(lambda x: (double(x), lambda g: (rules.NoTangent(), 2 * g)))
    >>> rules.opt_out(double, types=(int,))
    >>> rules.has_rrule(double, 3), rules.has_rrule(double, 3.0)
    (False, True)

    See also: `rrule`, `has_rrule`.
    """
    types = tuple(types)
    rrule.opt_out(f, types)
    frule.opt_out(f, types)


def register_examples(f: Any, examples: Iterable[tuple]) -> None:
    """Attach example argument tuples to `f`, which `python -m rules check` verifies it on.

    >>> import numpy as np
    >>> import rules
    >>> def halve(x):
    ...     return x / 2
    >>> rules.register_examples(halve, [(np.array([0.1, 0.2]),)])   # one example: x
    >>> rules.register_examples(halve, [np.array([0.1, 0.2])])
    Traceback (most recent call last):
    ...
    rules._errors.RuleDefinitionError: examples for `halve` must be tuples of arguments
    ...

    Raises:
      RuleDefinitionError: an example is not a tuple of arguments.

    See also: `primitive` (its `examples=`), `scalar_rule`.
    """
    checked = []
    for ex in examples:
        if not isinstance(ex, tuple):
            raise RuleDefinitionError(
                format_message(
                    f"examples for `{function_name(f)}` must be tuples of arguments",
                    expected="a list of tuples, e.g. [(x1,), (x2,)]",
                    got=f"an item of type {type(ex).__name__}",
                    fix="wrap a single argument as (x,)",
                )
            )
        checked.append(ex)
    with _lock:
        _examples.setdefault(rule_key(f), []).extend(checked)
        _example_modules.setdefault(rule_key(f), _caller_module())


def _caller_module() -> str:
    """The first module up the stack outside this package's private modules."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if not (name.startswith("rules._") or name == "rules"):
            return name
        frame = frame.f_back
    return "?"


def examples_of(f: Any) -> list[tuple]:
    """The example argument tuples attached to `f` (empty when none)."""
    return list(_examples.get(rule_key(f), []))


def functions_with_examples(modules: Iterable[str] | None = None) -> list[Any]:
    """Every registry key that carries examples (registered by one of `modules`, if given)."""
    if modules is None:
        return list(_examples)
    wanted = set(modules)
    return [key for key in _examples if _example_modules.get(key) in wanted]
