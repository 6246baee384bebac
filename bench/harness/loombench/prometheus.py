"""Prometheus text parsing and before/after differences of `loom serve` /metrics.

A scrape is {(name, labels): value} where labels is a sorted tuple of
(key, value) pairs, so `("loom_kv_cache_bytes", (("kind", "base"), ("tier", "device")))`.
The model_name label (vLLM's, on every sample) is dropped: one server serves
one model, and lookups go by the labels that tell its series apart.
"""
import math
import re
from typing import Dict, List, Optional, Tuple

Labels = Tuple[Tuple[str, str], ...]
Samples = Dict[Tuple[str, Labels], float]

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\d+)?$')
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_DROPPED_LABELS = {"model_name"}


def _parse_labels(text: str) -> Labels:
    labels, position = [], 0
    while position < len(text):
        match = _LABEL.match(text, position)
        if not match:
            raise ValueError(f"bad label set {{{text}}}")
        value = match.group(2).replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
        if match.group(1) not in _DROPPED_LABELS:
            labels.append((match.group(1), value))
        position = match.end()
    return tuple(sorted(labels))


def parse(text: str) -> Samples:
    """Samples of a Prometheus text exposition; comments and blank lines skipped."""
    samples: Samples = {}
    for line_number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if not match:
            raise ValueError(f"/metrics line {line_number}: cannot parse {line!r}")
        value_text = match.group(4)
        value = {"+Inf": math.inf, "-Inf": -math.inf, "NaN": math.nan}.get(value_text)
        samples[(match.group(1), _parse_labels(match.group(3) or ""))] = (
            float(value_text) if value is None else value)
    return samples


def value(samples: Samples, name: str, **labels: str) -> Optional[float]:
    """The sample with exactly `labels` if there is one (so an unlabelled
    total wins over its per-mode breakdown), else the sum over label sets that
    contain `labels` (value(s, "loom_kv_cache_bytes", tier="device") adds base
    and residual)."""
    exact = samples.get((name, tuple(sorted(labels.items()))))
    if exact is not None:
        return exact
    wanted = set(labels.items())
    found = [v for (sample_name, sample_labels), v in samples.items()
             if sample_name == name and wanted <= set(sample_labels)]
    return sum(found) if found else None


def delta(before: Samples, after: Samples, name: str, **labels: str) -> Optional[float]:
    """Counter increase between two scrapes (None if the metric is absent)."""
    end = value(after, name, **labels)
    if end is None:
        return None
    start = value(before, name, **labels) or 0.0
    return end - start


def histogram(samples: Samples, name: str) -> Tuple[List[Tuple[float, float]], float, float]:
    """(cumulative buckets [(upper bound, count)] sorted, sum, count) of a histogram."""
    buckets = sorted((float(dict(labels)["le"]), v) for (sample_name, labels), v in samples.items()
                     if sample_name == name + "_bucket")
    return buckets, value(samples, name + "_sum") or 0.0, value(samples, name + "_count") or 0.0


class HistogramDelta:
    """Observations a histogram received between two scrapes."""

    def __init__(self, before: Samples, after: Samples, name: str):
        end_buckets, end_sum, end_count = histogram(after, name)
        start_buckets, start_sum, start_count = histogram(before, name)
        start = dict(start_buckets)
        self.buckets = [(bound, count - start.get(bound, 0.0)) for bound, count in end_buckets]
        self.sum = end_sum - start_sum
        self.count = end_count - start_count
        self.present = bool(end_buckets) or end_count > 0

    def mean(self) -> Optional[float]:
        return self.sum / self.count if self.count > 0 else None

    def quantile(self, q: float) -> Optional[float]:
        """Prometheus histogram_quantile: linear within the bucket that holds
        rank q*count (q in [0, 1]); the last finite bound if it falls in +Inf."""
        if self.count <= 0 or not self.buckets:
            return None
        rank = q * self.count
        previous_bound, previous_count = 0.0, 0.0
        for bound, count in self.buckets:
            if count >= rank:
                if math.isinf(bound):
                    return previous_bound
                if count == previous_count:
                    return bound
                return previous_bound + (bound - previous_bound) * (rank - previous_count) / (count - previous_count)
            previous_bound, previous_count = bound, count
        return previous_bound
