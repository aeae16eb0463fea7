"""Logarithms and exponentials at their edges, as LogExpFunctions.jl has them (being written)."""

from __future__ import annotations

__all__: list[str] = []
