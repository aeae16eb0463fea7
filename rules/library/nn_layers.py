"""Neural-network layers: a fused layer norm and a memory-efficient attention.

`layer_norm`'s pullback is the one-pass formula instead of autodiff's chain of reductions;
`attention`'s rrule saves only the output and the per-row log-sum-exp and recomputes the
probabilities block by block in the backward pass (O(n) memory instead of O(n m)), with
`jax.nn.dot_product_attention`'s heads, mask, causal mask and bias applied per block.
Static parameters (`axis`, `eps` given as a keyword, `chunk_size`) get `NoTangent()`; a
pullback returns one cotangent per positional argument actually passed (`attention` passes
keyword arguments on positionally, so its `bias=` is differentiated). Shared conventions and
kernels come from `rules.library.nn`.
"""

from __future__ import annotations

import functools
import inspect
import math

import jax
import jax.numpy as jnp
import numpy as np

from .._helpers import _unbroadcast
from .._errors import format_message
from .._primitive import Primitive, primitive
from .._projection import ProjectTo
from .._thunks import thunk, unthunk
from .._zeros import AbstractZero, NoTangent, ZeroTangent
from .nn import _B, _M, _M32, _O, _S, _T, _axes, _bind, _cotangents, _kernel, _maybe, _zero

__all__ = ["layer_norm", "attention"]


# ----- layer_norm ---------------------------------------------------------------------------
def _spread(p, x, axes):
    """A parameter of the normalised dims' shape, reshaped to broadcast against x (or None)."""
    if p is None or jnp.ndim(p) == jnp.ndim(x):
        return p
    return jnp.reshape(p, tuple(n if a in axes else 1 for a, n in enumerate(jnp.shape(x))))


@_kernel
def _layer_norm(x, scale, offset, eps, axes):
    """(y, xhat, rstd): y = xhat * scale + offset, xhat = (x - mean) * rstd."""
    xc = x - jnp.mean(x, axis=axes, keepdims=True)
    rstd = jax.lax.rsqrt(jnp.mean(xc * xc, axis=axes, keepdims=True) + eps)  # two-pass variance
    xhat = xc * rstd
    y = xhat if scale is None else xhat * _spread(scale, x, axes)
    return (y if offset is None else y + _spread(offset, x, axes)), xhat, rstd


@_kernel
def _layer_norm_back(g, xhat, rstd, axes):
    """x_bar = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = y_bar * scale."""
    mean_g = jnp.mean(g, axis=axes, keepdims=True)
    return rstd * (g - mean_g - xhat * jnp.mean(g * xhat, axis=axes, keepdims=True))


def _reduce_to(dp, p, axes):
    """Sum `dp` (x's shape) to the parameter `p`'s shape: over the normalised axes' complement."""
    if jnp.ndim(p) == jnp.ndim(dp):
        return _unbroadcast(dp, jnp.shape(p))
    return jnp.reshape(jnp.sum(dp, axis=tuple(a for a in range(jnp.ndim(dp)) if a not in axes)), jnp.shape(p))


@primitive(examples=[(_M, _S, _O), (_M32, (_B + 0.5).astype(np.float32), None, (0, 1)), (_M, None, _O, -1, 0.1)])
def layer_norm(x, scale, offset, axis=-1, eps=1e-5):
    """(x - mean) / sqrt(var + eps) * scale + offset, statistics over `axis`.

    Why a rule: the fused pullback `rstd * (g - mean(g) - xhat * mean(g * xhat))` (with
    `g = y_bar * scale`) is one pass saving only `xhat` and `rstd`; and the variance is the
    two-pass `mean((x - mean)^2)`, accurate in float32 where `jax.nn.standardize`'s
    `mean(x^2) - mean^2` cancels catastrophically for inputs with a large mean.

    Args:
      x: real array.
      scale, offset: arrays with the shape of the normalised dimensions (e.g. `(d,)` for
        axis=-1), or broadcastable to x with x's rank, or None (no affine part).
      axis: static int or tuple of ints: the normalised axes.
      eps: added to the variance; differentiated when passed positionally as a float/array.

    Returns:
      The normalised array, of x's shape.

    >>> import jax.numpy as jnp
    >>> layer_norm(jnp.array([[1.0, 2.0, 3.0]]), jnp.ones(3), jnp.zeros(3), eps=0.0).round(4).tolist()
    [[-1.2247, 0.0, 1.2247]]

    See also: `jax.nn.standardize`, `rules.library.nn.softmax`.
    """
    return _layer_norm(x, scale, offset, eps, axes=_axes(axis, jnp.ndim(x)))[0]


@layer_norm.rrule
def layer_norm_rrule(*args, **kwargs):
    x, scale, offset, axis, eps = _bind(layer_norm.fn, args, kwargs)
    axes = _axes(axis, jnp.ndim(x))
    project_x, project_scale = ProjectTo(x), ProjectTo(scale)
    project_offset, project_eps = ProjectTo(offset), ProjectTo(eps)
    y, xhat, rstd = _layer_norm(x, scale, offset, eps, axes=axes)

    def layer_norm_pullback(y_bar):
        y_bar = unthunk(y_bar)
        if isinstance(y_bar, AbstractZero):
            return _cotangents(args, ZeroTangent(), _zero(scale), _zero(offset), NoTangent(), _zero(eps))
        g = y_bar if scale is None else y_bar * _spread(scale, x, axes)
        x_bar = thunk(lambda: project_x(_layer_norm_back(g, xhat, rstd, axes=axes)))
        scale_bar = _maybe(scale, lambda: project_scale(_reduce_to(y_bar * xhat, scale, axes)))
        offset_bar = _maybe(offset, lambda: project_offset(_reduce_to(y_bar, offset, axes)))
        eps_bar = _maybe(eps, lambda: project_eps(-0.5 * jnp.sum(g * xhat * rstd * rstd)))
        return _cotangents(args, x_bar, scale_bar, offset_bar, NoTangent(), eps_bar)

    return y, layer_norm_pullback


# ----- attention ----------------------------------------------------------------------------
_LAYOUTS = ("...TH", "BTNH")


class _PositionalPrimitive(Primitive):
    """A primitive that passes keyword arguments on positionally, so that `bias=` is differentiated.

    The lowering never differentiates keyword arguments (they are bound outside the rule);
    users of `jax.nn.dot_product_attention` write `bias=...` and expect its gradient.
    """

    def __call__(self, *args, **kwargs):
        if kwargs:
            bound = inspect.signature(self.fn).bind(*args, **kwargs)
            last = max(list(bound.signature.parameters).index(name) for name in bound.arguments)
            bound.apply_defaults()
            args = tuple(bound.arguments.values())[: last + 1]
        return super().__call__(*args)


def _padded(a, rank):
    """`a` with leading 1s up to `rank` (None stays None)."""
    return None if a is None else jnp.reshape(a, (1,) * (rank - jnp.ndim(a)) + jnp.shape(a))


def _group_heads(a, kv):
    """[B, T, N, H] -> [B, K, G, T, H]: the N = K * G query heads as K groups of G."""
    b, t, n, h = jnp.shape(a)
    return jnp.moveaxis(jnp.reshape(a, (b, t, kv, n // kv, h)), 1, 3)


def _rows(layout, a, kv):
    """An output-shaped array (q's layout) in the kernels' layout (..., T, Hv)."""
    if layout == "...TH":
        return a
    return _group_heads(a if jnp.ndim(a) == 4 else a[None], kv)


def _kernel_layout(layout, q, k, v, bias, mask):
    """The kernels' layout: q (..., T, H), k (..., S, H), v (..., S, Hv), bias and mask
    (..., T or 1, S or 1), all of one rank, leading dimensions broadcasting.

    "BTNH" maps q [B, T, N, H] to [B, K, G, T, H], k and v [B, S, K, H] to [B, K, 1, S, H]
    (a key/value head serves its group of G query heads), bias and mask [B, N or 1, T, S] to
    [B, K or 1, G or 1, T, S]. Linear in q, k, v and bias: `jax.vjp` maps cotangents back.
    """
    if layout == "...TH":
        rank = max(jnp.ndim(a) for a in (q, k, v, bias, mask) if a is not None)
        return tuple(_padded(a, rank) for a in (q, k, v, bias, mask))
    if jnp.ndim(q) == 3:  # [T, N, H]: one batch
        q, k, v = q[None], k[None], v[None]
    kv, g = jnp.shape(k)[2], jnp.shape(q)[2] // jnp.shape(k)[2]

    def grouped(a):
        if a is None:
            return None
        shape = jnp.shape(_padded(a, 4))
        return jnp.reshape(a, shape[:1] + ((kv, g) if shape[1] != 1 else (1, 1)) + shape[2:])

    k, v = (jnp.moveaxis(a, 1, 2)[:, :, None] for a in (k, v))
    return _group_heads(q, kv), k, v, grouped(bias), grouped(mask)


def _attention_checks(q, k, v, bias, mask, layout):
    """Raise for arguments `attention` cannot take (shapes and dtypes only: runs at trace time)."""

    def fail(what, expected, got, fix, error=ValueError):
        return error(format_message(f"`attention`: {what}", expected=expected, got=got, fix=fix))

    if layout not in _LAYOUTS:
        raise fail("unknown layout", " or ".join(map(repr, _LAYOUTS)), repr(layout), "pass layout='BTNH' for "
                   "jax.nn.dot_product_attention's [batch, seq, heads, dim], or leave the default")
    shapes = [tuple(jnp.shape(a)) for a in (q, k, v)]
    got = f"q {shapes[0]}, k {shapes[1]}, v {shapes[2]}"
    if layout == "BTNH":
        if {len(s) for s in shapes} not in ({3}, {4}):
            raise fail("layout 'BTNH' takes q [B, T, N, H], k and v [B, S, K, H] (or all without B)",
                       "three arrays of rank 4 (or all of rank 3)", got, "transpose to [batch, seq, heads, dim]")
        (*b, t, n, h), (*bk, s, kv, hk), (*bv, sv, kvv, _) = shapes
        if b != bk or b != bv or h != hk or (s, kv) != (sv, kvv) or n % kv:
            raise fail("q, k and v do not fit together", "q [B, T, N, H], k [B, S, K, H], v [B, S, K, Hv], "
                       "K dividing N", got, "use as many key/value heads as query heads, or a divisor of it")
        logits = (*b, n, t, s)
    else:
        if min(map(len, shapes)) < 2 or shapes[0][-1] != shapes[1][-1] or shapes[1][-2] != shapes[2][-2]:
            raise fail("q, k and v do not fit together", "q (..., T, H), k (..., S, H), v (..., S, Hv)", got,
                       "give q and k one last dimension, k and v one key count")
        try:
            logits = jnp.broadcast_shapes(*(sh[:-2] for sh in shapes)) + (shapes[0][-2], shapes[1][-2])
        except ValueError:
            raise fail("the leading (batch) dimensions of q, k and v do not broadcast", "broadcastable "
                       "leading dimensions", got, "give q, k and v one batch shape") from None
    for name, a in (("bias", bias), ("mask", mask)):
        if a is None:
            continue
        shape = tuple(jnp.shape(a))
        if len(shape) > len(logits) or any(m not in (1, n) for m, n in zip(shape[::-1], logits[::-1])):
            raise fail(f"{name} does not broadcast to the logits' shape", f"a shape broadcastable to "
                       f"{logits}", f"{name} {shape}", "one logit per (batch, head, query, key), or 1s")
    if mask is not None and jnp.result_type(mask) != jnp.bool_:
        raise fail("mask must be boolean (True: attend)", "dtype bool", f"dtype {jnp.result_type(mask)}",
                   "pass `mask != 0`; an additive mask (0 / -inf) goes in `bias`", TypeError)


def _key_block(j, c, q, k, v, bias, mask, is_causal):
    """Block j of keys, start = min(j c, S - c) .. start + c, and where rows attend to them.

    The last block ends at key S: a key an earlier block covered is masked out there, so no
    array is padded. Causal: query t attends to keys 0..t (as `jax.nn.dot_product_attention`).
    """
    start = jnp.minimum(j * c, jnp.shape(k)[-2] - c)
    cols = start + jnp.arange(c)
    ok = (cols >= j * c)[None, :]
    if is_causal:
        ok = ok & (cols[None, :] <= jnp.arange(jnp.shape(q)[-2])[:, None])
    ok = _padded(ok, jnp.ndim(q))

    def take(a, axis):
        return a if a is None or jnp.shape(a)[axis] == 1 else jax.lax.dynamic_slice_in_dim(a, start, c, axis)

    if mask is not None:
        ok = ok & take(mask, -1)
    return start, take(k, -2), take(v, -2), take(bias, -1), ok


def _logits(q, kj, bias_j, ok, scale):
    s = jnp.einsum("...td,...cd->...tc", q, kj) * scale
    return jnp.where(ok, s if bias_j is None else s + bias_j, -jnp.inf)


def _add_block(acc, block, start, axis):
    """acc + block: block summed to acc's (broadcast) shape, added at start.. along `axis`."""
    if jnp.shape(acc)[axis] == 1:
        return acc + _unbroadcast(block, jnp.shape(acc))
    shape = list(jnp.shape(acc))
    shape[axis] = jnp.shape(block)[axis]
    old = jax.lax.dynamic_slice_in_dim(acc, start, shape[axis], axis)
    return jax.lax.dynamic_update_slice_in_dim(acc, old + _unbroadcast(block, tuple(shape)), start, axis)


def _prepare(q, k, bias, scale, chunk_size, dtype):
    """Bias and scale in `dtype` (scale None: 1 / sqrt(H)), the block size and the block count."""
    scale = jnp.asarray(1 / math.sqrt(jnp.shape(q)[-1]) if scale is None else scale, dtype)
    c = max(1, min(int(chunk_size), jnp.shape(k)[-2]))
    return (None if bias is None else bias.astype(dtype)), scale, c, -(-jnp.shape(k)[-2] // c)


@functools.partial(jax.jit, static_argnames=("chunk_size", "is_causal", "layout"))
def _attention_forward(q, k, v, bias, mask, scale, chunk_size, is_causal, layout):
    """(out, lse): an online softmax over key blocks, never forming the T x S logits.

    A row that attends to no key gets out 0 and lse -inf (not 0 / 0).
    """
    _attention_checks(q, k, v, bias, mask, layout)
    dtype = jnp.result_type(q, k, v)
    q_k, k_k, v_k, bias_k, mask_k = _kernel_layout(layout, q, k, v, bias, mask)
    bias_k, scale, c, nc = _prepare(q_k, k_k, bias_k, scale, chunk_size, dtype)
    rows = jnp.broadcast_shapes(q_k.shape[:-1], k_k.shape[:-2] + (1,), v_k.shape[:-2] + (1,))

    def attention_forward_step(carry, j):
        top, total, acc = carry
        _, kj, vj, bias_j, ok = _key_block(j, c, q_k, k_k, v_k, bias_k, mask_k, is_causal)
        s = _logits(q_k, kj, bias_j, ok, scale)
        new_top = jnp.maximum(top, jnp.max(s, axis=-1))
        shift = jnp.where(jnp.isneginf(new_top), 0.0, new_top)[..., None]  # no key yet: no -inf - -inf
        fade, p = jnp.exp(top[..., None] - shift), jnp.exp(s - shift)
        acc = acc * fade + jnp.einsum("...tc,...cv->...tv", p, vj)
        return (new_top, total * fade[..., 0] + jnp.sum(p, axis=-1), acc), None

    init = (jnp.full(rows, -jnp.inf, dtype), jnp.zeros(rows, dtype), jnp.zeros(rows + v_k.shape[-1:], dtype))
    (top, total, acc), _ = jax.lax.scan(attention_forward_step, init, jnp.arange(nc))
    seen = total > 0
    total = jnp.where(seen, total, 1.0)
    out, lse = acc / total[..., None], jnp.where(seen, top + jnp.log(total), -jnp.inf)
    if layout == "BTNH":
        b, kv, g, t, hv = jnp.shape(out)
        out = jnp.reshape(jnp.moveaxis(out, 3, 1), (b, t, kv * g, hv))
        out = out if jnp.ndim(q) == 4 else out[0]
    return out, lse


@functools.partial(jax.jit, static_argnames=("chunk_size", "is_causal", "layout"))
def _attention_backward(q, k, v, bias, mask, scale, out, lse, out_bar, chunk_size, is_causal, layout):
    """(q_bar, k_bar, v_bar, bias_bar, scale_bar), recomputing each probability block."""
    (q_k, k_k, v_k, bias_k), to_layout = jax.vjp(
        lambda q, k, v, bias: _kernel_layout(layout, q, k, v, bias, None)[:4], q, k, v, bias
    )
    dtype = jnp.result_type(q, k, v, out_bar)
    mask_k = _kernel_layout(layout, q, k, v, None, mask)[4]
    bias_k, scale, c, nc = _prepare(q_k, k_k, bias_k, scale, chunk_size, dtype)
    out_bar, out = (_rows(layout, a, k_k.shape[1] if layout == "BTNH" else None) for a in (out_bar, out))
    delta = jnp.sum(out_bar * out, axis=-1, keepdims=True)  # rowwise <out_bar, out>
    lse = jnp.where(jnp.isneginf(lse), jnp.inf, lse)[..., None]  # rows attending to no key: p = 0

    def attention_backward_step(carry, j):
        q_acc, k_bar, v_bar, bias_bar = carry  # q_acc = sum over keys of s_bar k (unscaled)
        start, kj, vj, bias_j, ok = _key_block(j, c, q_k, k_k, v_k, bias_k, mask_k, is_causal)
        p = jnp.exp(_logits(q_k, kj, bias_j, ok, scale) - lse)
        s_bar = p * (jnp.einsum("...tv,...cv->...tc", out_bar, vj) - delta)
        q_acc = q_acc + jnp.einsum("...tc,...cd->...td", s_bar, kj)
        k_bar = _add_block(k_bar, jnp.einsum("...tc,...td->...cd", s_bar, q_k) * scale, start, -2)
        v_bar = _add_block(v_bar, jnp.einsum("...tc,...tv->...cv", p, out_bar), start, -2)
        bias_bar = None if bias_bar is None else _add_block(bias_bar, s_bar, start, -1)
        return (q_acc, k_bar, v_bar, bias_bar), None

    zeros = lambda a: None if a is None else jnp.zeros(a.shape, dtype)  # noqa: E731
    init = (jnp.zeros(delta.shape[:-1] + q_k.shape[-1:], dtype), zeros(k_k), zeros(v_k), zeros(bias_k))
    (q_acc, k_bar, v_bar, bias_bar), _ = jax.lax.scan(attention_backward_step, init, jnp.arange(nc))
    q_bar = _unbroadcast(q_acc * scale, q_k.shape)
    bars = [
        None if b is None else b.astype(jnp.result_type(a))  # the dtypes `to_layout` expects
        for a, b in zip((q, k, v, bias), (q_bar, k_bar, v_bar, bias_bar))
    ]
    return (*to_layout(tuple(bars)), jnp.sum(q_acc * q_k))


_rng = np.random.default_rng(0)  # example inputs: 2 query heads sharing 1 key/value head; a causal batch
_Q4, _K4, _V4, _BIAS4 = (_rng.normal(size=s) for s in ((1, 3, 2, 2), (1, 4, 1, 2), (1, 4, 1, 2), (1, 2, 3, 4)))
_MASK4 = np.array([[[[False] * 4, [True, False, True, True], [True] * 4]]])  # query 0 attends to no key
_Q3, _K3, _V3 = (_rng.normal(size=s).astype(np.float32) for s in ((2, 3, 2), (2, 4, 2), (2, 4, 1)))


@functools.partial(
    _PositionalPrimitive,
    examples=[  # (q, k, v, chunk_size, bias, mask, is_causal, scale, layout)
        (_M, _B - _M, _T, 1),  # two key chunks; tests cover batches and padding
        (_Q4, _K4, _V4, 3, _BIAS4, _MASK4, False, None, "BTNH"),  # a partial last chunk
        (_Q3, _K3, _V3, 2, None, None, True, 0.7),
    ],
)
def attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    chunk_size: int = 128,
    bias: jax.Array | None = None,
    mask: jax.Array | None = None,
    is_causal: bool = False,
    scale: float | jax.Array | None = None,
    layout: str = "...TH",
) -> jax.Array:
    """Scaled dot-product attention softmax(scale q k^T + bias, masked) v, in O(n * chunk) memory.

    Why a rule: autodiff of the formula saves the T x S probability matrix for the backward
    pass; this rrule saves only the output and the per-row log-sum-exp and recomputes the
    probabilities block by block over key chunks, so neither pass holds a T x S array
    (the forward pass is an online softmax over the same chunks). Mask, causal mask and
    bias are applied per block; only a full-size `bias` (and its cotangent) is T x S.
    Arguments and semantics follow `jax.nn.dot_product_attention`, except that a query row
    that may attend to no key (fully masked) gives 0, with zero cotangents, where JAX's
    large finite negative logits give the mean of all values. Every argument may be passed
    by keyword: `attention` passes them on positionally, so `bias=` is differentiated too.

    Args:
      q: queries (..., T, H) with any leading batch dimensions; with layout 'BTNH',
        [B, T, N, H] or [T, N, H] (N heads).
      k: keys (..., S, H); with 'BTNH', [B, S, K, H], K key/value heads, K dividing N
        (grouped-query attention: query head n uses key/value head n // (N // K)).
      v: values (..., S, Hv); with 'BTNH', [B, S, K, Hv].
      chunk_size: static int: keys per block (the memory/parallelism trade-off).
      bias: None, or added to the logits, broadcastable to them: (..., T, S), with 'BTNH'
        [B, N, T, S]. Differentiated.
      mask: None, or a bool array broadcastable to the logits: True where a query attends to
        a key. Not differentiated.
      is_causal: static bool: query t attends to keys 0..t only (keys in q's order).
      scale: the logits' factor; None: 1 / sqrt(H). Differentiated when an array or float.
      layout: '...TH' (leading batch dimensions, no head axis) or 'BTNH'
        (`jax.nn.dot_product_attention`'s).

    Returns:
      The attention output: (..., T, Hv) (leading dimensions broadcast); with 'BTNH', q's
      shape with H replaced by Hv.

    Raises:
      ValueError: unknown layout, or shapes that do not fit together (K not dividing N, a
        bias or mask that does not broadcast to the logits).
      TypeError: a mask that is not boolean.

    >>> import jax.numpy as jnp
    >>> q, k = jnp.zeros((2, 4)), jnp.ones((3, 4))
    >>> v = jnp.array([[0.0], [3.0], [6.0]])
    >>> attention(q, k, v, 2).tolist()   # equal scores: the mean of v
    [[3.0], [3.0]]
    >>> attention(q, k, v, is_causal=True).tolist()   # query t sees keys 0..t
    [[0.0], [1.5]]
    >>> attention(q, k, v, mask=jnp.array([[True, False, True], [False] * 3])).tolist()
    [[3.0], [0.0]]
    >>> q4, kv = jnp.ones((2, 5, 4, 8)), jnp.ones((2, 7, 2, 8))   # 4 query heads, 2 key/value heads
    >>> attention(q4, kv, kv, layout="BTNH").shape
    (2, 5, 4, 8)

    See also: `jax.nn.dot_product_attention`, `rules.library.nn.softmax`.
    """
    return _attention_forward(q, k, v, bias, mask, scale, chunk_size=chunk_size, is_causal=is_causal, layout=layout)[0]


@attention.rrule
def attention_rrule(*args, **kwargs):
    q, k, v, chunk_size, bias, mask, is_causal, scale, layout = _bind(attention.fn, args, kwargs)
    static = dict(chunk_size=chunk_size, is_causal=is_causal, layout=layout)
    projections = [ProjectTo(a) for a in (q, k, v, bias, scale)]
    out, lse = _attention_forward(q, k, v, bias, mask, scale, **static)  # residuals: the inputs, out, lse

    def attention_pullback(out_bar):
        out_bar = unthunk(out_bar)
        if isinstance(out_bar, AbstractZero):
            zero = ZeroTangent()
            return _cotangents(args, zero, zero, zero, NoTangent(), _zero(bias), NoTangent(), NoTangent(), _zero(scale))
        memo: list = []

        def cotangent(i):  # one backward sweep serves every cotangent
            if not memo:
                memo.append(_attention_backward(q, k, v, bias, mask, scale, out, lse, out_bar, **static))
            return projections[i](memo[0][i])

        q_bar, k_bar, v_bar = (thunk(functools.partial(cotangent, i)) for i in range(3))
        bias_bar, scale_bar = _maybe(bias, lambda: cotangent(3)), _maybe(scale, lambda: cotangent(4))
        return _cotangents(args, q_bar, k_bar, v_bar, NoTangent(), bias_bar, NoTangent(), NoTangent(), scale_bar)

    return out, attention_pullback
