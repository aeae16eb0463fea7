"""Reverse mode, Zygote's way: `pullback`, `gradient`, `withgradient`, `jacobian`, `withjacobian`.

Everything is `jax.vjp` underneath, so these compose with `jax.jit` and `jax.vmap`, and a
`rules.Primitive` met on the way is differentiated through its registered rules. Argument
conversion lives in `_args` (one place); this file only seeds and shapes.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from rules._boundary import conj

from ._args import ArgSpec, promoted_pass, to_zygote
from ._control import deriving
from ._errors import GradientError, describe, message, name_of
from ._params import Grads, Params

__all__ = ["pullback", "gradient", "withgradient", "jacobian", "withjacobian", "WithGradient"]


class WithGradient(NamedTuple):
    """The result of `withgradient` / `withjacobian`: the function's value and its derivative.

    >>> import zygote_jax
    >>> res = zygote_jax.withgradient(lambda x: x ** 2, 3.0)
    >>> float(res.val), float(res.grad[0])
    (9.0, 6.0)

    See also: `withgradient`, `withjacobian`.
    """

    val: Any
    grad: Any


# ----- seeds: ChainRules' cotangent of the output -> JAX's ----------------------------------
def _is_jax_value(leaf: Any) -> bool:
    return isinstance(leaf, (jax.Array, np.ndarray, np.generic, int, float, complex))


def _seed_leaf(y: Any, y_bar: Any, f: Callable) -> Any:
    if not _is_jax_value(y):
        return None  # a string or object passed through the output: no cotangent
    dtype = jnp.result_type(y)
    if not jnp.issubdtype(dtype, jnp.inexact):
        return np.zeros(np.shape(y), jax.dtypes.float0)  # ints and bools have no cotangent
    if y_bar is None:
        return jnp.zeros(np.shape(y), dtype)
    y_bar = jnp.asarray(y_bar)
    if y_bar.shape != np.shape(y):
        raise GradientError(
            message(
                f"`pullback({name_of(f)}, ...)`: the seed passed to `back` does not match the output's shape",
                expected=f"a cotangent of shape {np.shape(y)} (the output's), or None for zero",
                got=f"shape {y_bar.shape}",
                fix="seed with an array shaped like the output, e.g. `jnp.ones_like(y)`",
            )
        )
    return conj(y_bar).astype(dtype)  # JAX's convention


def _seed(y: Any, y_bar: Any, f: Callable) -> Any:
    """`y_bar` shaped like `y`, with `None` read as zeros at any level of the pytree."""
    if y_bar is None:
        return jax.tree_util.tree_map(lambda leaf: _seed_leaf(leaf, None, f), y)
    if jax.tree_util.treedef_is_leaf(jax.tree_util.tree_structure(y)):
        return _seed_leaf(y, y_bar, f)
    children, node = jax.tree_util.tree_flatten(y, is_leaf=lambda n: n is not y)
    try:
        bar_children = node.flatten_up_to(y_bar)
    except (ValueError, TypeError):
        raise GradientError(
            message(
                f"`pullback({name_of(f)}, ...)`: the seed passed to `back` does not match the output's structure",
                expected=f"{describe(y)} like the output (None entries mean zero)",
                got=describe(y_bar),
            )
        ) from None
    return node.unflatten([_seed(c, b, f) for c, b in zip(children, bar_children)])


# ----- pullback and gradient ----------------------------------------------------------------
def pullback(f: Callable, *args: Any) -> tuple[Any, Callable[[Any], Any]]:
    """`f(*args)` and its pullback: `back(y_bar)` returns one gradient per argument.

    Args:
      f: the function; any output pytree of arrays.
      *args: its arguments (see `gradient` for which ones are differentiated), or one
        `Params` for implicit parameters (then `f` takes no arguments).

    Returns:
      `(y, back)`. `back(y_bar)` takes a cotangent shaped like `y` (`None` anywhere means
      zero) in ChainRules' complex convention and returns a tuple with one entry per
      argument (a `Grads` for `Params`).

    Raises:
      GradientError: when `back` receives a seed of the wrong shape or structure.

    >>> import jax.numpy as jnp, zygote_jax
    >>> y, back = zygote_jax.pullback(jnp.sin, 0.5)
    >>> float(y), float(back(1.0)[0])
    (0.479425538604203, 0.8775825618903728)
    >>> y, back = zygote_jax.pullback(lambda a, b: (a * b, a + b), 2.0, 3.0)
    >>> [float(g) for g in back((1.0, None))]
    [3.0, 2.0]

    See also: `gradient`, `jacobian`, `jax.vjp`.
    """
    if len(args) == 1 and isinstance(args[0], Params):
        return _implicit_pullback(f, args[0])
    if any(isinstance(a, Params) for a in args):
        raise GradientError(
            message(
                f"`pullback({name_of(f)}, ...)`: `Params` must be the only argument",
                expected="`gradient(f, ps)` with `f` taking no arguments",
                got=f"{len(args)} arguments, one of them a Params",
                fix="close over the other arguments: `gradient(lambda: loss(model, x, y), ps)`",
            )
        )

    spec = ArgSpec(args)
    y, vjp_fn = _vjp(spec.bind(f, spec.diff_index), spec.values(spec.diff_index))  # f's own value
    # the ints' own gradients: f once more, on the ints promoted to floats (see `_args`)
    ints = promoted_pass(spec, lambda index: _vjp(spec.bind(f, index), spec.values(index)))
    if ints is not None and not _same_shapes(ints[0], y):
        ints = None  # promoting changed what f returns: the ints are not differentiated

    def back(y_bar: Any) -> tuple:
        found = dict(zip(spec.diff_index, vjp_fn(_seed(y, y_bar, f))))
        if ints is not None:
            y_promoted, vjp_ints = ints
            found.update(zip(spec.int_index, vjp_ints(_seed(y_promoted, y_bar, f))))
        return spec.grads(found)

    back.__name__ = back.__qualname__ = f"{name_of(f)}_pullback"
    return y, back


def _vjp(fn: Callable, primals: list, unused: list | None = None) -> tuple[Any, Callable]:
    """`jax.vjp` of `fn`, whose output may also hold strings or objects (passed through).

    With a list `unused`, `fn` is traced once into a jaxpr and the positions of the primals
    that the program never reads are appended to it.
    """
    box: dict = {}

    def jax_values_of_fn(*p):
        leaves, tree = jax.tree_util.tree_flatten(fn(*p))
        mask = [_is_jax_value(leaf) for leaf in leaves]
        box.update(leaves=leaves, tree=tree, mask=mask)
        return [leaf for leaf, m in zip(leaves, mask) if m]

    with deriving():
        if unused is not None:
            closed = jax.make_jaxpr(jax_values_of_fn)(*primals)
            unused.extend(_unread_inputs(closed.jaxpr))
            values, vjp_fn = jax.vjp(lambda *p: jax.core.eval_jaxpr(closed.jaxpr, closed.consts, *p), *primals)
        else:
            values, vjp_fn = jax.vjp(jax_values_of_fn, *primals)
    tree, mask, it = box["tree"], box["mask"], iter(values)
    y = tree.unflatten([jnp.asarray(next(it)) if m else leaf for leaf, m in zip(box["leaves"], mask)])

    def vjp_of_seed(seed: Any) -> Any:
        return vjp_fn([s for s, m in zip(tree.flatten_up_to(seed), mask) if m])

    return y, vjp_of_seed


def _same_shapes(a: Any, b: Any) -> bool:
    """Whether two outputs have the same structure and leaf shapes."""
    a_leaves, a_tree = jax.tree_util.tree_flatten(a)
    b_leaves, b_tree = jax.tree_util.tree_flatten(b)
    return a_tree == b_tree and all(np.shape(u) == np.shape(v) for u, v in zip(a_leaves, b_leaves))


def _unread_inputs(jaxpr: Any) -> list[int]:
    """The positions of a jaxpr's inputs that no equation and no output reads."""
    read = {id(v) for eqn in jaxpr.eqns for v in eqn.invars if not hasattr(v, "val")}  # literals have .val
    read |= {id(v) for v in jaxpr.outvars if not hasattr(v, "val")}
    return [i for i, v in enumerate(jaxpr.invars) if id(v) not in read]


def _implicit_pullback(f: Callable, ps: Params) -> tuple[Any, Callable]:
    """`pullback(f, ps)`: `f()` differentiated with respect to the arrays of `ps`.

    A parameter the function never reads gets `None`, as in Zygote; a function that reads
    none of them is an error (it read copies, which would give zero gradients silently).
    """
    originals = list(ps)

    def f_of_params(*values):
        with ps.substituted(list(values)):
            return f()

    unused: list[int] = []
    y, vjp_fn = _vjp(f_of_params, originals, unused)
    if originals and len(unused) == len(originals):
        raise GradientError(
            message(
                f"`gradient({name_of(f)}, Params)`: the function read none of the {len(originals)} "
                "parameters, so every gradient would be zero",
                expected="a function that reads the parameters from the objects Params searched, when it runs",
                got="a result that depends on none of them: it read copies (e.g. a function jitted "
                "earlier that closed over the arrays keeps its own copy; arrays inside containers "
                "Params did not search)",
                fix="pass the model to the jitted function as an argument, or use the explicit form "
                "`gradient(loss, params, ...)`; `Params(model)` searches the model's attributes, "
                "lists and dicts",
            )
        )

    def back(y_bar: Any) -> Grads:
        grads = [to_zygote(g) for g in vjp_fn(_seed(y, y_bar, f))]
        return Grads(originals, [None if i in unused else g for i, g in enumerate(grads)])

    back.__name__ = back.__qualname__ = f"{name_of(f)}_pullback"
    return y, back


def _check_scalar(y: Any, f: Callable, api: str) -> None:
    if isinstance(y, (tuple, list, dict)) or not hasattr(y, "shape") and not isinstance(y, (int, float, complex)):
        raise GradientError(
            message(
                f"`{api}({name_of(f)}, ...)`: the function must return a real scalar",
                expected="a real number or a 0-d array",
                got=describe(y),
                fix="use `withgradient` (differentiates the first item of a tuple/dict) or `pullback`",
            )
        )
    if np.ndim(y) != 0:
        raise GradientError(
            message(
                f"`{api}({name_of(f)}, ...)`: the function must return a real scalar; "
                "gradients are not defined for array outputs",
                expected="a real number or a 0-d array",
                got=f"an array {describe(y)}",
                fix="use `jacobian` for all derivatives, or reduce the output (e.g. `jnp.sum`)",
            )
        )
    if jnp.iscomplexobj(y):
        raise GradientError(
            message(
                f"`{api}({name_of(f)}, ...)`: the function must return a real scalar",
                expected="a real number",
                got=f"a complex {describe(y)}",
                fix="return `jnp.real(y)` or `abs2(y) = jnp.real(y * jnp.conj(y))`",
            )
        )


def gradient(f: Callable, *args: Any) -> Any:
    """The gradient of the real scalar `f(*args)` with respect to each argument.

    Arguments are JAX pytrees. Inexact arrays, floats and complex numbers are
    differentiated; Python ints used arithmetically are differentiated as reals; ints used
    as indices or shapes, bools, strings, None, callables and int arrays get `None`. Unused
    float arguments get zeros. Complex arguments get ChainRules' convention
    (dl/dRe z + i dl/dIm z, the conjugate of `jax.grad`'s). `f` runs on the arguments as
    given, so the other gradients are those of `f` with its ints (`x ** n` stays an integer
    power); where an argument holds an int, `f` runs once more, on the ints as floats, for
    their own gradients.

    Args:
      f: a function returning a real scalar.
      *args: its arguments, or a single `Params` (then `f` takes no arguments).

    Returns:
      A tuple with one gradient per argument, each in its argument's structure (`None` for
      leaves that are not differentiated); a `Grads` for `Params`.

    Raises:
      GradientError: if `f` returns an array (use `jacobian`), a complex number (take the
        real part or `abs2`) or a tuple (use `withgradient`).

    >>> import jax.numpy as jnp, zygote_jax
    >>> [float(g) for g in zygote_jax.gradient(lambda a, b: a * b, 2, 3)]
    [3.0, 2.0]
    >>> zygote_jax.gradient(lambda x, i: x[i], jnp.array([1.0, 2.0, 3.0]), 1)
    (Array([0., 1., 0.], dtype=float64), None)
    >>> complex(zygote_jax.gradient(lambda z: jnp.abs(z) ** 2, 1 + 2j)[0])
    (2+4j)

    See also: `withgradient`, `pullback`, `jacobian`, `Params`.
    """
    y, back = pullback(f, *args)
    _check_scalar(y, f, "gradient")
    return back(jnp.ones_like(y))


def _first_item(y: Any) -> tuple[Any, Any]:
    """The differentiated item of `withgradient`'s output, and the seed that selects it."""
    if isinstance(y, dict):
        key = next(iter(y))
        return y[key], {k: (None if k != key else 1.0) for k in y}
    if isinstance(y, tuple):
        children, node = jax.tree_util.tree_flatten(y, is_leaf=lambda n: n is not y)
        return y[0], node.unflatten([1.0] + [None] * (len(children) - 1))
    return y, 1.0


def withgradient(f: Callable, *args: Any) -> WithGradient:
    """`f(*args)` and its gradient, in one pass.

    If `f` returns a tuple (or NamedTuple), its first item is differentiated; if it returns
    a dict, its first key in insertion order; the whole output is returned as `val`.

    Args:
      f: a function returning a real scalar, or a tuple/dict whose first item is one.
      *args: as for `gradient`.

    Returns:
      `WithGradient(val, grad)`, a NamedTuple; `grad` is what `gradient` returns.

    Raises:
      GradientError: as for `gradient`, for the differentiated item.

    >>> import jax.numpy as jnp, zygote_jax
    >>> val, grad = zygote_jax.withgradient(lambda x: (jnp.sum(1 / x), 1 / x), jnp.array([1.0, 2.0, 4.0]))
    >>> val
    (Array(1.75, dtype=float64), Array([1.  , 0.5 , 0.25], dtype=float64))
    >>> grad
    (Array([-1.    , -0.25  , -0.0625], dtype=float64),)

    See also: `gradient`, `pullback`.
    """
    key_order: list = []  # JAX sorts dict keys; keep the order f used

    def f_noting_key_order(*a):
        out = f(*a)
        if isinstance(out, dict):
            key_order[:] = list(out)
        return out

    f_noting_key_order.__qualname__ = name_of(f)
    y, back = pullback(f_noting_key_order, *args)
    if isinstance(y, dict):
        y = {k: y[k] for k in key_order}
    item, seed = _first_item(y)
    _check_scalar(item, f, "withgradient")
    return WithGradient(y, back(seed))


# ----- jacobian --------------------------------------------------------------------------------
def withjacobian(f: Callable, *args: Any) -> WithGradient:
    """`f(*args)` and its Jacobian with respect to each argument (Zygote's layout).

    Args:
      f: a function returning an array or a number.
      *args: as for `gradient`.

    Returns:
      `WithGradient(val, grad)`; `grad` is what `jacobian` returns.

    Raises:
      GradientError: if `f` returns a tuple, dict or other non-array.

    >>> import jax.numpy as jnp, zygote_jax
    >>> val, (J,) = zygote_jax.withjacobian(lambda x: x ** 2, jnp.array([1.0, 2.0]))
    >>> J
    Array([[2., 0.],
           [0., 4.]], dtype=float64)

    See also: `jacobian`, `withgradient`.
    """
    if len(args) == 1 and isinstance(args[0], Params):
        raise GradientError(
            message(
                f"`jacobian({name_of(f)}, ps)`: implicit parameters are not supported by jacobian",
                expected="explicit arguments",
                got="Params",
                fix="pass the parameters as a pytree argument: `jacobian(f, params, ...)`",
            )
        )
    y, back = pullback(f, *args)
    if not hasattr(y, "shape"):
        raise GradientError(
            message(
                f"`jacobian({name_of(f)}, ...)`: the function must return an array or a number",
                expected="an array",
                got=describe(y),
                fix="stack the outputs into one array, or use `pullback` for structured outputs",
            )
        )
    n = int(np.size(y))
    dtype = jnp.result_type(y)
    if not jnp.issubdtype(dtype, jnp.inexact):
        dtype = jnp.result_type(float)  # an int output: a derivative only through an int argument
    rows = jax.vmap(back)(jnp.eye(n, dtype=dtype).reshape((n, *np.shape(y))))

    def layout(g: Any) -> Any:
        return g.reshape(n) if g.ndim == 1 else g.reshape(n, -1)

    return WithGradient(y, tuple(None if r is None else jax.tree_util.tree_map(layout, r) for r in rows))


def jacobian(f: Callable, *args: Any) -> tuple:
    """The Jacobian of `f(*args)` with respect to each argument, in Zygote's layout.

    For each array argument `x`, a matrix of shape `(y.size, x.size)` (row `k` is the
    gradient of `y.ravel()[k]`; computed in reverse mode, one pullback per output element,
    batched with `jax.vmap`); a scalar argument gives a vector of length `y.size`; an
    argument that is not differentiated gives `None`; a pytree argument gives a pytree of
    such matrices.

    Args:
      f: a function returning an array or a number.
      *args: as for `gradient`.

    Returns:
      A tuple with one Jacobian per argument.

    Raises:
      GradientError: if `f` does not return an array.

    >>> import jax.numpy as jnp, zygote_jax
    >>> J_a, J_x = zygote_jax.jacobian(lambda a, x: a ** 2 * x, jnp.array([1.0, 2.0, 3.0]), 1.0)
    >>> J_a
    Array([[2., 0., 0.],
           [0., 4., 0.],
           [0., 0., 6.]], dtype=float64)
    >>> J_x
    Array([1., 4., 9.], dtype=float64)

    See also: `withjacobian`, `forward_jacobian`, `hessian`, `jax.jacrev`.
    """
    return withjacobian(f, *args).grad

