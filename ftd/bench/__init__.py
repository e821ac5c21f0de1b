"""Benchmarks behind ``ftd bench NAME``: each returns a JSON-able dict of its figures."""
