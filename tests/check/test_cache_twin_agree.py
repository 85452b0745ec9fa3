"""`chatfleet cache` and `chatfleet twin` agree on the same pool: a multi-turn trace the twin
served (a closed loop, captured as it was sent) replayed by the cache analysis gives every
request the cached tokens the twin's scheduler gave it, and the CLI's hit rate per turn is the
twin's."""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from pathlib import Path

import pytest
from typer.testing import CliRunner

from chatfleet.cli.app import app
from chatfleet.core.cache.replay import CacheConfig
from chatfleet.core.cache.trace import Turn
from chatfleet.core.documents.sweep import ClosedLoad
from chatfleet.core.engine.build import EngineSpec
from chatfleet.core.engine.scheduler import Scheduler
from chatfleet.core.records import RequestRecord
from chatfleet.core.specs import builtin_model, get_gpu, precision
from chatfleet.core.workload import LengthSpec, RequestSpec, WorkloadConfig
from chatfleet.twin.cache_replay import replay
from chatfleet.twin.run import run_point

L4 = EngineSpec(get_gpu("l4"), builtin_model("qwen3-8b"), precision("bf16", "bf16"))


def twin_trace(pool: int, policy: str, host: int, reasoning_share: float,
               ) -> tuple[list[Turn], dict[tuple[str, int], int], dict[str, object]]:
    """12 users, 4 turns each, a 512-token shared prompt, on a pool small enough to evict:
    the turns as the twin sent them, the twin's cached tokens per (session, turn), and its
    engine block."""
    wcfg = WorkloadConfig(system_prompt_tokens=512,
                          lengths=LengthSpec("uniform", 256, 128, 0.5, "vllm"), turns=4,
                          think_time_s=5.0, ramp_up_s=3.0, reasoning_share=reasoning_share)
    sent: dict[str, RequestSpec] = {}

    def capture(spec: RequestSpec, replicas: list[Scheduler]) -> int:
        sent[spec.request_id] = spec
        return 0

    spec = dataclasses.replace(L4, pool_tokens=pool, eviction_policy=policy,
                               host_pool_tokens=host)
    run = run_point(spec, wcfg, ClosedLoad(12), duration_s=60.0,
                    warmup_s=0.0, seed=7, drain_s=600.0, route=capture)
    records: list[RequestRecord] = run.records
    assert all(r.outcome == "ok" for r in records) and len(records) == len(sent)
    turns = [Turn(s.session_id, s.turn + 1, s.scheduled_time, s.prompt_ids(), s.output_ids())
             for s in sent.values()]
    cached = {(r.session_id, r.turn + 1): r.cached_tokens for r in records}
    return turns, cached, run.point.engine


@pytest.mark.parametrize(("pool", "policy", "host", "reasoning"), [
    (6000, "lru", 0, 0.0),
    (6000, "lfu", 0, 0.5),
    (6000, "lru", 8000, 0.0),
])
def test_the_replay_gives_each_request_the_twins_cached_tokens(
        pool: int, policy: str, host: int, reasoning: float) -> None:
    turns, twin_cached, engine = twin_trace(pool, policy, host, reasoning)
    assert engine.evicted_tokens > 0  # the pool is under pressure: eviction matters
    res = replay(turns, CacheConfig(pool, policy, host), L4)
    cache_cached = {(o.session, o.turn): o.hit_tokens for o in res.outcomes}
    assert cache_cached == twin_cached
    assert res.evicted_tokens == engine.evicted_tokens
    assert res.retractions == engine.num_retractions
    if host:
        assert res.loaded_back_tokens > 0


def test_chatfleet_cache_reports_the_twins_hit_rate_per_turn(tmp_path: Path) -> None:
    turns, twin_cached, _ = twin_trace(6000, "lru", 0, 0.0)
    path = tmp_path / "twin.jsonl"
    path.write_text("".join(
        json.dumps({"session": t.session, "turn": t.turn, "time": t.time,
                    "prompt_tokens": t.prompt.tolist(), "output_tokens": t.output_len}) + "\n"
        for t in turns))
    res = CliRunner().invoke(app, ["cache", "--trace", str(path), "--pool", "6000",
                                   "--policy", "lru", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    prompt: dict[int, int] = defaultdict(int)
    hit: dict[int, int] = defaultdict(int)
    for t in turns:
        prompt[t.turn] += t.prompt_len
        hit[t.turn] += twin_cached[(t.session, t.turn)]
    expected = [round(hit[k] / prompt[k], 4) for k in sorted(prompt)]
    assert doc["results"][0]["hit_rate_by_turn"] == expected
    assert doc["results"][0]["hit_rate"] < doc["unbounded"]["hit_rate"]  # it did evict
