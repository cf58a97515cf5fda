"""Reading a /metrics scrape: Prometheus text → each sample name's value summed over its label sets."""

from __future__ import annotations

from collections import defaultdict

from prometheus_client.parser import text_string_to_metric_families


def totals(text: str) -> dict[str, float]:
    """Sample name (with its _total/_count/_bucket suffix) → the sum over its label sets, as `sum(name)` in a
    dashboard: unlabelled and labelled series read alike. Histogram buckets sum per bound too, so read those
    through the families instead."""
    out: dict[str, float] = defaultdict(float)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name] += sample.value
    return dict(out)


def labelled(text: str, name: str, **labels: str) -> float:
    """The sum of sample `name` over the label sets that carry these labels (e.g. one `source` of a counter)."""
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()))
