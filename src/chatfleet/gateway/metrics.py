"""The gateway's metrics: plain counters on the hot path, Prometheus text on /metrics.

Nothing here is global: each gateway owns one `GatewayMetrics` and one `CollectorRegistry`.
Histograms are kept as bucket counts (a bisect and two additions per observation, several
observations at once for the chunks of one read), and turned into Prometheus families only
when /metrics is scraped.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

PREFIX = "chatfleet_gateway_"
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0,
                30.0, 60.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5,
               1.0, 2.5)


class Histogram:
    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.bounds = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float, n: int = 1) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += n
        self.sum += value * n
        self.count += n

    def family(self, name: str, doc: str) -> HistogramMetricFamily:
        cum, buckets = 0, []
        for bound, c in zip((*self.bounds, float("inf")), self.counts, strict=True):
            cum += c
            buckets.append(("+Inf" if bound == float("inf") else repr(bound), cum))
        return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=self.sum)


@dataclass(slots=True)
class GatewayMetrics:
    """Counters the gateway bumps; the `gauges` callback reads the live state at scrape time."""

    requests: Counter[str] = field(default_factory=Counter)  # by outcome
    shed: Counter[str] = field(default_factory=Counter)  # by reason
    upstream_failures: Counter[str] = field(default_factory=Counter)  # by replica
    ejections: Counter[str] = field(default_factory=Counter)  # by replica
    retries: int = 0
    requeues: int = 0  # failed before the first byte, back to admission
    client_disconnects: int = 0
    prefix_mismatches: int = 0
    reloads: int = 0
    slow_clients: int = 0  # cut off: more than 1 MiB of their answer unread
    stalled_clients: int = 0  # cut off: nothing of their answer read for client_read_s
    state_failures: int = 0  # times the shared store stopped answering
    chunks: int = 0
    client_connections: int = 0  # open now (gateway/connections.py)
    connections_closed: Counter[str] = field(default_factory=Counter)  # by the guard, by reason
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    itl: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))

    def count(self, outcome: str, *, cut_off: str | None = None) -> None:
        """How one request ended (the relay's Outcome): the one place requests are counted.
        A cancelled request's client went away, or was cut off for not reading (`cut_off`:
        "buffer", more than 1 MiB of its answer unread; "stalled", nothing read for
        timeouts.client_read_s)."""
        outcome = str(outcome)
        self.requests[outcome] += 1
        if outcome == "cancelled":
            self.client_disconnects += 1
            if cut_off == "buffer":
                self.slow_clients += 1
            elif cut_off == "stalled":
                self.stalled_clients += 1

    def client_left(self) -> None:
        """A request whose client went away before it reached the relay (while sending its
        body): the same count as the relay's cancelled outcome."""
        self.count("cancelled")


@dataclass(frozen=True, slots=True)
class Gauges:
    queue_depth: int
    in_flight: dict[str, int]
    caps: dict[str, int]
    shares: dict[str, int]  # this gateway's share of each cap (the cap itself, alone)
    healthy: dict[str, bool]
    sessions: int
    routes: dict[str, int]  # admissions by routing rule (core.fleet.Fleet.num_routes)
    state_up: int = 1  # 0 while the shared store is unreachable
    others: dict[str, int] = field(default_factory=dict)  # slots other gateways hold
    session_bytes: int = 0  # the session table's size, as core/fleet/session.py counts it
    # per replica: the reserve its queued requests' deadlines keep (learned, or configured),
    # and the admission -> first byte samples in its window
    reserves: dict[str, float] = field(default_factory=dict)
    reserve_samples: dict[str, int] = field(default_factory=dict)


class _Collector:
    def __init__(self, m: GatewayMetrics, gauges: Callable[[], Gauges]) -> None:
        self.m = m
        self.gauges = gauges

    def collect(self) -> Iterator[Metric]:
        m, g = self.m, self.gauges()
        for name, label, values, doc in (
            ("requests", "outcome", m.requests, "Requests by outcome (ok, shed, error, "
             "cancelled, timeout, rejected)."),
            ("shed", "reason", m.shed, "Requests shed, by reason: 429 (503 for no_replica)."),
            ("routes", "rule", g.routes, "Admissions by routing rule: hit (the session's "
             "home), spill (elsewhere), least_loaded (no session)."),
            ("upstream_failures", "replica", m.upstream_failures,
             "Failed exchanges with a replica."),
            ("ejections", "replica", m.ejections, "Times a replica was ejected."),
            ("connections_closed", "reason", m.connections_closed, "Client connections the "
             "gateway closed: idle (no request for timeouts.client_idle_s), header (a request "
             "head slower than timeouts.client_header_s), evicted (the idlest, to make room "
             "at max_connections), refused (503: at max_connections, none idle)."),
        ):
            c = CounterMetricFamily(PREFIX + name, doc, labels=[label])
            for k, v in sorted(values.items()):
                c.add_metric([k], v)
            yield c
        for name, value, doc in (
            ("retries", m.retries, "Requests retried on another replica before a byte."),
            ("requeued", m.requeues, "Requests that failed at a replica before the first byte "
             "and went back to admission (retried elsewhere when a slot frees in time)."),
            ("client_disconnects", m.client_disconnects, "Clients that left mid-request."),
            ("prefix_mismatches", m.prefix_mismatches, "Requests whose prompt prefix differs "
             "from the canonical shared prompt (pass-through mode)."),
            ("config_reloads", m.reloads, "Configuration reloads applied."),
            ("slow_clients", m.slow_clients, "Clients cut off because more than 1 MiB of "
             "their answer sat unread in the gateway."),
            ("stalled_clients", m.stalled_clients, "Clients cut off because they read nothing "
             "of their answer for timeouts.client_read_s while some of it waited in the "
             "gateway (their slot freed, the engine's request aborted)."),
            ("state_failures", m.state_failures, "Times the shared state store stopped "
             "answering (this gateway kept the shares it last had confirmed)."),
            ("chunks", m.chunks, "Stream chunks relayed."),
        ):
            yield CounterMetricFamily(PREFIX + name, doc, value=value)
        yield m.ttft.family(PREFIX + "ttft_seconds", "Time from the request's arrival at the "
                            "gateway to the first chunk of its answer (queueing included).")
        yield m.itl.family(PREFIX + "itl_seconds", "Time between chunks of a stream, as the "
                           "gateway relays them.")
        yield GaugeMetricFamily(PREFIX + "queue_depth", "Requests waiting for a slot.",
                                value=g.queue_depth)
        yield GaugeMetricFamily(PREFIX + "client_connections", "Client connections open.",
                                value=m.client_connections)
        yield GaugeMetricFamily(PREFIX + "sessions", "Live sessions in the session table.",
                                value=g.sessions)
        yield GaugeMetricFamily(PREFIX + "session_bytes", "Bytes the session table holds "
                                "(key bytes + 300 per entry; bounded at 64 MiB).",
                                value=g.session_bytes)
        yield GaugeMetricFamily(PREFIX + "state_up", "1 while the shared state store answers "
                                "(always 1 with --state memory).", value=g.state_up)
        for name, values, doc in (
            ("in_flight", g.in_flight, "Requests in flight per replica."),
            ("cap", g.caps, "Per-replica cap on requests in flight (fleet-wide)."),
            ("share", g.shares, "This gateway's share of each replica's cap: what its own "
             "requests may hold there (the whole cap with --state memory)."),
            ("other_gateways_in_flight", g.others, "Requests other gateways have in flight "
             "per replica (shared state)."),
            ("replica_healthy", {k: int(v) for k, v in g.healthy.items()},
             "1 when the replica takes requests, 0 when ejected or not yet probed."),
            ("reserve_samples", g.reserve_samples, "Admission -> first byte samples in the "
             "replica's learning window."),
        ):
            fam = GaugeMetricFamily(PREFIX + name, doc, labels=["replica"])
            for k, v in sorted(values.items()):
                fam.add_metric([k], v)
            yield fam
        reserve = GaugeMetricFamily(
            PREFIX + "prefill_reserve_seconds", "The part of the TTFT budget a queued request "
            "must have left to be admitted to the replica: its learned admission -> first "
            "byte time (the configured prefill_reserve_s until it has data).",
            labels=["replica"])
        for k, seconds in sorted(g.reserves.items()):
            reserve.add_metric([k], seconds)
        yield reserve


def registry(m: GatewayMetrics, gauges: Callable[[], Gauges]) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(_Collector(m, gauges))
    return reg


def exposition(reg: CollectorRegistry) -> bytes:
    return generate_latest(reg)
