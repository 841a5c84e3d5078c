"""Every benchmark imports at HEAD (#74): a refactor that renames what one imports at the top fails here, in the fast
suite, instead of on the day someone runs it (a benchmark once crashed so because nothing imported it). Those with a
fast test of their own run at a toy size there (kv_map, budget_coverage, damage, pricing, attribution, ...)."""

from pathlib import Path

import pytest
from conftest import benchmark

NAMES = sorted(p.stem for p in (Path(__file__).parent.parent / "benchmarks").glob("*.py"))


@pytest.mark.parametrize("name", NAMES)
def test_each_benchmark_imports(name):
    module = benchmark(name)
    assert module.__doc__, f"benchmarks/{name}.py says nothing about what it measures"
    assert callable(getattr(module, "main", None)) or name in LIBRARIES, f"benchmarks/{name}.py has no main()"


LIBRARIES = {"attribution", "damage", "evolve", "pricing", "search_prompts"}  # imported by other benchmarks
