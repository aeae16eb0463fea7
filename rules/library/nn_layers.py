"""Neural-network layers: a fused layer norm and a memory-efficient attention.

`layer_norm`'s pullback is the one-pass formula instead of autodiff's chain of reductions;
`attention`'s rrule saves only the output and the per-row log-sum-exp and recomputes the
probabilities block by block in the backward pass (O(n) memory instead of O(n m)). Static
parameters (`axis`, `eps` given as a keyword, `chunk_size`) get `NoTangent()`; a pullback
returns one cotangent per positional argument actually passed. Shared conventions and
kernels come from `rules.library.nn`.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from .._helpers import _unbroadcast
from .._primitive import primitive
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
def _key_chunks(k, v, chunk_size):
    """Keys and values as (chunks, ..., c, d) blocks (zero-padded), and which keys are real."""
    m = jnp.shape(k)[-2]
    c = max(1, min(int(chunk_size), m))
    nc = -(-m // c)
    pad = [(0, 0)] * (jnp.ndim(k) - 2) + [(0, nc * c - m), (0, 0)]

    def blocks(a):
        a = jnp.pad(a, pad)
        return jnp.moveaxis(jnp.reshape(a, jnp.shape(a)[:-2] + (nc, c, jnp.shape(a)[-1])), -3, 0)

    return blocks(k), blocks(v), np.arange(nc * c).reshape(nc, c) < m, m


def _unchunk(blocks, m):
    """(chunks, ..., c, d) -> (..., m, d): the inverse of `_key_chunks`' blocking."""
    a = jnp.moveaxis(blocks, 0, -3)
    return jnp.reshape(a, jnp.shape(a)[:-3] + (-1, jnp.shape(a)[-1]))[..., :m, :]


def _scores(q, kj, valid):
    s = jnp.einsum("...nd,...cd->...nc", q, kj) / math.sqrt(jnp.shape(q)[-1])
    return s, jnp.reshape(valid, (1,) * (s.ndim - 1) + valid.shape)


@functools.partial(jax.jit, static_argnames=("chunk_size",))
def _attention_forward(q, k, v, chunk_size):
    """Online softmax over key chunks: (out, lse), never forming the n x m scores."""
    k_c, v_c, valid, _ = _key_chunks(k, v, chunk_size)
    dtype, rows = jnp.result_type(q, k, v), jnp.shape(q)[:-1]

    def attention_forward_step(carry, block):
        top, total, acc = carry
        kj, vj, ok = block
        s, ok = _scores(q, kj, ok)
        s = jnp.where(ok, s, -jnp.inf)
        new_top = jnp.maximum(top, jnp.max(s, axis=-1))
        fade = jnp.exp(top - new_top)
        p = jnp.exp(s - new_top[..., None])
        total = total * fade + jnp.sum(p, axis=-1)
        acc = acc * fade[..., None] + jnp.einsum("...nc,...cv->...nv", p, vj)
        return (new_top, total, acc), None

    init = (jnp.full(rows, -jnp.inf, dtype), jnp.zeros(rows, dtype), jnp.zeros(rows + jnp.shape(v)[-1:], dtype))
    (top, total, acc), _ = jax.lax.scan(attention_forward_step, init, (k_c, v_c, valid))
    return acc / total[..., None], top + jnp.log(total)


@functools.partial(jax.jit, static_argnames=("chunk_size",))
def _attention_backward(q, k, v, out, lse, out_bar, chunk_size):
    """(q_bar, k_bar, v_bar), recomputing each probability block from q, k and lse."""
    scale = 1 / math.sqrt(jnp.shape(q)[-1])
    k_c, v_c, valid, m = _key_chunks(k, v, chunk_size)
    delta = jnp.sum(out_bar * out, axis=-1)[..., None]  # rowwise <out_bar, out>

    def attention_backward_step(q_bar, block):
        kj, vj, ok = block
        s, ok = _scores(q, kj, ok)
        p = jnp.where(ok, jnp.exp(s - lse[..., None]), 0.0)
        v_bar_j = jnp.einsum("...nc,...nv->...cv", p, out_bar)
        s_bar = p * (jnp.einsum("...nv,...cv->...nc", out_bar, vj) - delta)
        q_bar = q_bar + jnp.einsum("...nc,...cd->...nd", s_bar, kj) * scale
        k_bar_j = jnp.einsum("...nc,...nd->...cd", s_bar, q) * scale
        return q_bar, (k_bar_j, v_bar_j)

    q_bar = jnp.zeros(jnp.shape(q), jnp.result_type(q, k, v, out_bar))
    q_bar, (k_bar, v_bar) = jax.lax.scan(attention_backward_step, q_bar, (k_c, v_c, valid))
    return q_bar, _unchunk(k_bar, m), _unchunk(v_bar, m)


@primitive(examples=[(_M, _B - _M, _T, 1)])  # two key chunks; tests cover batches and padding
def attention(q, k, v, chunk_size=128):
    """Scaled dot-product attention softmax(q k^T / sqrt(d)) v, in O(n * chunk) memory.

    Why a rule: autodiff of the formula saves the n x m probability matrix for the backward
    pass; this rrule saves only the output and the per-row log-sum-exp and recomputes the
    probabilities block by block over key chunks, so neither pass holds an n x m array
    (the forward pass is an online softmax over the same chunks).

    Args:
      q: queries (n, d), or (..., n, d) with leading batch dimensions.
      k: keys (m, d) (same leading dimensions).
      v: values (m, dv) (same leading dimensions).
      chunk_size: static int: keys per block (the memory/parallelism trade-off).

    Returns:
      The attention output (..., n, dv).

    >>> import jax.numpy as jnp
    >>> q, k = jnp.zeros((2, 4)), jnp.ones((3, 4))
    >>> v = jnp.array([[0.0], [3.0], [6.0]])
    >>> attention(q, k, v, 2).tolist()   # equal scores: the mean of v
    [[3.0], [3.0]]

    See also: `rules.library.nn.softmax`, `rules.library.nn.logsumexp`.
    """
    return _attention_forward(q, k, v, chunk_size=chunk_size)[0]


@attention.rrule
def attention_rrule(*args, **kwargs):
    q, k, v, chunk_size = _bind(attention.fn, args, kwargs)
    project_q, project_k, project_v = ProjectTo(q), ProjectTo(k), ProjectTo(v)
    out, lse = _attention_forward(q, k, v, chunk_size=chunk_size)  # the only residuals: q, k, v, out, lse

    def attention_pullback(out_bar):
        out_bar = unthunk(out_bar)
        if isinstance(out_bar, AbstractZero):
            return _cotangents(args, ZeroTangent(), ZeroTangent(), ZeroTangent())
        memo: list = []

        def grads():  # one backward sweep serves all three cotangents
            if not memo:
                memo.append(_attention_backward(q, k, v, out, lse, out_bar, chunk_size=chunk_size))
            return memo[0]

        return _cotangents(
            args,
            thunk(lambda: project_q(grads()[0])),
            thunk(lambda: project_k(grads()[1])),
            thunk(lambda: project_v(grads()[2])),
        )

    return out, attention_pullback
