"""`chatfleet cache --shape bench-multiturn`: the shape of SGLang's bench_multiturn.py (its
tokens, its request loop with the round barrier) and the hit rates per round it reports."""

from __future__ import annotations

import itertools
import json
import random
from typing import Any

import pytest
from typer.testing import CliRunner

from chatfleet.cli.app import app
from chatfleet.core.cache.multiturn import (
    POLL_S,
    MultiturnConfig,
    MultiturnSender,
    multiturn_trace,
)
from chatfleet.core.cache.trace import common_prefix_len
from chatfleet.core.errors import ChatfleetError

runner = CliRunner()


# ----- the trace -----


def test_each_round_is_the_history_and_a_new_question_and_clients_share_nothing() -> None:
    cfg = MultiturnConfig(clients=3, rounds=4, request_tokens=50, answer_tokens=7)
    turns = multiturn_trace(cfg)
    assert len(turns) == 12
    by = {(t.session, t.turn): t for t in turns}
    for c in range(3):
        for r in range(1, 5):
            t = by[(f"c{c}", r)]
            assert t.prompt_len == 50 * r + 7 * (r - 1) == cfg.prompt_tokens(r)
            assert t.output_len == 7
            if r > 1:  # the previous prompt and its whole answer, then 50 new tokens
                prev = by[(f"c{c}", r - 1)]
                assert t.prompt[: prev.prompt_len + 7] == prev.prompt + prev.output
    firsts = [by[(f"c{c}", 1)].prompt for c in range(3)]
    assert all(common_prefix_len(a, b) == 0 for a in firsts for b in firsts if a is not b)


# ----- the request loop -----


class Service:
    """Drives a sender as the replay does, each request taking `service_s` once sent:
    returns every send as (time, client, round)."""

    def __init__(self, cfg: MultiturnConfig, service_s: float, seed: int = 1) -> None:
        self.cfg = cfg
        self.turns = multiturn_trace(cfg)
        first = [i for i, t in enumerate(self.turns) if t.turn == 1]
        self.sender = MultiturnSender(cfg, first, random.Random(seed))
        self.service_s = service_s

    def run(self) -> list[tuple[float, str, int]]:
        index = {(t.session, t.turn): i for i, t in enumerate(self.turns)}
        sends: list[tuple[float, str, int]] = []
        finishes: list[tuple[float, int]] = []  # (time, trace index)
        in_flight_max = 0
        for _ in range(100_000):
            look = self.sender.next_look()
            if finishes and (look is None or min(finishes)[0] <= look):
                finishes.sort()
                now, i = finishes.pop(0)
                t = self.turns[i]
                self.sender.done(now)
                nxt = index.get((t.session, t.turn + 1))
                if nxt is not None:
                    self.sender.release(nxt, now)
                continue
            if look is None:
                break
            for i in self.sender.look(look):
                t = self.turns[i]
                sends.append((look, t.session, t.turn))
                finishes.append((look + self.service_s, i))
            in_flight_max = max(in_flight_max, len(finishes))
        assert in_flight_max <= self.cfg.max_parallel
        assert len(sends) == len(self.turns) and not finishes
        return sends


def test_the_round_barrier_sends_no_round_before_every_client_finished_the_last() -> None:
    cfg = MultiturnConfig(clients=6, rounds=3, max_parallel=4, request_rate=5.0)
    sends = Service(cfg, service_s=2.0).run()
    for r in (2, 3):
        last_of_previous = max(t for t, _, k in sends if k == r - 1)
        first = min(t for t, _, k in sends if k == r)
        assert first >= last_of_previous + 2.0  # its request finished before
    # without the barrier a client's next round joins the queue at its answer, among the
    # round-1 requests not yet sent (20 of them, 4 at a time): the rounds interleave
    free = Service(MultiturnConfig(clients=20, rounds=3, max_parallel=4, request_rate=10.0,
                                   round_barrier=False), service_s=1.0).run()
    assert min(t for t, _, k in free if k == 2) < max(t for t, _, k in free if k == 1)


def test_at_max_parallel_the_loop_sends_at_its_next_50_ms_look() -> None:
    cfg = MultiturnConfig(clients=3, rounds=1, max_parallel=1, request_rate=float("inf"),
                          ready_queue="fifo")
    sends = Service(cfg, service_s=0.123).run()
    # one in flight at a time; a send waits for the look every 50 ms after the one that found
    # no room (at 0: the first send, then a look at 0 finds one in flight)
    assert [c for _, c, _ in sends] == ["c0", "c1", "c2"]  # fifo: the clients in order
    assert [round(t, 6) for t, _, _ in sends] == [0.0, round(3 * POLL_S, 6),
                                                   round(6 * POLL_S, 6)]


def test_the_loop_paces_sends_at_the_request_rate() -> None:
    cfg = MultiturnConfig(clients=400, rounds=1, max_parallel=1000, request_rate=4.0)
    times = [t for t, _, _ in Service(cfg, service_s=0.01, seed=3).run()]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert sum(gaps) / len(gaps) == pytest.approx(0.25, rel=0.1)  # Poisson, mean 1 / rate


def test_bad_shapes_are_refused() -> None:
    for kw in ({"clients": 0}, {"rounds": 0}, {"max_parallel": 0}, {"request_rate": 0.0},
               {"request_rate": float("nan")}, {"ready_queue": "lifo"}):
        with pytest.raises(ChatfleetError):
            MultiturnConfig(**kw)  # type: ignore[arg-type]


# ----- the command: hit rates per round -----


def cache_json(*args: str) -> dict[str, Any]:
    res = runner.invoke(app, ["cache", "--shape", "bench-multiturn", *args, "--json"])
    assert res.exit_code == 0, res.output
    doc: dict[str, Any] = json.loads(res.stdout)
    return doc


def test_a_pool_that_holds_every_history_hits_what_each_round_repeats() -> None:
    doc = cache_json("--clients", "8", "--rounds", "4", "--request-rate", "inf",
                     "--pool", "40000", "--policy", "lru")
    assert doc["trace"]["kind"] == "bench-multiturn" and doc["trace"]["requests"] == 32
    (r,) = doc["results"]
    # round r reuses the previous prompt and answer but the answer's last token (no KV)
    expected = [0.0] + [round((576 * k - 1) / (512 * (k + 1) + 64 * k), 4) for k in (1, 2, 3)]
    assert r["hit_rate_by_turn"] == expected == doc["unbounded"]["hit_rate_by_turn"]
    assert r["holds"] and len(r["ttft_ms_mean_by_turn"]) == 4


def test_write_back_keeps_more_rounds_than_write_through_when_the_host_is_short() -> None:
    """32 clients outgrow the L4's BF16 pool and a host tier twice its size; written back, the
    host adds to the device and later rounds find more."""
    doc = cache_json("--clients", "32", "--pool", "24093", "--policy", "lru",
                     "--hicache-ratio", "0,2", "--hicache-write-policy",
                     "write_through,write_back")
    rows = {(r["host_pool_tokens"], r.get("hicache_write_policy")): r for r in doc["results"]}
    assert set(rows) == {(0, None), (48186, "write_through"), (48186, "write_back")}
    off, through, back = rows[(0, None)], rows[(48186, "write_through")], rows[
        (48186, "write_back")]
    assert off["hit_rate"] < through["hit_rate"] < back["hit_rate"]
    assert back["hit_rate_by_turn"][3] > through["hit_rate_by_turn"][3]  # round 4


def test_options_of_the_other_shape_are_refused() -> None:
    res = runner.invoke(app, ["cache", "--shape", "bench-multiturn", "--sessions", "4"])
    assert res.exit_code == 2 and "--sessions does not apply to --shape bench-multiturn" in (
        res.output)
    res = runner.invoke(app, ["cache", "--clients", "4", "--rounds", "2"])
    assert res.exit_code == 2 and "--clients, --rounds do not apply to --shape chat" in (
        res.output)
    res = runner.invoke(app, ["cache", "--shape", "bench-multiturn", "--request-rate", "-1"])
    assert res.exit_code == 2 and "--request-rate must be positive" in res.output
