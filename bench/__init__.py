"""Benchmarks of the trainers: ``python -m bench.throughput`` (see docs/benchmarks.md)."""
