"""Test-session settings shared by every test directory."""

from __future__ import annotations

import pytest

# A small user project that tests/test_audit.py runs pytest on in a subprocess: not part of
# this suite (its own test file imports its own module).
collect_ignore = ["data"]


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the `slow` tests (notebooks, benchmarks: 5-30 s each) first. pytest-xdist hands
    tests to its workers in this order, so the long ones start while many short ones are
    left to balance the workers; collected last, the 30 s benchmark run kept one worker busy
    alone at the end (a tail of up to half a minute on 2 cores)."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: order kept otherwise
