"""Benchmark scripts by subject; `python -m benchmarks.report` writes benchmarks/README.md."""
