"""Benchmarks run by hand (`gatehead bench`, `python benchmarks/gpu_branch.py`); none runs in the tests."""
