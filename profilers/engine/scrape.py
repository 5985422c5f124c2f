"""The engine's /metrics page (Prometheus text format), read with prometheus_client's parser:
gauges sampled during a load (running and waiting requests: the batch each iteration saw),
and counters and histograms differenced between two scrapes (tokens per iteration, accepted
speculative tokens per position)."""

from __future__ import annotations

from urllib.request import urlopen

from prometheus_client.parser import text_string_to_metric_families

PREFIX = "vllm:"


def scrape(url: str, timeout_s: float = 10.0) -> dict[tuple[str, tuple], float]:
    """The server's /metrics page, parsed (see `parse`)."""
    with urlopen(f"{url}/metrics", timeout=timeout_s) as page:
        return parse(page.read().decode())


def parse(text: str) -> dict[tuple[str, tuple], float]:
    """Every engine sample on a page: (name without the vllm: prefix, sorted labels but the
    engine's and the model's) -> value."""
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.startswith(PREFIX):
                continue
            labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k not in ("engine", "model_name")))
            samples[(sample.name[len(PREFIX) :], labels)] = sample.value
    return samples


def value(samples: dict, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def difference(after: dict, before: dict, name: str) -> dict[tuple, float]:
    """A counter's or histogram's growth between two scrapes, by label set."""
    return {labels: v - before.get((n, labels), 0.0) for (n, labels), v in after.items() if n == name}


def histogram_counts(after: dict, before: dict, name: str) -> list[tuple[float, int]]:
    """(upper bound, observations in the bucket) of a histogram's growth, buckets in order."""
    cumulative = sorted(
        (float(dict(labels)["le"]), grown) for labels, grown in difference(after, before, f"{name}_bucket").items()
    )
    counts, below = [], 0.0
    for bound, total in cumulative:
        counts.append((bound, int(round(total - below))))
        below = total
    return counts


def accepted_per_position(after: dict, before: dict) -> list[int]:
    """Speculative tokens accepted at each draft position during the load."""
    grown = difference(after, before, "spec_decode_num_accepted_tokens_per_pos_total")
    by_position = {int(dict(labels)["position"]): int(round(v)) for labels, v in grown.items()}
    return [by_position[p] for p in sorted(by_position)]


def speculation_counts(after: dict, before: dict) -> dict:
    """The engine's drafts, draft tokens and tokens accepted at each draft position between two
    scrapes (all zero where it does not speculate)."""
    grown = {
        name: int(value(after, f"spec_decode_num_{name}_total") - value(before, f"spec_decode_num_{name}_total"))
        for name in ("drafts", "draft_tokens")
    }
    return {**grown, "accepted_per_position": accepted_per_position(after, before)}
