"""Benchmarks, one script per question; each module's docstring says what it measures and how to run it."""
