"""chatfleet sweep against simservers: validity checks, resume, and agreement with the twin."""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pytest

from chatfleet.bench import sweep as sweep_mod
from chatfleet.bench.sweep import LiveSweep, LiveSweepConfig
from chatfleet.core.engine.build import EngineSpec
from chatfleet.core.metrics import SLO
from chatfleet.core.specs import builtin_model, get_gpu, precision
from chatfleet.core.workload import LengthSpec, WorkloadConfig
from chatfleet.simserver.server import ServerConfig, serve_in_thread
from chatfleet.twin.sweep import TwinSweep

SMALL = WorkloadConfig(system_prompt_tokens=256, lengths=LengthSpec("fixed", 64, 32))


def spec(prec: str = "fp8", **kw: Any) -> EngineSpec:
    return EngineSpec(get_gpu("l4"), builtin_model("qwen3-8b"), precision(prec, prec), **kw)


def config(urls: list[str], out: Path, loads: list[dict[str, Any]], **kw: Any) -> LiveSweepConfig:
    base: dict[str, Any] = {"targets": urls, "engine": "simserver", "model": "qwen3-8b",
                            "loads": loads, "wcfg": SMALL, "out": out, "duration_s": 20.0,
                            "warmup_s": 2.0, "drain_s": 60.0, "api": "completions-ids",
                            "telemetry": "simserver",
                            # these tests are not about the client's own lag: a loaded CI
                            # machine must not turn their runs invalid
                            "max_loop_lag_ms": 100.0, "max_send_lag_ms": 200.0}
    base.update(kw)
    return LiveSweepConfig(**base)


def closed(*users: int) -> list[dict[str, Any]]:
    return [{"mode": "closed", "concurrency": u} for u in users]


@pytest.mark.timeout(120)
def test_a_refused_flush_makes_the_run_invalid(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sweep_mod, "FLUSH_RETRY_S", 0.05)
    with serve_in_thread(ServerConfig(spec=spec(), time_scale=20)) as srv:
        url = srv.urls[0]
        stop = threading.Event()

        def hold() -> None:  # a long request keeps the engine busy: SGLang refuses to flush
            body = {"prompt": "hold", "max_tokens": 30000, "ignore_eos": True, "stream": True}
            req = urllib.request.Request(url + "/v1/completions", data=orjson.dumps(body),
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=60) as r:
                for _ in r:
                    if stop.is_set():
                        return

        t = threading.Thread(target=hold, daemon=True)
        t.start()
        time.sleep(0.5)
        doc = asyncio.run(LiveSweep(config([url], tmp_path / "s", closed(2))).run())
        stop.set()
        t.join(10)
    (point,) = doc["points"]
    assert point["valid"] is False
    assert point["flushed"] is False
    assert point["invalid_reason"].startswith("unflushed")
    assert doc["knee"]["meets"] is None  # invalid runs are left out of the knee


@pytest.mark.timeout(120)
def test_a_client_that_falls_behind_is_detected(tmp_path: Path) -> None:
    async def main(url: str) -> dict[str, Any]:
        async def hog() -> None:  # blocks the client's event loop 40 ms in every 100 ms
            while True:
                time.sleep(0.04)
                await asyncio.sleep(0.06)

        task = asyncio.create_task(hog())
        try:
            cfg = config([url], tmp_path / "s", closed(4), max_loop_lag_ms=20.0)
            return await LiveSweep(cfg).run()
        finally:
            task.cancel()

    with serve_in_thread(ServerConfig(spec=spec(), time_scale=20)) as srv:
        doc = asyncio.run(main(srv.urls[0]))
    (point,) = doc["points"]
    assert point["valid"] is False
    assert "client behind" in point["invalid_reason"]
    assert point["client"]["loop_lag_ms_p99"] > 20.0


@pytest.mark.timeout(180)
def test_resume_after_an_interrupted_sweep_loses_no_finished_run(tmp_path: Path) -> None:
    out = tmp_path / "s"
    loads = closed(1, 2, 4)
    with serve_in_thread(ServerConfig(spec=spec(), time_scale=20)) as srv:
        url = srv.urls[0]
        first: LiveSweep

        def on_event(kind: str, info: dict[str, Any]) -> None:
            if kind == "point":  # Ctrl-C during the first run: its record is kept, then stop
                first.stop.set()

        first = LiveSweep(config([url], out, loads), on_event)
        asyncio.run(first.run())
        runs = [orjson.loads(x) for x in (out / "runs.jsonl").read_bytes().splitlines()]
        assert [r["load"]["concurrency"] for r in runs] == [1]
        # a crash in the middle of writing the next run leaves a cut-off line
        with open(out / "runs.jsonl", "ab") as f:
            f.write(b'{"load": {"mode": "closed", "concu')
        with pytest.raises(ValueError, match="--resume"):
            asyncio.run(LiveSweep(config([url], out, loads)).run())
        doc = asyncio.run(LiveSweep(config([url], out, loads, resume=True)).run())
    assert [p["load"]["concurrency"] for p in doc["points"]] == [1, 2, 4]
    assert [p["seed"] for p in doc["points"]] == [1, 2, 3]
    assert [p["run_index"] for p in doc["points"]] == [0, 1, 2]
    assert (out / "runs" / "001" / "records.jsonl").exists()
    assert orjson.loads((out / "sweep.json").read_bytes())["points"] == doc["points"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_flushed_sweep_of_two_simservers_finds_the_twins_knees(tmp_path: Path) -> None:
    wcfg = WorkloadConfig(lengths=LengthSpec("uniform", 512, 128, 0.5, "vllm"))
    slo = SLO()
    grids = {"bf16": closed(2, 4, 8), "fp8": closed(8, 16, 32)}
    for prec, loads in grids.items():
        eng = spec(prec)
        twin = TwinSweep(eng, wcfg, slo, duration_s=90.0, warmup_s=10.0, seed=21).run(loads)
        with serve_in_thread(ServerConfig(spec=eng, time_scale=10)) as srv:
            cfg = config(srv.urls, tmp_path / prec, loads, wcfg=wcfg, duration_s=90.0,
                         warmup_s=10.0, seed=21, slo=slo)
            live = asyncio.run(LiveSweep(cfg).run())
        assert all(p["valid"] and p["flushed"] for p in live["points"]), live["points"]
        assert live["knee"] == twin["knee"], prec
        assert live["recommended_cap"] == twin["recommended_cap"]


@pytest.mark.timeout(240)
def test_refine_bisects_the_knee_bracket_down_to_one_user(tmp_path: Path) -> None:
    wcfg = WorkloadConfig(lengths=LengthSpec("uniform", 512, 128, 0.5, "vllm"))
    with serve_in_thread(ServerConfig(spec=spec("fp8"), time_scale=20)) as srv:
        cfg = config(srv.urls, tmp_path / "s", closed(4, 64), wcfg=wcfg, duration_s=40.0,
                     warmup_s=5.0, refine=True, refine_max_runs=6)
        doc = asyncio.run(LiveSweep(cfg).run())
    tested = [p["load"]["concurrency"] for p in doc["points"]]
    assert tested[:2] == [4, 64]
    assert len(tested) > 2  # the bracket (4, 64) was bisected
    knee = doc["knee"]
    assert knee["meets"] is not None and knee["fails"] is not None
    # bisected until one user wide, or out of refinement runs
    assert knee["fails"] - knee["meets"] == 1 or len(tested) == 2 + 6
    assert [p["seed"] for p in doc["points"]] == list(range(1, len(tested) + 1))
