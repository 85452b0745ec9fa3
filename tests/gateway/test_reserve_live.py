"""The gateway learns each replica's reserve from the first byte of its streams (admission ->
first chunk), shows it on /metrics, and sheds a queued request when its first token would come
too late at the replica it waits for (issue 23, item 1)."""

from __future__ import annotations

import re
import time

import pytest
import requests

from tests.gateway.conftest import HTTP_TIMEOUT, Fake, gateway, gateway_config
from tests.gateway.test_relay import chat, in_background
from tests.waiting import wait_for

pytestmark = pytest.mark.timeout(120)


def gauge(page: str, name: str, replica: str) -> float:
    m = re.search(rf'^chatfleet_gateway_{name}{{replica="{replica}"}} (\S+)$', page, re.M)
    assert m is not None, name
    return float(m.group(1))


def test_first_bytes_teach_the_reserve_and_a_late_queued_request_is_shed_early(
        fakes2: list[Fake]) -> None:
    """One replica whose first chunk comes 0.3 s after the request reaches it. After three
    streams the learned reserve is about 0.3 s: a request queued behind a long stream is shed
    at about arrival + 1 - 0.3 s, where the configured reserve (0) would have kept it until
    arrival + 1 s and sent it to miss the target."""
    cfg = gateway_config([fakes2[0].url], cap=1, queue_depth=4, ttft_budget_s=1.0,
                         reserve={"min_samples": 3, "percentile": 100})
    with gateway(cfg) as g:
        page = requests.get(g.url + "/metrics", timeout=HTTP_TIMEOUT).text
        assert gauge(page, "prefill_reserve_seconds", "f0") == 0.0  # the prior: no data
        for _ in range(3):
            assert chat(g.url, {"head_delay_s": 0.3, "chunks": 2}).status_code == 200
        page = requests.get(g.url + "/metrics", timeout=HTTP_TIMEOUT).text
        learned = gauge(page, "prefill_reserve_seconds", "f0")
        assert 0.29 <= learned <= 0.5, learned
        assert gauge(page, "reserve_samples", "f0") == 3
        fake = fakes2[0]
        busy = in_background(g.url, {"chunks": 60, "gap_s": 0.05},
                             until=lambda: fake.in_flight == 1)
        t0 = time.monotonic()
        r = chat(g.url, {"chunks": 2})
        waited = time.monotonic() - t0
        busy.join()
        assert r.status_code == 429 and r.json()["error"]["code"] == "deadline"
        # shed at arrival + 1 - learned (0.6-0.71 s): before the fix, at arrival + 1 s
        assert 1.0 - learned - 0.05 <= waited < 0.95, (waited, learned)


def test_a_whole_answer_teaches_nothing(fakes2: list[Fake]) -> None:
    """A non-streamed answer's first byte comes when the answer is done: not a prefill time."""
    cfg = gateway_config([fakes2[0].url], reserve={"min_samples": 1})
    with gateway(cfg) as g:
        assert chat(g.url, {"chunks": 3}, stream=False).status_code == 200
        assert chat(g.url, {"chunks": 3}).status_code == 200
        est = g.gateway.fleet.ac.reserves()["f0"]
        assert wait_for(lambda: est.num_observed >= 1)
        time.sleep(0.1)
        assert est.num_observed == 1
