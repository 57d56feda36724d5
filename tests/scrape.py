"""What Prometheus reads from a text exposition: each family's type, the sets of label names
its series carry and the bounds of its buckets."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

Family = tuple[str, set[frozenset[str]], set[tuple[float, ...]]]


def parsed(text: str) -> dict[str, Family]:
    """Exposed name (a counter's with its ``_total``) -> (type, label-name sets, bucket bound
    lists). A gauge's own ``le`` (SGLang's GaugeHistograms) is one of its labels."""
    out: dict[str, Family] = {}
    for fam in text_string_to_metric_families(text):
        name = fam.name + ("_total" if fam.type == "counter" else "")
        labelsets: set[frozenset[str]] = set()
        bounds: dict[frozenset[tuple[str, str]], list[float]] = {}
        for s in fam.samples:
            labels = {k: v for k, v in s.labels.items() if k not in ("le", "quantile")}
            if fam.type == "gauge" and "le" in s.labels:
                labels["le"] = s.labels["le"]
            labelsets.add(frozenset(labels))
            if s.name.endswith("_bucket") and s.labels["le"] != "+Inf":
                bounds.setdefault(frozenset(labels.items()), []).append(float(s.labels["le"]))
        out[name] = (fam.type, labelsets, {tuple(b) for b in bounds.values()})
    return out
