"""Write docs/api.md, the API reference, from the docstrings: `python docs/build_api.py`.

Every public name that `rules`, `rules.testing` and `zygote_jax` re-export, in the order and
under the comment headings of their `__init__.py`, with its signature and docstring; public
methods and properties that carry a docstring follow their class. The output depends only on
the source (no addresses, no dates), so `tests/test_docs.py` can regenerate it and compare.

    python docs/build_api.py            # rewrite docs/api.md
    python docs/build_api.py --check    # exit 1 when docs/api.md is stale
    python docs/build_api.py -o PATH    # write elsewhere
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import pathlib
import re
import sys
import typing
from collections.abc import Iterator
from types import ModuleType

ROOT = pathlib.Path(__file__).resolve().parents[1]
API_MD = ROOT / "docs" / "api.md"
PACKAGES = ("rules", "rules.testing", "zygote_jax")
REGENERATE = "python docs/build_api.py"


# ------------------------------------------------------------------------------------------
# What a package exports, grouped as its __init__.py groups it
# ------------------------------------------------------------------------------------------


def exported_groups(module: ModuleType) -> list[tuple[str, list[str]]]:
    """`[(heading, [name, ...]), ...]` from the module's `__init__.py`: each run of
    `from ... import x as x` lines under a `# Heading` comment; public names only. A run without
    a heading (after a blank line) is "Other" ("Modules" when it imports modules)."""
    source = pathlib.Path(module.__file__).read_text()
    lines = source.splitlines()
    tree = ast.parse(source)
    imported: dict[int, list[str]] = {}  # line number -> public names bound there
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            names = [alias.asname or alias.name for alias in node.names]
            imported[node.lineno] = [n for n in names if not n.startswith("_")]
    groups: list[tuple[str, list[str]]] = []
    heading: str | None = None
    for number, line in enumerate(lines, start=1):
        text = line.strip()
        if not text:
            heading = None
        elif text.startswith("#"):
            heading = text.lstrip("#").strip()
        elif number in imported and imported[number]:
            names = imported[number]
            title = heading
            if title is None:
                are_modules = all(inspect.ismodule(getattr(module, n)) for n in names)
                title = "Modules" if are_modules else "Other"
            if groups and groups[-1][0] == title:
                groups[-1][1].extend(names)
            else:
                groups.append((title, list(names)))
    return groups


# ------------------------------------------------------------------------------------------
# One entry
# ------------------------------------------------------------------------------------------

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


class _Raw(str):
    """An annotation written as source text: shown without quotes."""

    def __repr__(self) -> str:
        return str(self)


def _plain(annotation: object) -> object:
    if isinstance(annotation, typing.ForwardRef):
        annotation = annotation.__forward_arg__
    if isinstance(annotation, str):
        return _Raw(annotation.strip("'\""))
    return annotation


def signature(obj: object, *, bound: bool = False) -> str:
    """`(x: int, *, y=1)`, or "" where Python cannot tell (some builtins). Annotations as
    written; a class has no return annotation; `bound` drops a method's `self`."""
    try:
        sig = inspect.signature(obj)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return ""
    params = [p.replace(annotation=_plain(p.annotation)) for p in sig.parameters.values()]
    if bound:
        params = params[1:]
    returns = inspect.Signature.empty if inspect.isclass(obj) else _plain(sig.return_annotation)
    text = str(sig.replace(parameters=params, return_annotation=returns))
    return _ADDRESS.sub("", text)


def call(name: str, sig: str) -> list[str]:
    """The call signature as a Python block, one parameter per line when it is long."""
    line = name + sig
    if len(line) <= 92:
        return ["```python", line, "```"]
    head, _, rest = sig.partition("(")
    inner, _, returns = rest.rpartition(")")
    params = [p.strip() for p in _split_params(inner)]
    return ["```python", name + "(", *(f"    {p}," for p in params), ")" + returns, "```"]


def _split_params(text: str) -> list[str]:
    """Split at top-level commas (not those inside brackets or quotes)."""
    parts, depth, quote, current = [], 0, "", ""
    for char in text:
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(current)
            current = ""
            continue
        current += char
    return parts + [current] if current.strip() else parts


def own_doc(obj: object) -> str:
    """The object's own docstring, cleaned; a class's docstring is not inherited, an instance
    has its class's."""
    if inspect.isclass(obj):
        doc = obj.__dict__.get("__doc__")
    elif inspect.isroutine(obj) or isinstance(obj, (property, ModuleType)):
        doc = obj.__doc__
    else:  # a callable object: its class's docstring, else its __call__'s
        doc = type(obj).__dict__.get("__doc__") or getattr(type(obj), "__call__", None).__doc__
    return inspect.cleandoc(doc) if isinstance(doc, str) and doc.strip() else ""


def kind(obj: object) -> str:
    if inspect.ismodule(obj):
        return "module"
    if inspect.isclass(obj):
        if issubclass(obj, Warning):
            return "warning"
        return "exception" if issubclass(obj, BaseException) else "class"
    if inspect.isroutine(obj):
        return "function"
    return "callable object" if callable(obj) else "object"


def fenced(text: str) -> list[str]:
    """`text` verbatim in a fence longer than any backtick run inside it."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence + "text", text, fence]


def members(obj: object) -> Iterator[tuple[str, object, bool]]:
    """Public methods and properties with their own docstring, for a class or a callable object
    (first definition along the MRO, in definition order; builtins and exceptions skipped)."""
    cls = obj if inspect.isclass(obj) else type(obj)
    if issubclass(cls, BaseException) or inspect.isroutine(obj) or inspect.ismodule(obj):
        return
    seen: set[str] = set()
    for base in cls.__mro__:
        if base.__module__ == "builtins":
            continue
        for name, attr in base.__dict__.items():
            if name.startswith("_") or name in seen:
                continue
            seen.add(name)
            bound = not isinstance(attr, staticmethod)
            if isinstance(attr, (staticmethod, classmethod)):
                attr = attr.__func__
            if (inspect.isfunction(attr) or isinstance(attr, property)) and own_doc(attr):
                yield name, attr, bound


def entry(qualname: str, obj: object) -> list[str]:
    if inspect.ismodule(obj):
        out = [f"### `{qualname}`", "", "*module*", ""]
        out += fenced(own_doc(obj)) if own_doc(obj) else []
        exported = [n for _, names in exported_groups(obj) for n in names]
        subs = [(n, getattr(obj, n)) for n in exported if inspect.ismodule(getattr(obj, n))]
        if subs:
            out += ["", "| module | summary |", "|---|---|"]
            for name, sub in subs:
                out.append(f"| `{qualname}.{name}` | {(own_doc(sub).splitlines() or [''])[0]} |")
        return out + [""]
    out = [f"### `{qualname}`", "", f"*{kind(obj)}*"]
    if inspect.isclass(obj) and obj.__bases__ != (object,):
        bases = ", ".join(f"`{b.__name__}`" for b in obj.__bases__)
        out[-1] += f", a subclass of {bases}"
    out.append("")
    short = qualname.rsplit(".", 1)[-1]
    sig = "" if kind(obj) in ("exception", "warning") else signature(obj)
    if sig:
        out += call(short, sig) + [""]
    doc = own_doc(obj)
    out += fenced(doc) if doc else ["(no docstring)"]
    out.append("")
    for name, attr, bound in members(obj):
        if isinstance(attr, property):
            out += [f"#### `{short}.{name}` (property)", ""]
        else:
            sig = signature(attr, bound=bound)
            out += [f"#### `{short}.{name}`", ""] + call(f"{short}.{name}", sig) + [""]
        out += fenced(own_doc(attr)) + [""]
    return out


# ------------------------------------------------------------------------------------------
# The document
# ------------------------------------------------------------------------------------------


def render() -> str:
    """The whole of docs/api.md."""
    modules = [importlib.import_module(name) for name in PACKAGES]
    out = [
        "# API reference",
        "",
        f"Generated from the docstrings by `{REGENERATE}`; do not edit by hand (`tests/test_docs.py`",
        "fails when this file is stale). The design behind these names is in [design.md](design.md).",
        "",
    ]
    for module in modules:
        out.append(f"- [`{module.__name__}`](#{anchor(module.__name__)})")
        for heading, _ in exported_groups(module):
            out.append(f"  - [{heading}](#{anchor(module.__name__ + ' ' + heading)})")
    out.append("")
    for module in modules:
        out += [f"## `{module.__name__}`", ""]
        out += fenced(own_doc(module)) + [""]
        for heading, names in exported_groups(module):
            out += [f'<a id="{anchor(module.__name__ + " " + heading)}"></a>', "", f"### {heading}", ""]
            for name in names:
                body = entry(f"{module.__name__}.{name}", getattr(module, name))
                out += ["#" + line if line.startswith("###") else line for line in body]
    return "\n".join(out).rstrip("\n") + "\n"


def anchor(text: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^a-z0-9 _-]", "", text.lower()).replace(" ", "-")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", type=pathlib.Path, default=API_MD)
    parser.add_argument("--check", action="store_true", help="exit 1 if the output file is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not args.output.exists() or args.output.read_text() != text:
            print(f"{args.output} is stale: run `{REGENERATE}`", file=sys.stderr)
            return 1
        return 0
    args.output.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
