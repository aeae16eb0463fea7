"""What a traced check depends on, as a key: a repeated check with the same key reuses its trace.

Tracing a tester's program (the rule, its conventions, the lowered primitive under jit and
vmap) costs ~10 ms for even the smallest rule, several times what `check_grads` takes in all.
A trace is a function of the code it runs and of the values that code reads: the functions
under test, the rules registered for them, the helpers and constants they reach through
their globals and closures, the arguments' shapes and dtypes and JAX's configuration.
`fingerprint` walks that graph on every call (tens of microseconds) and returns a key that
changes whenever any of it does: a helper redefined in a notebook is a new function object,
its edited source a new code object, a global constant a new value, a registered rule a new
registry version. `jax.jit`'s own cache keys on the function object alone, so that a
redefined helper goes unseen; a tester must not check stale code.

What is walked, and how:
- functions of user code: identity, code object, defaults, closure cells, attributes, and
  every global name their code (and the code of the functions nested in it) reads; a
  module imported in their body; all of their globals where the code reads them without
  naming them (`globals()`, `vars`, `eval`, `exec`);
- a user module reached as a value (`import helpers`, held in a closure or an attribute):
  its whole namespace, as code anywhere may read any of it (`getattr` included), with
  its module-level `__getattr__`;
- a user class: its metaclass, and the methods and class attributes of every user class in
  its MRO; an instance: its class, `__dict__`, slots, and the items or value of a
  container or number it subclasses;
- functions of libraries (JAX, NumPy, SciPy, this package, the standard library; told by the
  file their code comes from, not by a `__module__` that `functools.wraps` copies): their
  code object and closure cells, not their globals (a library is not edited while it runs;
  a reloaded one makes new objects);
- values: numbers and strings by value, NumPy arrays by their bytes (up to `_ARRAY_BYTES`),
  JAX arrays likewise (larger ones by identity: they are immutable), `jax.jit`-wrapped functions by what they wrap,
  containers and objects by their contents;
- an object of this package with a `__rules_fingerprint__` method: what that returns (the
  testers' problem: its fixed arguments, not the ones a traced function replaces);
- the rules registered for every function met on the way (`rules.rrule`, `rules.frule`),
  walked like the function.

Anything it cannot vouch for (a tracer, a large NumPy array, an opaque extension object, a
graph above `_BUDGET` objects, an attribute that raises when read) makes the key None: the
check is traced anew, as always.

A library's globals are not walked; instead the attributes of this package's modules and of
the public modules of JAX, NumPy and SciPy are watched as a whole, by identity
(`_modules_state`), so that a test that monkeypatches one of them (`jax.numpy.linalg.svd`, a
shipped rule's helper) is traced anew. What it does not see: an attribute of another
library's module reassigned (a private module of JAX), state reached only through a library
object's methods, a pytree's node data mutated in place (JAX requires it to be immutable),
and a JAX array changed in place through memory it shares with NumPy (`from_dlpack`).
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import decimal
import fractions
import functools
import os
import pathlib
import sys
import sysconfig
import types
from typing import Any, Iterator

import jax
import numpy as np

from .._dual import _strict_forward
from .._lowering import _active_rules
from .._primitive import Primitive
from .._registry import frule, registry_version, rrule, rule_key

__all__ = ["fingerprint"]

# Top-level packages whose functions are keyed by code and closure, not by their globals.
_LIBRARIES = frozenset(
    "jax jaxlib numpy scipy rules zygote_jax chex optax ml_dtypes opt_einsum builtins math cmath "
    "functools operator itertools collections typing abc enum dataclasses numbers types "
    "contextlib weakref copy inspect warnings threading re string _collections _functools "
    "_operator _abc sys os posixpath ntpath importlib time".split()
)
_BUDGET = 4000  # objects walked per fingerprint, at most
_ARRAY_BYTES = 1 << 16  # NumPy arrays up to this size are keyed by value
_SCALARS = (bool, int, str, bytes, type(None), type(Ellipsis), type(NotImplemented))
# class attributes that are bookkeeping, not behaviour
_CLASS_SKIP = frozenset(("__dict__", "__weakref__", "__doc__", "__module__", "__qualname__", "__slots__",
                         "__annotations__", "__orig_bases__", "__parameters__", "_abc_impl", "__match_args__",
                         "__dataclass_fields__", "__dataclass_params__", "__firstlineno__", "__static_attributes__",
                         "__abstractmethods__", "__hash__", "__type_params__"))


# function attributes set by decorators (functools.wraps), not read by the code
_FUNCTION_SKIP = frozenset(("__wrapped__", "__signature__", "__doc__", "__name__", "__qualname__", "__module__",
                            "__annotations__", "__type_params__"))


class _Uncacheable(Exception):
    """Something in the graph cannot be keyed soundly."""


class _Id:
    """An object compared and hashed by identity (held, so its id is not reused)."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, _Id) and other.value is self.value

    def __hash__(self) -> int:
        return id(self.value)


def _is_library(module: Any) -> bool:
    return isinstance(module, str) and module.partition(".")[0] in _LIBRARIES


_ROOTS: list = [-1, ()]  # len(sys.modules) when found, the directories of library code


def _library_roots() -> tuple:
    """Where library code lives: the packages of `_LIBRARIES` and the standard library (not
    its site-packages). A function is library code by the file its code comes from, not by
    its `__module__`, which `functools.wraps` copies from the function it wraps."""
    if _ROOTS[0] != len(sys.modules):
        roots = set()
        for name in _LIBRARIES:
            file = getattr(sys.modules.get(name), "__file__", None)
            if file:
                roots.add(os.path.dirname(os.path.abspath(file)) + os.sep)
        paths = sysconfig.get_paths()
        stdlib = os.path.abspath(paths["stdlib"]) + os.sep
        installed = tuple(os.path.abspath(paths[k]) + os.sep for k in ("purelib", "platlib"))
        _ROOTS[:] = [len(sys.modules), (tuple(sorted(roots)), stdlib, installed)]
    return _ROOTS[1]


def _is_library_file(filename: str) -> bool:
    if filename.startswith("<frozen "):  # the standard library's frozen modules
        return True
    packages, stdlib, installed = _library_roots()
    path = os.path.abspath(filename) if not filename.startswith("<") else filename
    if path.startswith(packages):
        return True
    return path.startswith(stdlib) and not path.startswith(installed)


_CODES: dict[Any, tuple] = {}  # id(code) -> (code, names it and its nested code read, library code?)


def _code_info(code: types.CodeType) -> tuple:
    hit = _CODES.get(id(code))
    if hit is not None and hit[0] is code:
        return hit
    names: set = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_info(const)[1]
    if len(_CODES) > 4096:
        _CODES.clear()
    hit = _CODES[id(code)] = (code, frozenset(names), _is_library_file(code.co_filename))
    return hit


# Names by which code reads a namespace without naming what it reads: such code's globals are
# walked whole.
_DYNAMIC = frozenset(("globals", "vars", "eval", "exec", "locals", "__dict__"))
_IMPORTS = frozenset(("__import__", "import_module"))
_C_DESCRIPTORS = (types.WrapperDescriptorType, types.MethodDescriptorType, types.MethodWrapperType,
                  types.ClassMethodDescriptorType, types.GetSetDescriptorType, types.MemberDescriptorType)
_BUILTIN_VALUES = (range, slice, fractions.Fraction, decimal.Decimal, pathlib.PurePath)


def _is_library_module(module: types.ModuleType) -> bool:
    """A library's module, a built-in one, or one whose file is library code (the standard
    library's `subprocess`, read through a test module)."""
    if _is_library(module.__name__):
        return True
    file = getattr(module, "__file__", None)
    if isinstance(file, str):
        return _is_library_file(file)
    origin = getattr(getattr(module, "__spec__", None), "origin", None)  # a module made at run time has none
    return module.__name__ in sys.builtin_module_names or origin in ("built-in", "frozen")


_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made at run time, not a static type of C


def _is_library_class(cls: type) -> bool:
    """A class of a library: its `__module__` is a library's and names it there (one made by
    `dataclasses.make_dataclass` or `types.new_class` says "types" but is not in it)."""
    if not getattr(cls, "__flags__", _HEAPTYPE) & _HEAPTYPE:  # a static type of C: fixed
        return True
    module = getattr(cls, "__module__", None)
    if not isinstance(module, str) or not _is_library(module):
        return False
    found: Any = sys.modules.get(module)
    for part in getattr(cls, "__qualname__", "<none>").split("."):
        space = getattr(found, "__dict__", None)
        found = space.get(part) if isinstance(space, (dict, types.MappingProxyType)) else None
        if found is None:
            return False
    return found is cls


class _Walker:
    def __init__(self) -> None:
        self.budget = _BUDGET
        self.seen: dict[int, int] = {}
        self.held: list = []  # objects whose ids are in `seen`: alive while walking

    def key(self, obj: Any) -> Any:
        self.budget -= 1
        if self.budget < 0:
            raise _Uncacheable("too large")
        t = type(obj)
        if t in _SCALARS:
            return obj if t is str else (t, obj)
        if t is float:
            return (float, obj.hex())
        if t is complex:
            return (complex, obj.real.hex(), obj.imag.hex())
        if t is tuple:
            return (t, tuple(self.key(o) for o in obj))
        marker = self.seen.get(id(obj))
        if marker is not None:
            return ("seen", marker)
        self.seen[id(obj)] = len(self.seen)
        self.held.append(obj)
        return self._compound(obj, t)

    def _compound(self, obj: Any, t: type) -> Any:
        if t is list or t is collections.deque:
            return (t, tuple(self.key(o) for o in obj))
        if isinstance(obj, jax.core.Tracer):
            raise _Uncacheable("a tracer")
        if isinstance(obj, jax.Array):  # immutable: a small one by value, else by identity
            if obj.nbytes <= _ARRAY_BYTES and not jax.dtypes.issubdtype(obj.dtype, jax.dtypes.prng_key):
                host = np.asarray(obj)
                return ("jax.Array", host.dtype.str, host.shape, host.tobytes(), getattr(obj, "weak_type", False))
            return ("jax.Array", _Id(obj))
        if isinstance(obj, np.ndarray):
            if obj.dtype == object or obj.nbytes > _ARRAY_BYTES:
                raise _Uncacheable("an object or large NumPy array")
            return ("ndarray", obj.dtype.str, obj.shape, obj.tobytes())
        if isinstance(obj, np.generic):
            return ("np.generic", obj.dtype.str, np.asarray(obj).tobytes())
        if isinstance(obj, np.dtype):
            return ("dtype", obj)
        if isinstance(obj, jax.tree_util.PyTreeDef):
            try:
                hash(obj)
            except TypeError:  # a tree whose node data cannot be hashed
                raise _Uncacheable("an unhashable tree") from None
            return ("tree", obj, self._node_classes(obj))
        if t in _BUILTIN_VALUES or isinstance(obj, _BUILTIN_VALUES):  # immutable values
            return ("value", t, repr(obj))
        if t is object or isinstance(obj, jax.Device):  # a sentinel, a device: no state of their own
            return ("identity", _Id(obj))
        if isinstance(obj, _C_DESCRIPTORS):  # a C method or slot of a class: fixed
            return ("descriptor", _Id(obj))
        if isinstance(obj, types.FunctionType):
            return self._function(obj)
        if isinstance(obj, types.ModuleType):
            return self._module(obj)
        if isinstance(obj, type):
            return self._class(obj)
        if isinstance(obj, (types.MethodType, classmethod, staticmethod)):
            return ("method", self.key(getattr(obj, "__self__", None)), self.key(obj.__func__))
        if isinstance(obj, functools.partial):
            return ("partial", self._class(t), self.key(obj.func), self.key(obj.args), self.key(obj.keywords),
                    self.key(getattr(obj, "__dict__", None)))
        if isinstance(obj, property):
            return ("property", self.key(obj.fget), self.key(obj.fset), self.key(obj.fdel))
        if isinstance(obj, functools.cached_property):
            return ("cached_property", self.key(obj.func))
        if isinstance(obj, functools.singledispatchmethod):
            return ("singledispatchmethod", self.key(dict(obj.dispatcher.registry)))
        if isinstance(obj, (types.BuiltinFunctionType, np.ufunc)):
            owner = getattr(obj, "__self__", None)
            held = None if owner is None or isinstance(owner, types.ModuleType) else self.key(owner)
            return ("builtin", _Id(obj), held, self._rules(obj))
        if isinstance(obj, Primitive):  # its fields but its cache of lowerings
            fields = tuple((k, self.key(v)) for k, v in vars(obj).items() if k not in _PRIMITIVE_SKIP)
            return ("primitive", _Id(obj), fields, self._rules(obj))
        if t is dict or t is types.MappingProxyType:
            return ("dict", tuple((self.key(k), self.key(v)) for k, v in obj.items()))
        if t is set or t is frozenset:
            return (t, frozenset(self.key(o) for o in obj))
        if t.__module__.partition(".")[0] == "jaxlib" and hasattr(obj, "__wrapped__"):
            # `jax.jit(f)`: its options are fixed for the object; what it runs is f
            return ("jit", _Id(obj), self.key(obj.__wrapped__), self._rules(obj))
        return self._instance(obj, t)

    def _node_classes(self, treedef: Any) -> tuple:
        """The user classes among a tree's nodes, walked: a pytree class's methods and class
        attributes (an argument's `p.method()`) are code the check runs, which the tree's
        equality keys by identity only."""
        out, stack = [], [treedef]
        while stack:
            node = stack.pop()
            data = node.node_data()
            if data is not None and not _is_library_class(data[0]):
                out.append(self.key(data[0]))
            stack.extend(node.children())
        return tuple(out)

    def _rules(self, f: Any) -> Any:
        """The rules registered for `f` (both tables), walked: a rule's helper can change too."""
        try:
            k = rule_key(f)
            entries = rrule._rules.get(k), frule._rules.get(k)
        except Exception:  # noqa: BLE001 - unhashable, or an attribute lookup that raises: no rules
            return None
        if entries == (None, None):
            return None
        return tuple(None if e is None else tuple((self.key(sig), self.key(fn)) for sig, fn in e) for e in entries)

    def _function(self, fn: types.FunctionType) -> Any:
        code = fn.__code__
        _, names, library = _code_info(code)
        closure = tuple(self._cell(c) for c in fn.__closure__ or ())
        parts: list = [_Id(code), closure, self.key(fn.__defaults__), self.key(fn.__kwdefaults__), self._rules(fn)]
        if library:
            return ("library function", *parts)
        attributes = {k: v for k, v in fn.__dict__.items() if k not in _FUNCTION_SKIP}
        if attributes:
            parts.append(self.key(attributes))
        g = fn.__globals__
        if names & _IMPORTS:  # imports a module named by a string: what it reads is unknown
            raise _Uncacheable("a module imported by name")
        if names & _DYNAMIC:  # reads globals it does not name
            reads = self._namespace(g)
        else:
            reads = tuple((name, self.key(g[name])) for name in sorted(names) if name in g)
            # a module imported inside the function (`import helpers` in its body) is a local
            imported = tuple((name, self.key(sys.modules[name])) for name in sorted(names)
                             if name not in g and name in sys.modules)
            if imported:
                reads += imported
        # what the code reads from a library's modules (`jnp.sin`, `jax.scipy.stats.norm.cdf`)
        modules = [g.get(n, sys.modules.get(n)) for n in sorted(names)]
        libs = tuple(self._library_reads(m, names) for m in modules
                     if isinstance(m, types.ModuleType) and _is_library_module(m))
        return ("function", _Id(fn), *parts, reads, libs)

    def _library_reads(self, module: types.ModuleType, names: frozenset, depth: int = 0) -> tuple:
        """The attributes of a library module that code names: functions and classes by
        identity (a monkeypatched one is another object), modules the same way one level
        down, other values by value. The watched modules (`_modules_state`) see only some."""
        space = vars(module)
        out: list = [module.__name__]
        for name in sorted(n for n in names if n in space):
            value = space[name]
            if isinstance(value, types.ModuleType):
                if depth < 4 and _is_library_module(value):
                    out.append((name, self._library_reads(value, names, depth + 1)))
                else:
                    out.append((name, self.key(value)))
            elif callable(value):
                out.append((name, _Id(value)))
            else:
                out.append((name, self.key(value)))
        return tuple(out)

    def _cell(self, cell: Any) -> Any:
        try:
            return self.key(cell.cell_contents)
        except ValueError:  # an empty cell
            return ("empty cell",)

    def _namespace(self, d: dict) -> tuple:
        """Every entry of a user module's namespace but its bookkeeping (a module reached as a
        value is read by attribute names of code elsewhere, or by `getattr`: all of it counts)."""
        return tuple((k, self.key(v)) for k, v in d.items()
                     if not (k.startswith("__") and k.endswith("__")) or k == "__getattr__")

    def _module(self, module: types.ModuleType) -> Any:
        if _is_library_module(module):
            return ("module", module.__name__)
        return ("module", _Id(module), self._namespace(vars(module)))

    def _class(self, cls: type) -> Any:
        if _is_library_class(cls):
            return ("class", _Id(cls))
        parts: list = [self.key(type(cls))]  # the metaclass: its `__getattr__` may read globals
        for c in cls.__mro__:
            if _is_library_class(c):
                parts.append(_Id(c))
                continue
            for name, value in vars(c).items():
                if name in _CLASS_SKIP or (name.startswith("__") and isinstance(value, (str, type(None)))):
                    continue
                if isinstance(value, (types.GetSetDescriptorType, types.MemberDescriptorType)):
                    continue  # instance storage, walked with the instance
                if type(value).__name__ == "_tuplegetter":  # a NamedTuple's field: read from the tuple
                    continue
                parts.append((name, self.key(value)))
        return ("class", _Id(cls), tuple(parts))

    def _instance(self, obj: Any, t: type) -> Any:
        hook = getattr(t, "__rules_fingerprint__", None)
        if hook is not None and _is_library_class(t):  # what it reads, as the class tells
            return ("hook", _Id(t), self.key(hook(obj)))
        parts: list = [self._class(t)]
        if isinstance(obj, (tuple, list, collections.deque)):
            parts.append(tuple(self.key(o) for o in obj))
        elif isinstance(obj, dict):
            parts.append(tuple((self.key(k), self.key(v)) for k, v in obj.items()))
            parts.append(self.key(getattr(obj, "default_factory", None)))  # a defaultdict's
        elif isinstance(obj, (set, frozenset)):
            parts.append(frozenset(self.key(o) for o in obj))
        elif isinstance(obj, (int, float, complex, str, bytes)):  # a subclass of a number or a string
            base: Any = next(b for b in t.__mro__ if b in (int, float, complex, str, bytes))
            parts.append(repr(base(obj)))
        d = getattr(obj, "__dict__", None)
        if isinstance(d, dict):
            parts.append(tuple((k, self.key(v)) for k, v in d.items()))
        slotted, slots = _slot_names(t)
        for name in slots:
            parts.append(self.key(getattr(obj, name, _MISSING)))
        if d is None and not slotted and not isinstance(obj, (tuple, list, dict, set, frozenset)):
            raise _Uncacheable(f"an opaque {t.__name__}")
        if callable(obj):
            parts.append(self._rules(obj))
        return ("instance", *parts)


_MISSING = ("missing attribute",)
_PRIMITIVE_SKIP = frozenset(("_lowered", "__wrapped__", "__doc__"))
_SLOTS: dict[type, tuple] = {}


def _slot_names(t: type) -> tuple:
    """(whether some class of t's declares `__slots__`, the names of those slots)."""
    hit = _SLOTS.get(t)
    if hit is None:
        names: list = []
        slotted = False
        for c in t.__mro__:
            if c is object or "__slots__" not in vars(c):
                continue
            slotted = True
            s = vars(c)["__slots__"]
            names += [s] if isinstance(s, str) else [n for n in s if n not in ("__dict__", "__weakref__")]
        hit = _SLOTS[t] = (slotted, tuple(names))
    return hit


# Modules whose attributes are watched as a whole (`_modules_state`): this package's, and the
# public modules of JAX, NumPy and SciPy that rules call.
_WATCHED = frozenset(("jax", "jax.numpy", "jax.numpy.linalg", "jax.numpy.fft", "jax.lax", "jax.lax.linalg",
                      "jax.nn", "jax.scipy.special", "jax.scipy.linalg", "jax.scipy.stats", "jax.random",
                      "jax.tree_util", "numpy", "numpy.linalg", "numpy.fft", "scipy.special", "scipy.linalg",
                      "scipy.integrate", "scipy.optimize"))
_WATCHED_DICTS: list = [-1, []]  # len(sys.modules) when listed, the modules' __dict__s


def _modules_state() -> _Identities:
    """Every attribute of the watched modules but their submodules (importing one adds it),
    compared by identity: the key changes when one is reassigned (`monkeypatch.setattr(
    jnp.linalg, "svd", ...)`, a flag of this package switched off, two swapped), and is the
    same again when it is restored. The key holds the attributes, so an object replaced and
    freed cannot hand its id to a new one. The functions of a library are keyed by their
    code, not their globals; this is what sees their globals change. ~0.35 ms, once per
    tester call (`scope`)."""
    count = len(sys.modules)
    if _WATCHED_DICTS[0] != count:
        _WATCHED_DICTS[:] = [count, [vars(m) for n, m in list(sys.modules.items()) if m is not None and (
            n in _WATCHED or n.partition(".")[0] in ("rules", "zygote_jax"))]]
    values: list = []
    for d in _WATCHED_DICTS[1]:  # submodules left out: importing one adds it (`np.testing`)
        values += [v for v in d.values() if type(v) is not types.ModuleType]
    return _Identities(tuple(values))


class _Identities:
    """A tuple of objects compared and hashed by their identities (held)."""

    __slots__ = ("values", "ids", "_hash")

    def __init__(self, values: tuple):
        self.values = values  # held: while they live, equal ids are the same objects
        self.ids = tuple(map(id, values))
        self._hash = hash(self.ids)

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, _Identities) and (other is self or other.ids == self.ids)

    def __hash__(self) -> int:
        return self._hash


def _context() -> tuple:
    """JAX's configuration (context managers included), this package's tracing state and the
    state of the watched modules."""
    return (registry_version(), tuple(jax.config.values.items()), _strict_forward.get(), _active_rules.get(),
            _modules_state())


_SCOPE: contextvars.ContextVar[tuple | None] = contextvars.ContextVar("rules_fingerprint_scope", default=None)


@contextlib.contextmanager
def scope() -> Iterator[None]:
    """Within: one reading of the configuration and the watched modules serves every
    `fingerprint` (a tester's call: nothing it runs reassigns a module attribute)."""
    token = _SCOPE.set(_context())
    try:
        yield
    finally:
        _SCOPE.reset(token)


def fingerprint(*objs: Any) -> Any:
    """A hashable key of `objs` and all they reach (see the module docstring), or None where
    something cannot be keyed soundly. Equal keys: traces of the same code reading the same
    values, under the same configuration and the same registered rules."""
    context = _SCOPE.get()
    try:
        return (_context() if context is None else context, _Walker().key(objs))
    except _Uncacheable:
        return None
    except Exception:  # noqa: BLE001 - anything else (a graph deeper than Python's stack, an attribute
        return None  # that raises when read): not keyed, traced anew; a fingerprint never fails a check

