"""Strict configuration for the whole test run (tests/ and the doctests in the packages).

x64 is on, so finite differences run in float64 and dtype-specific tests state their dtype;
implicit rank promotion raises, as it hides broadcasting bugs in rules.
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_rank_promotion", "raise")
