"""Prometheus text exposition: parse it, query it, fetch it.

The engines (SGLang, vLLM, the simserver) and NVIDIA's DCGM exporter all publish the
Prometheus text format. `parse_prometheus` uses prometheus_client's own parser; where one line
is malformed (an exporter bug should not cost a whole scrape) it falls back to parsing line by
line and skips what it cannot read. Counters appear under their wire names, `_total` included
(`vllm:prefix_cache_queries_total`).
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Literal

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

Agg = Literal["sum", "max", "min", "mean", "first"]


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    labels: Mapping[str, str]
    value: float


@dataclass(slots=True)
class Metrics:
    """The samples of one scrape, by name."""

    by_name: dict[str, list[Sample]] = field(default_factory=dict)
    skipped_lines: int = 0

    def __contains__(self, name: object) -> bool:
        return name in self.by_name

    def __iter__(self) -> Iterator[Sample]:
        for samples in self.by_name.values():
            yield from samples

    def names(self) -> list[str]:
        return sorted(self.by_name)

    def samples(self, name: str, labels: Mapping[str, str] | None = None) -> list[Sample]:
        out = self.by_name.get(name, [])
        if labels:
            out = [s for s in out if all(s.labels.get(k) == v for k, v in labels.items())]
        return [s for s in out if not math.isnan(s.value)]

    def value(self, name: str, labels: Mapping[str, str] | None = None,
              agg: Agg = "sum") -> float | None:
        """The value of `name` over the label sets that match `labels` (a data-parallel engine
        publishes one series per engine or rank: counters and queue lengths add up, usage takes
        the max), or None when the metric is absent."""
        vals = [s.value for s in self.samples(name, labels)]
        if not vals:
            return None
        if agg == "sum":
            return float(sum(vals))
        if agg == "max":
            return float(max(vals))
        if agg == "min":
            return float(min(vals))
        if agg == "mean":
            return float(sum(vals) / len(vals))
        return float(vals[0])

    def first_of(self, names: Iterable[str], labels: Mapping[str, str] | None = None,
                 agg: Agg = "sum") -> float | None:
        """The value of the first of `names` that is present (a current name, then older ones)."""
        for name in names:
            v = self.value(name, labels, agg)
            if v is not None:
                return v
        return None


def _add_families(text: str, out: Metrics) -> None:
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.by_name.setdefault(s.name, []).append(
                Sample(s.name, dict(s.labels), float(s.value)))


@functools.lru_cache(maxsize=32)
def _sample_lines(names: frozenset[str]) -> re.Pattern[str]:
    alts = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
    return re.compile(rf"^[ \t]*(?:{alts})(?=[{{ \t]).*$", re.MULTILINE)


def select_samples(text: str, names: Collection[str]) -> str:
    """The sample lines of `text` whose metric name is one of `names`, comments dropped (a
    sample keeps its wire name: a counter's `_total` is part of it). One regular-expression
    pass: an engine's page holds hundreds of histogram lines the harness never reads, and
    prometheus_client's parser costs about 15 us a line on the harness's event loop."""
    if not names:
        return ""
    found = _sample_lines(frozenset(names)).findall(text)
    return "\n".join(found) + "\n" if found else ""


def parse_prometheus(text: str, names: Collection[str] | None = None) -> Metrics:
    """Parse Prometheus text (only the samples named in `names`, when given). Never raises
    for malformed input: bad lines are counted in `skipped_lines` and left out."""
    if names is not None:
        text = select_samples(text, names)
    out = Metrics()
    try:
        _add_families(text, out)
        return out
    except (ValueError, IndexError, KeyError, TypeError):
        out = Metrics()
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        try:
            _add_families(stripped + "\n", out)
        except (ValueError, IndexError, KeyError, TypeError):
            out.skipped_lines += 1
    return out


class MetricsUnavailable(Exception):
    """The /metrics endpoint could not be read."""


async def fetch_metrics(session: aiohttp.ClientSession, url: str,
                        timeout_s: float = 5.0,
                        names: Collection[str] | None = None) -> Metrics:
    """GET a Prometheus endpoint (the URL as given, or `<base>/metrics` when the URL has no
    path) and parse it (only `names`, when given). Raises MetricsUnavailable with the
    reason."""
    target = metrics_url(url)
    try:
        async with session.get(target, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            body = await resp.text(errors="replace")
            if resp.status != 200:
                raise MetricsUnavailable(f"GET {target}: HTTP {resp.status}: {body[:200]}")
    except (TimeoutError, aiohttp.ClientError, ConnectionError) as exc:
        raise MetricsUnavailable(f"GET {target}: {type(exc).__name__}: {exc}") from exc
    return parse_prometheus(body, names)


def metrics_url(url: str) -> str:
    """`http://host:port` -> `http://host:port/metrics`; a URL with a path is kept."""
    base = url.rstrip("/")
    scheme_sep = base.find("://")
    rest = base[scheme_sep + 3:] if scheme_sep >= 0 else base
    if "/" in rest:
        return base
    return base + "/metrics"
