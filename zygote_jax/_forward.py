"""Second order and forward mode: `hessian`, `hessian_reverse`, `diaghessian`, `forward_jacobian`, `forwarddiff`.

`hessian` is forward-over-reverse (`jax.jacfwd` of `jax.grad`). That works through
primitives that have only an rrule: their pullback is JAX code, which forward mode
differentiates, and where forward mode meets such a primitive directly (an rrule whose
pullback calls another rrule-only primitive on the primal), its transposed pullback serves.
Only a pullback JAX cannot transpose (a `while_loop`) has no forward mode, which the rule
system reports as `rules.ForwardModeError`; `hessian` and `diaghessian` then fall back to
reverse-over-reverse.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

import rules
from rules._dual import forward_mode_required

from ._api import _check_scalar
from ._args import ArgSpec, promoted_pass
from ._control import deriving
from ._errors import GradientError, describe, message, name_of

__all__ = ["hessian", "hessian_reverse", "diaghessian", "forward_jacobian", "forwarddiff"]


def _real_argument(x: Any, f: Callable, api: str) -> Any:
    """`x` as a differentiable real value: ints promoted to floats, anything else an error."""
    if isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)):
        return float(x)
    dtype = jnp.result_type(x) if isinstance(x, (float, np.floating, jax.Array, np.ndarray)) else None
    if dtype is None or not jnp.issubdtype(dtype, jnp.floating):
        raise GradientError(
            message(
                f"`{api}({name_of(f)}, x)`: x must be a real number or a real floating array",
                expected="a float, an int, or a float array",
                got=describe(x),
                fix="convert x, e.g. `jnp.asarray(x, float)`; for complex x differentiate real and imaginary parts",
            )
        )
    return x


def _checked_scalar(fn: Callable, f: Callable, api: str) -> Callable:
    def scalar_fn(*args):
        y = fn(*args)
        _check_scalar(y, f, api)
        return y

    return scalar_fn


def _second_derivative(fn: Callable, x: Any, forward: bool) -> Any:
    """d(grad fn)/dx, forward-over-reverse if `forward` (falling back), else reverse-over-reverse."""
    grad_fn = jax.grad(fn)
    with deriving():
        if forward:
            try:
                with forward_mode_required():  # raise when traced, also under jax.jit
                    return jax.jacfwd(grad_fn)(x)
            except rules.ForwardModeError:
                pass  # a primitive without forward mode: differentiate the gradient in reverse
        return jax.jacrev(grad_fn)(x)


def _as_matrix(h: Any, x: Any) -> Any:
    n = int(np.size(x))
    return jnp.reshape(h, ()) if np.ndim(x) == 0 else jnp.reshape(h, (n, n))


def hessian(f: Callable, x: Any) -> Any:
    """The Hessian of the real scalar `f(x)`, forward-over-reverse.

    Computed as `jax.jacfwd(jax.grad(f))`; where forward mode meets a primitive without
    forward mode (`rules.ForwardModeError`), falls back to reverse-over-reverse
    (`hessian_reverse`). Either way, a primitive's rule is what gets differentiated.

    Args:
      f: a function of one argument returning a real scalar.
      x: a real number or a real array (ints are promoted to floats).

    Returns:
      A number for a scalar `x`; otherwise the matrix `H[i, j] = d2f / dx[i] dx[j]` of shape
      `(x.size, x.size)`, indexing `x` linearly whatever its shape (Zygote's layout).

    Raises:
      GradientError: if `x` is not real or `f(x)` is not a real scalar.

    >>> import jax.numpy as jnp, zygote_jax
    >>> zygote_jax.hessian(lambda x: x[0] * x[1], jnp.array([1.0, 2.0]))
    Array([[0., 1.],
           [1., 0.]], dtype=float64)
    >>> float(zygote_jax.hessian(jnp.sin, jnp.pi / 2))
    -1.0

    See also: `hessian_reverse`, `diaghessian`, `jacobian`, `jax.hessian`.
    """
    x = _real_argument(x, f, "hessian")
    return _as_matrix(_second_derivative(_checked_scalar(f, f, "hessian"), x, forward=True), x)


def hessian_reverse(f: Callable, x: Any) -> Any:
    """The Hessian of the real scalar `f(x)`, reverse-over-reverse (`jax.jacrev(jax.grad(f))`).

    Args:
      f: a function of one argument returning a real scalar.
      x: a real number or a real array.

    Returns:
      As for `hessian`.

    Raises:
      GradientError: if `x` is not real or `f(x)` is not a real scalar.

    >>> import jax.numpy as jnp, zygote_jax
    >>> zygote_jax.hessian_reverse(lambda x: jnp.sum(x ** 3), jnp.array([1.0, 2.0]))
    Array([[ 6.,  0.],
           [ 0., 12.]], dtype=float64)

    See also: `hessian`, `diaghessian`.
    """
    x = _real_argument(x, f, "hessian_reverse")
    return _as_matrix(_second_derivative(_checked_scalar(f, f, "hessian_reverse"), x, forward=False), x)


def diaghessian(f: Callable, *args: Any) -> tuple:
    """The diagonal of the Hessian of the real scalar `f(*args)`, for each argument.

    `h[i] = d2f / dx[i]^2`, in the shape of `x`; arguments that are not differentiated
    (see `gradient`) get `None`. Forward-over-reverse with the same fallback as `hessian`.

    Args:
      f: a function returning a real scalar.
      *args: its arguments (real).

    Returns:
      A tuple with one diagonal per argument.

    Raises:
      GradientError: if an argument is complex or `f` does not return a real scalar.

    >>> import jax.numpy as jnp, zygote_jax
    >>> zygote_jax.diaghessian(lambda x: jnp.sum(x ** 3), jnp.array([[1.0, 2.0], [3.0, 4.0]]))
    (Array([[ 6., 12.],
           [18., 24.]], dtype=float64),)

    See also: `hessian`, `gradient`.
    """

    spec = ArgSpec(args)

    def diagonals(index: list[int]) -> dict[int, Any]:
        fn = _checked_scalar(spec.bind(f, index), f, "diaghessian")
        values = spec.values(index)
        found = {}
        for j, v in enumerate(values):
            if jnp.iscomplexobj(v):
                raise GradientError(
                    message(
                        f"`diaghessian({name_of(f)}, ...)`: arguments must be real",
                        expected="real numbers or arrays",
                        got=f"a complex {describe(v)}",
                        fix="differentiate real and imaginary parts as separate real arguments",
                    )
                )

            def fn_of_j(u, j=j):
                return fn(*values[:j], u, *values[j + 1 :])

            h = _as_matrix(_second_derivative(fn_of_j, v, forward=True), v)
            found[index[j]] = jnp.reshape(jnp.diagonal(h) if h.ndim == 2 else h, np.shape(v))
        return found

    found = diagonals(spec.diff_index)  # the ints as they are (see `_args`)
    found.update(promoted_pass(spec, diagonals) or {})
    return spec.grads(found)


def forward_jacobian(f: Callable, x: Any) -> tuple[Any, Any]:
    """`f(x)` and its Jacobian computed in forward mode, transposed as in Zygote.

    Args:
      f: a function of one argument returning an array or a number.
      x: a real number or a real array (ints are promoted to floats).

    Returns:
      `(y, J)` with `J` of shape `(x.size, y.size)`: `J[i, k] = dy[k] / dx[i]` (the
      transpose of `jacobian`'s layout).

    Raises:
      GradientError: if `x` is not real or `f` does not return an array.
      rules.ForwardModeError: if `f` calls a primitive without forward mode (an rrule
        whose pullback JAX cannot transpose); use `jacobian`.

    >>> import jax.numpy as jnp, zygote_jax
    >>> y, J = zygote_jax.forward_jacobian(lambda x: jnp.array([x[0] * x[1], x[1]]), jnp.array([2.0, 3.0]))
    >>> J
    Array([[3., 0.],
           [2., 1.]], dtype=float64)

    See also: `jacobian`, `forwarddiff`, `jax.jacfwd`.
    """
    x = _real_argument(x, f, "forward_jacobian")

    def f_with_value(u):
        y = f(u)
        if not hasattr(y, "shape") and not isinstance(y, (int, float, complex)):
            raise GradientError(
                message(
                    f"`forward_jacobian({name_of(f)}, x)`: the function must return an array or a number",
                    expected="an array",
                    got=describe(y),
                    fix="stack the outputs into one array",
                )
            )
        return y, y

    with deriving(), forward_mode_required():
        J, y = jax.jacfwd(f_with_value, has_aux=True)(x)
    return y, jnp.reshape(J, (int(np.size(y)), int(np.size(x)))).T


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _forwarddiff(f: Callable, x: Any, *closed: Any) -> Any:
    return f(x, *closed)


@_forwarddiff.defjvp
def _forwarddiff_jvp(f, primals, tangents):
    (x, *closed), (x_dot, *closed_dot) = primals, tangents
    with deriving():
        try:
            J, y = jax.jacfwd(lambda u: (lambda out: (out, out))(f(u, *closed)), has_aux=True)(x)
        except TypeError as err:  # f closed over a value: its primitives run from a jaxpr (closure_convert)
            if isinstance(err, rules.ForwardModeError) or "forward-mode" not in str(err):
                raise
            raise rules.ForwardModeError(
                "`forwarddiff`: f has no forward mode: it calls a jax.custom_vjp (an rrule whose pullback "
                "JAX cannot transpose, lowered without an frule); give that function an frule, or "
                "differentiate without forwarddiff"
            ) from err
        y_dot = jax.tree_util.tree_map(lambda J_leaf: jnp.tensordot(J_leaf, x_dot, axes=np.ndim(x)), J)
        if closed:  # values f closes over that are differentiated too: one more forward pass
            by_closed = jax.jvp(lambda *c: f(x, *c), tuple(closed), tuple(closed_dot))[1]
            y_dot = jax.tree_util.tree_map(jnp.add, y_dot, by_closed)
    return y, y_dot


def forwarddiff(f: Callable, x: Any) -> Any:
    """`f(x)`, whose derivative any outer differentiation computes in forward mode.

    Zygote's `forwarddiff`: the value is `f(x)`; when `gradient` (or `jax.grad`, or
    forward mode) differentiates through this call, the Jacobian of `f` at `x` is built
    with `jax.jacfwd` (one forward pass per element of `x`) and then contracted with the
    incoming cotangent. Worth it when `x` is small and `f` long or memory-hungry. Values
    that `f` closes over and that are differentiated too (`lambda u: u * w` inside a loss of
    `w`) get their derivative by one more forward pass (reverse mode transposes it; Zygote's
    `forwarddiff` drops their gradients).

    Args:
      f: a function of one argument returning an array (or a pytree of arrays).
      x: a real number or a real array (ints are promoted to floats).

    Returns:
      `f(x)`.

    Raises:
      GradientError: if `x` is not real.
      rules.ForwardModeError: when differentiated, if `f` calls a primitive without
        forward mode (an rrule whose pullback JAX cannot transpose).

    >>> import jax.numpy as jnp, zygote_jax
    >>> float(zygote_jax.forwarddiff(jnp.sin, 0.0))
    0.0
    >>> g = zygote_jax.gradient(lambda x: jnp.sum(zygote_jax.forwarddiff(lambda u: u ** 2, x)), jnp.array([1.0, 2.0]))
    >>> g
    (Array([2., 4.], dtype=float64),)

    See also: `forward_jacobian`, `checkpointed`, `jax.jacfwd`.
    """
    x = _real_argument(x, f, "forwarddiff")
    converted, closed = jax.closure_convert(f, x)  # the tracers f closes over, made arguments
    return _forwarddiff(converted, x, *closed) if closed else _forwarddiff(f, x)
