"""Harnesses that check fp8probe against independent references (vLLM itself); used by tests/ and benchmarks/,
not part of the public API."""
