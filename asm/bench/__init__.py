"""Benchmarks against cuBLAS, performance baselines, and the autotuner with its cache."""
