"""Admission, keys, admin, reload and the shared prompt through the live gateway."""

from __future__ import annotations

import concurrent.futures
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chatfleet.core.fleet.routing import rendezvous_top
from chatfleet.gateway.config import hash_key
from tests.gateway.conftest import Fake, fake_replicas, gateway, gateway_config
from tests.gateway.test_relay import chat, in_background
from tests.waiting import wait_for

pytestmark = pytest.mark.timeout(180)

ADMIN, ALICE, BOB = "admin-key-123", "sk-alice-456", "sk-bob-789"


def test_above_the_queue_requests_are_shed_with_retry_after(fakes2: list[Fake]) -> None:
    cfg = gateway_config([fakes2[0].url], names=["f0"], cap=1, queue_depth=1,
                         ttft_budget_s=30)
    with gateway(cfg) as g:
        first = in_background(g.url, {"chunks": 40, "gap_s": 0.02},
                              lambda: g.gateway.fleet.ac.in_flight("f0") == 1)
        second = in_background(g.url, {"chunks": 1},
                               lambda: g.gateway.fleet.ac.queue_depth() == 1)
        r = chat(g.url, {"chunks": 1})
        assert r.status_code == 429
        assert r.json()["error"]["code"] == "queue_full"
        seconds, ms = int(r.headers["Retry-After"]), int(r.headers["retry-after-ms"])
        assert 1 <= seconds <= 60 and seconds * 1000 >= ms >= 1000
        first.join(30)
        second.join(30)
        assert fakes2[0].max_in_flight == 1
        assert g.gateway.metrics.shed["queue_full"] == 1


def test_a_request_queued_past_its_deadline_is_shed_not_sent(fakes2: list[Fake]) -> None:
    cfg = gateway_config([fakes2[0].url], names=["f0"], cap=1, queue_depth=8,
                         ttft_budget_s=0.3)
    with gateway(cfg) as g:
        first = in_background(g.url, {"chunks": 50, "gap_s": 0.02},
                              lambda: g.gateway.fleet.ac.in_flight("f0") == 1)
        t0 = time.monotonic()
        r = chat(g.url, {"chunks": 1})
        waited = time.monotonic() - t0
        assert r.status_code == 429 and r.json()["error"]["code"] == "deadline"
        assert 0.25 <= waited < 1.0
        assert "Retry-After" in r.headers
        first.join(30)
        assert fakes2[0].started == 1  # the shed request never reached the replica


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**31 - 1), cap=st.integers(1, 3))
def test_the_cap_holds_under_concurrency_in_any_arrival_order(seed: int, cap: int) -> None:
    """Random bursts of sessions, lengths and delays: no replica ever has more than `cap`
    requests in flight (counted at the replica), and every request ends ok or shed."""
    rng = random.Random(seed)
    with fake_replicas(2) as fakes:
        cfg = gateway_config([f.url for f in fakes], cap=cap, queue_depth=4, ttft_budget_s=5)
        with gateway(cfg) as g:
            def one(i: int) -> int:
                time.sleep(rng.random() * 0.2)
                sid = {"X-Session-ID": f"s{rng.randrange(6)}"} if rng.random() < 0.7 else {}
                return chat(g.url, {"chunks": rng.randrange(1, 6), "gap_s": 0.01},
                            headers=sid, stream=rng.random() < 0.8).status_code

            with concurrent.futures.ThreadPoolExecutor(16) as pool:
                codes = list(pool.map(one, range(24)))
        assert set(codes) <= {200, 429}
        assert all(f.max_in_flight <= cap for f in fakes)
        assert sum(f.completed for f in fakes) == codes.count(200)


def keyed_config(urls: list[str], tmp: Path, **extra: Any) -> tuple[Path, dict[str, Any]]:
    raw: dict[str, Any] = {
        "replicas": [{"name": f"f{i}", "url": u} for i, u in enumerate(urls)],
        "cap": 4, "queue_depth": 4, "ttft_budget_s": 10,
        "keys": [{"name": "alice", "sha256": hash_key(ALICE), "max_concurrent": 1},
                 {"name": "bob", "sha256": hash_key(BOB)}],
        "admin": {"sha256": hash_key(ADMIN)},
        "health": {"probe_interval_s": 0.2}, **extra}
    path = tmp / "gateway.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path, raw


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_keys_limits_and_admin(fakes2: list[Fake], tmp_path: Path) -> None:
    from chatfleet.gateway.config import Overrides, load_config

    path, _ = keyed_config([f.url for f in fakes2], tmp_path)
    assert ALICE not in path.read_text()  # keys are stored hashed
    cfg = Overrides().apply(load_config(path))
    with gateway(cfg, config_path=path) as g:
        assert chat(g.url).status_code == 401
        assert chat(g.url, headers=auth("sk-wrong")).status_code == 401
        assert chat(g.url, headers=auth(BOB)).status_code == 200
        # alice may have one request at a time
        t = in_background(g.url, {"chunks": 40, "gap_s": 0.02},
                          lambda: g.gateway.fleet.ac.key_count("alice") == 1, auth(ALICE))
        r = chat(g.url, headers=auth(ALICE))
        assert r.status_code == 429 and r.json()["error"]["code"] == "key_limit"
        assert "Retry-After" in r.headers
        assert chat(g.url, headers=auth(BOB)).status_code == 200  # bob is not limited
        t.join(30)
        # admin
        a = g.url + "/admin"
        assert requests.get(a + "/replicas", timeout=5, headers=auth(BOB)).status_code == 401
        reps = requests.get(a + "/replicas", timeout=5, headers=auth(ADMIN)).json()
        assert [x["name"] for x in reps["replicas"]] == ["f0", "f1"]
        r = requests.put(a + "/limits", json={"caps": {"f0": 2}, "keys": {"alice": 3}},
                         headers=auth(ADMIN), timeout=5)
        assert r.status_code == 200 and r.json()["caps"] == {"f0": 2, "f1": 4}
        assert g.gateway.fleet.ac.cap("f0") == 2
        for bad in ({"caps": {"nope": 1}}, {"cap": -1}, {"keys": {"alice": 0}}, {"x": 1}):
            r = requests.put(a + "/limits", json=bad, headers=auth(ADMIN), timeout=5)
            assert r.status_code == 400, bad
        assert requests.delete(a + "/replicas/nope", headers=auth(ADMIN),
                               timeout=5).status_code == 404


def test_a_reload_changes_limits_without_dropping_a_stream(fakes2: list[Fake],
                                                           tmp_path: Path) -> None:
    from chatfleet.gateway.config import Overrides, load_config

    path, raw = keyed_config([f.url for f in fakes2], tmp_path)
    cfg = Overrides().apply(load_config(path))
    with gateway(cfg, config_path=path) as g:
        box: dict[str, requests.Response] = {}
        t = threading.Thread(target=lambda: box.setdefault("r", chat(
            g.url, {"chunks": 100, "gap_s": 0.02}, headers=auth(BOB))))
        t.start()
        assert wait_for(lambda: sum(f.in_flight for f in fakes2) == 1)
        raw["cap"] = 0  # every replica closed to new requests, the running stream untouched
        raw["replicas"] = raw["replicas"][:1] if fakes2[0].in_flight else raw["replicas"][1:]
        path.write_text(yaml.safe_dump(raw))
        assert wait_for(lambda: g.gateway.metrics.reloads >= 1, 5)
        assert all(c == 0 for c in g.gateway.fleet.gauges().caps.values())
        # a bad file is refused and the running configuration kept
        path.write_text("cap: [oops")
        r = requests.post(g.url + "/admin/reload", headers=auth(ADMIN), timeout=5)
        assert r.status_code == 400 and "not reloaded" in r.json()["error"]["message"]
        t.join(30)
        resp = box["r"]
        assert resp.status_code == 200 and resp.text.endswith("data: [DONE]\n\n")
        assert resp.text.count("data: ") == 102


def test_only_a_lost_replicas_sessions_move(tmp_path: Path) -> None:
    with fake_replicas(3) as fakes:
        path, _ = keyed_config([f.url for f in fakes], tmp_path)
        from chatfleet.gateway.config import Overrides, load_config

        cfg = Overrides().apply(load_config(path))
        with gateway(cfg, config_path=path) as g:
            sessions = [f"user-{i}" for i in range(30)]

            def place() -> None:
                for s in sessions:
                    r = chat(g.url, {"chunks": 1, "gap_s": 0},
                             headers={**auth(BOB), "X-Session-ID": s})
                    assert r.status_code == 200

            def homes() -> dict[str, str]:
                router = g.gateway.fleet.router
                assert router is not None
                now = g.gateway.loop.time()
                out = {}
                for s in sessions:
                    entry = router.sessions.get(f"sid:{s}", now)
                    assert entry is not None
                    out[s] = entry.replica
                return out

            place()
            before = homes()
            assert set(before.values()) == {"f0", "f1", "f2"}
            assert all(before[s] == rendezvous_top(f"sid:{s}", ["f0", "f1", "f2"])
                       for s in sessions)
            r = requests.delete(g.url + "/admin/replicas/f1", headers=auth(ADMIN), timeout=5)
            assert r.status_code == 200
            place()
            after = homes()
            for s in sessions:
                if before[s] != "f1":
                    assert after[s] == before[s]
                else:
                    assert after[s] in ("f0", "f2")
            # f1 comes back: the sessions that moved stay where their cache now is
            r = requests.post(g.url + "/admin/replicas", json={"name": "f1",
                              "url": fakes[1].url}, headers=auth(ADMIN), timeout=5)
            assert r.status_code == 201
            place()
            assert homes() == after


def test_own_mode_puts_the_shared_prompt_first_byte_identical(fakes2: list[Fake]) -> None:
    tools = [{"type": "function", "function": {"name": "search", "parameters": {}}},
             {"type": "function", "function": {"name": "calc", "parameters": {}}}]
    cfg = gateway_config([fakes2[0].url], names=["f0"], shared_prompt={
        "mode": "own", "system": "You are the product.", "tools": tools})
    with gateway(cfg) as g:
        client_tool = {"type": "function", "function": {"name": "mine", "parameters": {}}}
        chat(g.url, {"chunks": 1}, tools=[client_tool, tools[1]])
        chat(g.url, {"chunks": 1}, messages=[{"role": "system", "content": "You are the "
             "product."}, {"role": "user", "content": "other"}])
        b1, b2 = fakes2[0].bodies
        assert b1["messages"][0] == {"role": "system", "content": "You are the product."}
        assert b2["messages"][0] == b1["messages"][0] and len(b2["messages"]) == 2
        assert [t["function"]["name"] for t in b1["tools"]] == ["search", "calc", "mine"]
        assert b2["tools"] == tools


def test_pass_through_flags_a_per_request_timestamp(fakes2: list[Fake]) -> None:
    """With debug_headers on (off, the header would be an oracle on the shared prompt:
    test_hostile_clients.py); the metric counts either way."""
    cfg = gateway_config([fakes2[0].url], names=["f0"], debug_headers=True, shared_prompt={
        "mode": "pass-through", "system": "You are the product."})
    with gateway(cfg) as g:
        ok = chat(g.url, {"chunks": 1}, messages=[
            {"role": "system", "content": "You are the product."},
            {"role": "user", "content": "q"}])
        assert ok.headers["x-chatfleet-prefix"] == "match"
        bad = chat(g.url, {"chunks": 1}, messages=[
            {"role": "system", "content": "You are the product. Now: 2026-11-30T18:00:01"},
            {"role": "user", "content": "q"}])
        assert bad.status_code == 200
        assert bad.headers["x-chatfleet-prefix"].startswith("mismatch; offset=")
        assert g.gateway.metrics.prefix_mismatches == 1
        metrics = requests.get(g.url + "/metrics", timeout=5).text
        assert "chatfleet_gateway_prefix_mismatches_total 1.0" in metrics
        # the body went upstream unchanged
        assert fakes2[0].bodies[-1]["messages"][0]["content"].endswith("18:00:01")
