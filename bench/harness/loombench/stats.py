"""Percentiles and latency summaries of client-side measurements."""
import math
from typing import Dict, Iterable, Optional, Sequence


def percentile(values: Iterable[float], q: float) -> Optional[float]:
    """The q-th percentile (q in [0, 100]) with linear interpolation between
    closest ranks (numpy's default "linear" method); None for no values."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be in [0, 100], got {q}")
    ordered = sorted(values)
    if not ordered:
        return None
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def mean(values: Sequence[float]) -> Optional[float]:
    return sum(values) / len(values) if values else None


def summarize(values: Sequence[float], prefix: str) -> Dict[str, Optional[float]]:
    """{prefix_p50_s, prefix_p95_s, prefix_p99_s, prefix_mean_s} of latencies in seconds."""
    return {f"{prefix}_p50_s": percentile(values, 50), f"{prefix}_p95_s": percentile(values, 95),
            f"{prefix}_p99_s": percentile(values, 99), f"{prefix}_mean_s": mean(values)}


def ratio(numerator: Optional[float], denominator: Optional[float]) -> Optional[float]:
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator
