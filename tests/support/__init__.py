"""Helpers the tests and the benchmarks share (a real server on free ports, a recording sink)."""
