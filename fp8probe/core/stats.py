"""Statistics shared by every layer: rank agreement (Spearman's rho, top-k overlap)."""

from __future__ import annotations


def spearman(a, b) -> float:
    """Spearman's rank correlation of two equal-length sequences (average ranks for ties)."""
    import pandas as pd

    sa, sb = pd.Series(list(a), dtype=float), pd.Series(list(b), dtype=float)
    return float(sa.rank().corr(sb.rank()))


def top_overlap(a: dict[str, float], b: dict[str, float], k: int = 10) -> int:
    """How many of the k highest-scoring keys of `a` are among the k highest of `b`."""
    ta = sorted(a, key=a.get, reverse=True)[:k]
    tb = set(sorted(b, key=b.get, reverse=True)[:k])
    return sum(1 for x in ta if x in tb)

