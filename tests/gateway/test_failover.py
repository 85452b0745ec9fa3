"""A replica that is down or failing: requests that fail before the first byte go back to
admission (never a 502 while the fleet only lacks room), a replica takes no request before
its first successful probe, and with none up the answer is 503 with a Retry-After."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest
import requests

from chatfleet.core.fleet.fleet import FleetTrace, replay
from chatfleet.gateway.admission import DecisionLog, fleet_settings
from chatfleet.gateway.app import step_time_for
from chatfleet.gateway.config import hash_key
from tests.gateway.conftest import (
    HTTP_TIMEOUT,
    Fake,
    fake_replicas,
    free_port,
    gateway,
    gateway_config,
)
from tests.gateway.test_relay import chat
from tests.waiting import wait_for

pytestmark = pytest.mark.timeout(120)

ADMIN = "admin-key-123"


def burst(url: str, n: int, fake: dict[str, Any], prefix: str) -> list[requests.Response]:
    """n requests at once, one session each; their answers in order."""
    out: list[requests.Response | None] = [None] * n

    def one(i: int) -> None:
        out[i] = chat(url, fake, headers={"X-Session-ID": f"{prefix}{i}"})

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(HTTP_TIMEOUT + 5)
    assert all(r is not None for r in out)
    return [r for r in out if r is not None]


@pytest.mark.parametrize("failure", ["refused", "500"])
def test_requests_failed_before_the_first_byte_wait_for_room_never_502(
        fakes2: list[Fake], failure: str) -> None:
    """Two replicas of cap 2: `bad` fails every request before a byte, `good` is at its cap
    with 12 users arriving at once. A failed request waits in the queue (its deadline
    unchanged) for a slot at `good`: it completes, or is shed with 429 + Retry-After."""
    bad, good = fakes2
    cfg = gateway_config([bad.url, good.url], names=["bad", "good"], cap=2, queue_depth=16,
                         ttft_budget_s=2.0,
                         # probes far apart and a high ejection threshold: bad keeps taking
                         # (and failing) requests for the whole burst
                         health={"probe_interval_s": 30.0, "eject_after_failures": 100,
                                 "readmit_after_successes": 1})
    log, calls, step_time = DecisionLog(), FleetTrace(), step_time_for(cfg)
    with gateway(cfg, decisions=log, fleet_trace=calls, step_time=step_time) as g:
        assert g.gateway.fleet.replicas["bad"].serving  # it passed its start-up probe
        if failure == "refused":
            bad.stop()
        else:
            bad.mode = "error"  # 500 before a byte; /health still answers 200
        answers = burst(g.url, 12, {"chunks": 6, "gap_s": 0.05}, "u")
        m = g.gateway.metrics
        statuses = Counter(r.status_code for r in answers)
        assert set(statuses) <= {200, 429}, statuses
        for r in answers:
            if r.status_code == 429:
                assert int(r.headers["Retry-After"]) >= 1
                assert int(r.headers["retry-after-ms"]) >= 1
            else:
                assert r.text.endswith("data: [DONE]\n\n")
        # some requests failed at bad and went back to the queue; some of those made it
        assert m.requeues >= 1 and m.retries >= 1
        assert m.upstream_failures["bad"] == m.requeues
        assert m.requests["error"] == 0 and m.requests["shed"] == statuses[429]
        # the healthy replica's own count: never more than its cap at once
        assert good.max_in_flight <= 2
        assert good.completed == statuses[200] >= 2
        assert bad.completed == 0
    # the requeues are core calls: the trace replays to the live decisions, one for one
    assert any(name == "requeue" for _, name, *_ in calls.calls)
    again = [(d.request.request_id, d.outcome, d.replica)
             for d in replay(calls, {}, fleet_settings(cfg), step_time)]
    assert again == [(row.request_id, row.outcome, row.replica) for row in log.rows]


def test_a_replica_takes_no_request_before_its_first_successful_probe(
        fakes2: list[Fake]) -> None:
    """`late` is not up when the gateway starts (a vLLM still loading): requests go to `up`
    only; once `late` listens, it takes requests after its first probe, not before."""
    up = fakes2[0]
    port = free_port()
    cfg = gateway_config([f"http://127.0.0.1:{port}", up.url], names=["late", "up"],
                         debug_headers=True)
    with gateway(cfg) as g:
        ready = requests.get(g.url + "/ready", timeout=5).json()
        assert ready == {"ready": True, "serving": ["up"], "ejected": [], "pending": ["late"]}
        for i in range(8):  # sessions whose home would be `late` included
            r = chat(g.url, {"chunks": 1}, headers={"X-Session-ID": f"a{i}"})
            assert r.status_code == 200 and r.headers["x-chatfleet-replica"] == "up"
        m = g.gateway.metrics
        assert m.requeues == 0 and m.upstream_failures["late"] >= 1  # its probes failed
        with fake_replicas(1, ports=[port]) as [late]:
            assert wait_for(lambda: g.gateway.fleet.replicas["late"].serving)
            seen: set[str] = set()
            for i in range(12):
                r = chat(g.url, {"chunks": 1}, headers={"X-Session-ID": f"b{i}"})
                assert r.status_code == 200
                seen.add(r.headers["x-chatfleet-replica"])
            assert seen == {"late", "up"}
            assert late.probed_at and late.requests_at
            assert min(late.requests_at) > min(late.probed_at)


def test_a_replica_added_at_run_time_waits_for_its_first_probe(fakes2: list[Fake]) -> None:
    up = fakes2[0]
    port = free_port()
    cfg = gateway_config([up.url], names=["up"], debug_headers=True,
                         admin={"sha256": hash_key(ADMIN)})
    auth = {"Authorization": f"Bearer {ADMIN}"}
    with gateway(cfg) as g:
        r = requests.post(g.url + "/admin/replicas", headers=auth, timeout=5,
                          json={"name": "new", "url": f"http://127.0.0.1:{port}"})
        assert r.status_code == 201
        new = next(x for x in r.json()["replicas"] if x["name"] == "new")
        assert new["pending"] and not new["serving"] and not new["ejected"]
        for i in range(8):
            r = chat(g.url, {"chunks": 1}, headers={"X-Session-ID": f"a{i}"})
            assert r.status_code == 200 and r.headers["x-chatfleet-replica"] == "up"
        with fake_replicas(1, ports=[port]) as [late]:
            assert wait_for(lambda: g.gateway.fleet.replicas["new"].serving)
            seen = {chat(g.url, {"chunks": 1}, headers={"X-Session-ID": f"b{i}"})
                    .headers["x-chatfleet-replica"] for i in range(12)}
            assert seen == {"new", "up"}
            assert min(late.requests_at) > min(late.probed_at)


def test_with_no_replica_up_the_answer_is_503_with_retry_after() -> None:
    port = free_port()
    cfg = gateway_config([f"http://127.0.0.1:{port}"], names=["only"])
    with gateway(cfg) as g:
        r = chat(g.url, {"chunks": 1})
        assert r.status_code == 503
        assert r.json()["error"]["code"] == "no_replica"
        assert int(r.headers["Retry-After"]) >= 1 and int(r.headers["retry-after-ms"]) >= 1
        assert requests.get(g.url + "/ready", timeout=5).status_code == 503
        assert g.gateway.metrics.shed["no_replica"] == 1
        assert g.gateway.metrics.requests["error"] == 1
        with fake_replicas(1, ports=[port]) as [only]:
            assert wait_for(lambda: requests.get(g.url + "/ready", timeout=5).status_code
                            == 200)
            assert chat(g.url, {"chunks": 1}).status_code == 200
            assert min(only.requests_at) > min(only.probed_at)
