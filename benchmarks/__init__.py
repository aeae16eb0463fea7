"""Benchmarks: scripts that measure side by side in one run and print markdown tables.

Run them all with `python -m benchmarks` (`--quick` for one small round each, as the test
suite does so the scripts cannot rot). Nothing here is a timed assertion.
"""
