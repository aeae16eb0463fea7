"""Discrete functions: `non_differentiable`, so their rules say `NoTangent()` for every input.

Rounding, arg-reductions, sorting permutations, comparisons and predicates, shape helpers
and random-key plumbing have no useful derivative; declaring them keeps `rrule_via_ad`
compositions from differentiating through them and documents the fact.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from .._helpers import non_differentiable as _non_differentiable

# Keyed on the jax.numpy functions themselves, for `rules.rrule(jnp.argmax, x)` and
# `rrule_via_ad`: registered on plain functions knowingly.
non_differentiable = functools.partial(_non_differentiable, plain=True)

_X = np.array([0.3, 1.55, -0.8])
_Y = np.array([0.2, 1.6, -0.9])

_f: Callable[..., Any]  # the loop variable below, over functions of any signature

# ----- rounding -----------------------------------------------------------------------------
for _f in (jnp.floor, jnp.ceil, jnp.round, jnp.rint, jnp.trunc):
    non_differentiable(_f, examples=[(_X,)])

# ----- arg-reductions and sorting permutations ----------------------------------------------
for _f in (jnp.argmax, jnp.argmin, jnp.argsort, jnp.nanargmax, jnp.nanargmin, jnp.argwhere, jnp.flatnonzero):
    non_differentiable(_f, examples=[(_X,)] if _f not in (jnp.argwhere, jnp.flatnonzero) else None)
non_differentiable(jnp.searchsorted, examples=[(np.sort(_X), _Y)])
non_differentiable(jnp.digitize)

# ----- comparisons and predicates -----------------------------------------------------------
for _f in (jnp.greater, jnp.greater_equal, jnp.less, jnp.less_equal, jnp.equal, jnp.not_equal):
    non_differentiable(_f, examples=[(_X, _Y)])
for _f in (jnp.isnan, jnp.isinf, jnp.isfinite, jnp.signbit, jnp.isreal, jnp.iscomplex):
    non_differentiable(_f, examples=[(_X,)])
for _f in (jnp.logical_and, jnp.logical_or, jnp.logical_xor, jnp.isclose):
    non_differentiable(_f)
non_differentiable(jnp.logical_not)

# ----- shapes and constructors from shapes --------------------------------------------------
for _f in (jnp.shape, jnp.size, jnp.ndim, jnp.zeros_like, jnp.ones_like, jnp.empty_like):
    non_differentiable(_f)

# ----- random keys --------------------------------------------------------------------------
for _f in (jax.random.key, jax.random.PRNGKey, jax.random.split, jax.random.fold_in, jax.random.key_data):
    non_differentiable(_f)
