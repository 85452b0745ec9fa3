"""GPU telemetry: spec parsing, NVML (a fake pynvml), DCGM text, the simserver and the agent as
sources, the sampler's summary, and the bounded cool-down."""

from __future__ import annotations

import asyncio
import statistics
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from typer.testing import CliRunner

from chatfleet.bench import telemetry as tm
from chatfleet.bench.client import Clock
from chatfleet.bench.telemetry import (
    NvmlReader,
    Reading,
    TelemetryError,
    TelemetrySampler,
    TelemetrySource,
    TelemetrySpec,
    TelemetryUnavailable,
    cool_down,
    decode_reasons,
    make_source,
    parse_dcgm,
    parse_telemetry_spec,
)
from chatfleet.cli import agent as agent_cli
from chatfleet.core.engine.build import EngineSpec
from chatfleet.core.measure.validity import below_clock_floor
from chatfleet.core.specs import builtin_model, get_gpu, precision
from chatfleet.simserver.server import RunningServer, ServerConfig, serve_in_thread
from tests.waiting import wait_for_async

pytestmark = pytest.mark.timeout(60)


class SteppedWall:
    """A wall clock the test moves (bench/telemetry/sampler.py's WallClock): a wait moves it by
    what was asked at once, and the `ticks`-th wait holds the sampler until it is stopped, so it
    takes exactly `ticks` samples, exactly an interval apart, however busy the machine is."""

    def __init__(self, ticks: int, start: float = 1000.0) -> None:
        self.now = start
        self.ticks = ticks
        self.waits = 0
        self.done = asyncio.Event()

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.waits += 1
        if self.waits >= self.ticks:
            self.done.set()
            await asyncio.Event().wait()  # until the sampler is cancelled
        self.now += seconds
        await asyncio.sleep(0)

    async def ran(self) -> None:
        await asyncio.wait_for(self.done.wait(), 30)


# --- a fake pynvml ---------------------------------------------------------------------------

class FakeNVMLError(Exception):
    pass


CLOCKS = [1980.0, 1860.0, 1320.0, 465.0]
TEMPS = [55.0, 61.0, 72.0, 79.0]
POWERS_MW = [300_000, 450_000, 555_000, 72_000]
MASKS = [0x0, 0x4, 0x40, 0x20 | 0x4]  # none, power cap, HW thermal, SW thermal + power cap


def fake_pynvml(*, gpus: int = 1, old_binding: bool = False, init_error: bool = False,
                fail_temp: bool = False) -> types.ModuleType:
    """A stand-in for nvidia-ml-py: the calls the reader makes, cycling through known values."""
    m = types.ModuleType("pynvml")
    state = {"i": 0, "init": 0, "shutdown": 0}

    def init() -> None:
        if init_error:
            raise FakeNVMLError("NVML Shared Library Not Found")
        state["init"] += 1

    def clock(h: object, kind: int) -> int:
        assert kind == m.NVML_CLOCK_SM
        state["i"] += 1  # one reading = one clock call; the others read the same index
        return int(CLOCKS[(state["i"] - 1) % 4])

    def temp(h: object, sensor: int) -> int:
        assert sensor == m.NVML_TEMPERATURE_GPU
        if fail_temp:
            raise FakeNVMLError("Not Supported")
        return int(TEMPS[(state["i"] - 1) % 4])

    def reasons(h: object) -> int:
        return MASKS[(state["i"] - 1) % 4]

    m.NVMLError = FakeNVMLError  # type: ignore[attr-defined]
    m.NVML_CLOCK_SM = 1  # type: ignore[attr-defined]
    m.NVML_TEMPERATURE_GPU = 0  # type: ignore[attr-defined]
    m.nvmlInit = init  # type: ignore[attr-defined]
    m.nvmlShutdown = lambda: state.__setitem__("shutdown", state["shutdown"] + 1)  # type: ignore[attr-defined]
    m.nvmlDeviceGetCount = lambda: gpus  # type: ignore[attr-defined]
    m.nvmlDeviceGetHandleByIndex = lambda i: ("handle", i)  # type: ignore[attr-defined]
    m.nvmlDeviceGetName = lambda h: b"NVIDIA L4"  # type: ignore[attr-defined]
    m.nvmlDeviceGetClockInfo = clock  # type: ignore[attr-defined]
    m.nvmlDeviceGetTemperature = temp  # type: ignore[attr-defined]
    m.nvmlDeviceGetPowerUsage = lambda h: POWERS_MW[(state["i"] - 1) % 4]  # type: ignore[attr-defined]
    if old_binding:
        m.nvmlDeviceGetCurrentClocksThrottleReasons = reasons  # type: ignore[attr-defined]
    else:
        m.nvmlDeviceGetCurrentClocksEventReasons = reasons  # type: ignore[attr-defined]
    m.state = state  # type: ignore[attr-defined]
    return m


# --- spec parsing ----------------------------------------------------------------------------

def test_parse_telemetry_spec_forms() -> None:
    assert parse_telemetry_spec("none") == TelemetrySpec("none")
    assert parse_telemetry_spec("") == TelemetrySpec("none")
    assert parse_telemetry_spec("nvml") == TelemetrySpec("nvml", None, 0)
    assert parse_telemetry_spec("nvml:2") == TelemetrySpec("nvml", None, 2)
    assert parse_telemetry_spec("nvml", gpu_index=3).gpu_index == 3
    d = parse_telemetry_spec("dcgm:http://gpu-host:9400/metrics#gpu=1")
    assert (d.kind, d.url, d.gpu_index) == ("dcgm", "http://gpu-host:9400/metrics", 1)
    assert parse_telemetry_spec("simserver:http://127.0.0.1:3000/").url == "http://127.0.0.1:3000"
    assert parse_telemetry_spec("simserver", target="http://127.0.0.1:5").url == \
        "http://127.0.0.1:5"
    a = parse_telemetry_spec("agent:http://10.0.0.2:9400/telemetry")
    assert (a.kind, a.url) == ("agent", "http://10.0.0.2:9400")
    assert a.label == "agent:http://10.0.0.2:9400"


@pytest.mark.parametrize(("text", "needle"), [
    ("nvml:x", "whole number"),
    ("nvml:-1", "0 or more"),
    ("dcgm", "exporter's URL"),
    ("dcgm:gpu-host:9400", "http(s) URL"),
    ("dcgm:http://h:9400#card=1", "#gpu=N"),
    ("simserver", "give a target"),
    ("agent", "telemetry-agent"),
    ("ipmi:http://h", "unknown telemetry source"),
    ("none:x", "takes nothing"),
])
def test_parse_telemetry_spec_errors(text: str, needle: str) -> None:
    with pytest.raises(ValueError, match=None) as exc:
        parse_telemetry_spec(text)
    assert needle in str(exc.value)


def test_decode_reasons() -> None:
    assert decode_reasons(0) == []
    assert decode_reasons(0x40 | 0x4) == ["sw_power_cap", "hw_thermal_slowdown"]
    assert decode_reasons(0x1 | 0x8 | 0x20) == ["gpu_idle", "hw_slowdown", "sw_thermal_slowdown"]
    assert tm.is_thermal(0x20) and tm.is_thermal(0x40) and not tm.is_thermal(0x8 | 0x4)


# --- NVML ------------------------------------------------------------------------------------

def test_nvml_reader_decodes_a_reading() -> None:
    nv = fake_pynvml()
    r = NvmlReader(0, nvml=nv)
    docs = [r.read() for _ in range(4)]
    assert [d["sm_clock_mhz"] for d in docs] == CLOCKS
    assert [d["temp_c"] for d in docs] == TEMPS
    assert [d["power_w"] for d in docs] == [300.0, 450.0, 555.0, 72.0]
    assert [d["thermal_slowdown"] for d in docs] == [False, False, True, True]
    assert docs[3]["clock_event_reasons"] == ["sw_power_cap", "sw_thermal_slowdown"]
    assert docs[0]["gpu"] == "NVIDIA L4" and docs[0]["gpu_index"] == 0
    # the same JSON shape as the simserver's /telemetry
    reading = Reading.from_json(docs[2])
    assert reading.thermal_slowdown is True and reading.reasons == ("hw_thermal_slowdown",)
    r.close()
    r.close()
    assert nv.state["shutdown"] == 1  # type: ignore[attr-defined]


def test_nvml_reader_older_binding_and_missing_fields() -> None:
    r = NvmlReader(0, nvml=fake_pynvml(old_binding=True, fail_temp=True))
    doc = r.read()
    assert doc["sm_clock_mhz"] == CLOCKS[0]
    assert doc["temp_c"] is None  # not supported: None, not a failure
    assert doc["clock_event_reasons"] == [] and doc["thermal_slowdown"] is False


def test_nvml_unavailable_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(TelemetryUnavailable, match="NVML is unavailable"):
        NvmlReader(0, nvml=fake_pynvml(init_error=True))
    with pytest.raises(TelemetryUnavailable, match="GPU index 2 does not exist"):
        NvmlReader(2, nvml=fake_pynvml(gpus=1))

    def no_module() -> types.ModuleType:
        raise TelemetryUnavailable("NVML telemetry needs nvidia-ml-py: pip install nvidia-ml-py")

    monkeypatch.setattr(tm.nvml, "_import_pynvml", no_module)
    with pytest.raises(TelemetryUnavailable, match="nvidia-ml-py"):
        NvmlReader(0)


def test_real_nvml_here_either_works_or_says_why() -> None:
    """On this machine (no GPU) the real binding fails with a clear error; on a GPU host it
    reads the card."""
    try:
        r = NvmlReader(0)
    except TelemetryUnavailable as exc:
        assert "NVML" in str(exc) or "nvidia-ml-py" in str(exc)
        return
    try:
        assert r.read()["sm_clock_mhz"] is not None
    finally:
        r.close()


@pytest.mark.timeout(30)
def test_sampler_with_fake_nvml_at_100ms(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(tm.nvml, "_import_pynvml", lambda: fake_pynvml())
    path = tmp_path / "telemetry.jsonl"

    async def main() -> TelemetrySampler:
        wall = SteppedWall(12)
        clock = Clock(scale=1.0, t0=wall.now)
        async with TelemetrySampler("nvml:0", interval_s=0.1, clock=clock, path=path,
                                    wall_clock=wall) as s:
            await wall.ran()
        return s

    s = asyncio.run(main())
    n = len(s.samples)
    assert n == 12
    assert [round(x.t, 9) for x in s.samples] == [round(0.1 * i, 9) for i in range(n)]
    assert s.failures == 0
    clocks = [x.reading.sm_clock_mhz for x in s.samples]
    assert clocks == [CLOCKS[i % 4] for i in range(n)]  # every reading, in order
    block = s.summary()
    summary = block.to_json()
    assert summary["samples"] == n
    assert summary["sm_clock_mhz"]["p50"] == statistics.median(clocks)
    assert summary["sm_clock_mhz"]["min"] == min(clocks)
    assert summary["temp_c"]["max"] == max(TEMPS[i % 4] for i in range(n))
    thermal = sum(1 for i in range(n) if MASKS[i % 4] & 0x60)
    assert summary["thermal_slowdown_share"] == pytest.approx(thermal / n)
    assert summary["interval_ms_p50"] == summary["interval_wall_ms_p50"] == 100.0
    assert summary["source"] == "nvml:0"
    assert summary["reasons_share"]["hw_thermal_slowdown"] == pytest.approx(
        sum(1 for i in range(n) if MASKS[i % 4] & 0x40) / n, abs=1e-4)
    # a window selects by model time
    t = [x.t for x in s.samples]
    part = s.summary(t[2], t[5]).to_json()
    assert part["samples"] == 4
    assert part["sm_clock_mhz"]["min"] == min(clocks[2:6])
    # the file holds every sample, one JSON object a line
    rows = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    assert len(rows) == n
    assert set(rows[0]) >= {"t", "sm_clock_mhz", "temp_c", "power_w", "thermal_slowdown",
                            "reasons"}
    assert rows[2]["reasons"] == ["hw_thermal_slowdown"] and rows[2]["thermal_slowdown"] is True
    assert below_clock_floor(block, 2000) is not None
    assert below_clock_floor(block, 100) is None


def test_sampler_with_missing_nvml_fails_before_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_gpu() -> types.ModuleType:
        return fake_pynvml(init_error=True)

    monkeypatch.setattr(tm.nvml, "_import_pynvml", no_gpu)

    async def main() -> None:
        async with TelemetrySampler("nvml"):
            pass

    with pytest.raises(TelemetryUnavailable, match="NVML is unavailable"):
        asyncio.run(main())


class FlakySource(TelemetrySource):
    """Fails every other read; one read hangs past the timeout."""

    has_temperature = True

    def __init__(self) -> None:
        self.spec = TelemetrySpec("none")
        self.n = 0

    async def read(self) -> Reading:
        self.n += 1
        if self.n == 3:
            await asyncio.sleep(5)
        if self.n % 2 == 0:
            raise TelemetryError("scrape failed")
        return Reading(1500.0, 60.0, 50.0, False, ())


def test_sample_failures_are_counted_not_raised() -> None:
    async def main() -> TelemetrySampler:
        wall = SteppedWall(6)
        async with TelemetrySampler(FlakySource(), interval_s=0.05, read_timeout_s=0.2,
                                    wall_clock=wall) as s:
            await wall.ran()
        return s

    s = asyncio.run(main())
    # reads 2, 4 and 6 fail, read 3 hangs past the timeout; 1 and 5 are samples
    assert s.failures == 4
    assert len(s.samples) == 2
    assert s.last_error == "TelemetryError: scrape failed"
    assert s.summary().to_json()["failures"] == 4


class SlowSource(TelemetrySource):
    """Each read takes 250 ms of the wall clock it is given."""

    has_temperature = True

    def __init__(self, wall: SteppedWall) -> None:
        self.spec = TelemetrySpec("none")
        self.wall = wall

    async def read(self) -> Reading:
        self.wall.now += 0.25
        return Reading(1500.0, 60.0, 50.0, False, ())


def test_reads_slower_than_the_interval_keep_the_cadence_without_a_burst() -> None:
    async def main() -> TelemetrySampler:
        wall = SteppedWall(5)
        async with TelemetrySampler(SlowSource(wall), interval_s=0.1, wall_clock=wall,
                                    clock=Clock(t0=wall.now)) as s:
            await wall.ran()
        return s

    s = asyncio.run(main())
    # each sample is stamped at its read's middle; the next read starts as the last ends
    assert [round(x.t, 9) for x in s.samples] == [0.125, 0.375, 0.625, 0.875, 1.125]


def test_none_source_samples_nothing() -> None:
    async def main() -> TelemetrySampler:
        async with TelemetrySampler("none", interval_s=0.05) as s:
            assert not s.active  # no background task reads anything
        return s

    s = asyncio.run(main())
    summary = s.summary().to_json()
    assert summary["samples"] == 0 and summary["sm_clock_mhz"]["p50"] is None
    assert summary["note"] == "no telemetry source"


# --- DCGM ------------------------------------------------------------------------------------

# labels as dcgm-exporter writes them (Hostname only when enabled)
GPU0 = ('gpu="0",UUID="GPU-3b1c",pci_bus_id="00000000:00:03.0",device="nvidia0",'
        'modelName="NVIDIA L4",Hostname="node-1"')
GPU1 = ('gpu="1",UUID="GPU-77aa",pci_bus_id="00000000:00:04.0",device="nvidia1",'
        'modelName="NVIDIA L4",Hostname="node-1"')
DCGM_TEXT = f"""\
# HELP DCGM_FI_DEV_SM_CLOCK SM clock frequency (in MHz).
# TYPE DCGM_FI_DEV_SM_CLOCK gauge
DCGM_FI_DEV_SM_CLOCK{{{GPU0}}} 2040
DCGM_FI_DEV_SM_CLOCK{{{GPU1}}} 465
# HELP DCGM_FI_DEV_MEM_CLOCK Memory clock frequency (in MHz).
# TYPE DCGM_FI_DEV_MEM_CLOCK gauge
DCGM_FI_DEV_MEM_CLOCK{{{GPU0}}} 6251
# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).
# TYPE DCGM_FI_DEV_GPU_TEMP gauge
DCGM_FI_DEV_GPU_TEMP{{{GPU0}}} 48
DCGM_FI_DEV_GPU_TEMP{{{GPU1}}} 84
# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).
# TYPE DCGM_FI_DEV_POWER_USAGE gauge
DCGM_FI_DEV_POWER_USAGE{{{GPU0}}} 35.412
DCGM_FI_DEV_POWER_USAGE{{{GPU1}}} 71.904
# HELP DCGM_FI_DEV_CLOCKS_EVENT_REASONS Current clock event reasons (bitmask).
# TYPE DCGM_FI_DEV_CLOCKS_EVENT_REASONS gauge
DCGM_FI_DEV_CLOCKS_EVENT_REASONS{{{GPU0}}} 1
DCGM_FI_DEV_CLOCKS_EVENT_REASONS{{{GPU1}}} 68
"""


def test_parse_dcgm_exporter_text() -> None:
    g0 = parse_dcgm(DCGM_TEXT, 0)
    assert (g0.sm_clock_mhz, g0.temp_c, g0.power_w) == (2040.0, 48.0, 35.412)
    assert g0.reasons == ("gpu_idle",) and g0.thermal_slowdown is False
    g1 = parse_dcgm(DCGM_TEXT, 1)
    assert (g1.sm_clock_mhz, g1.temp_c) == (465.0, 84.0)
    assert g1.reasons == ("sw_power_cap", "hw_thermal_slowdown") and g1.thermal_slowdown is True
    # the older field name, and a payload without reasons
    old = DCGM_TEXT.replace("CLOCKS_EVENT_REASONS", "CLOCK_THROTTLE_REASONS")
    assert parse_dcgm(old, 1).thermal_slowdown is True
    bare = "\n".join(x for x in DCGM_TEXT.splitlines() if "REASONS" not in x)
    assert parse_dcgm(bare, 0).thermal_slowdown is None
    with pytest.raises(TelemetryError, match="no GPU 5"):
        parse_dcgm(DCGM_TEXT, 5)
    # a malformed line costs only itself
    assert parse_dcgm(DCGM_TEXT + "DCGM_FI_DEV_SM_CLOCK{gpu=\"2\" broken\n", 1).temp_c == 84.0


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


def test_dcgm_source_over_http() -> None:
    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=DCGM_TEXT, content_type="text/plain")

    async def main() -> TelemetrySampler:
        app = web.Application()
        app.router.add_get("/metrics", metrics)
        runner, url = await _serve(app)
        try:
            async with TelemetrySampler(f"dcgm:{url}#gpu=1", interval_s=0.05) as s:
                assert await wait_for_async(lambda: len(s.samples) >= 4)
        finally:
            await runner.cleanup()
        return s

    s = asyncio.run(main())
    assert len(s.samples) >= 4 and s.failures == 0
    assert s.summary().to_json()["thermal_slowdown_share"] == 1.0
    assert s.summary().to_json()["temp_c"]["max"] == 84.0


# --- the simserver as a source ---------------------------------------------------------------

@pytest.fixture(scope="module")
def thermal_server() -> Iterator[RunningServer]:
    spec = EngineSpec(get_gpu("l4"), builtin_model("qwen3-8b"), precision("fp8", "fp8"),
                      thermal=True)
    with serve_in_thread(ServerConfig(spec=spec, time_scale=20)) as srv:
        yield srv


def test_simserver_source_samples_its_thermal_model(thermal_server: RunningServer) -> None:
    url = thermal_server.urls[0]

    async def main() -> TelemetrySampler:
        clock = Clock(scale=20)
        async with TelemetrySampler("simserver", target=url, interval_s=0.1, clock=clock) as s:
            async with aiohttp.ClientSession() as sess:
                body = {"model": "qwen3-8b", "prompt": "warm the card", "max_tokens": 200,
                        "ignore_eos": True, "min_tokens": 200}
                async with sess.post(url + "/v1/completions", json=body) as resp:
                    assert resp.status == 200
                    await resp.read()
            assert await wait_for_async(lambda: len(s.samples) >= 5)
        return s

    s = asyncio.run(main())
    assert len(s.samples) >= 5 and s.failures == 0
    summary = s.summary().to_json()
    assert summary["sm_clock_mhz"]["p50"] > 0
    assert summary["temp_c"]["max"] is not None
    assert summary["thermal_slowdown_share"] is not None
    # model time: 100 ms of wall is 2 s of model time at scale 20
    assert 1500 <= summary["interval_ms_p50"] <= 2600
    assert all(x.reading.source_time is not None for x in s.samples)


def test_cool_down_against_a_simserver_without_thermal_model() -> None:
    spec = EngineSpec(get_gpu("l4"), builtin_model("qwen3-8b"), precision("fp8", "fp8"))
    with serve_in_thread(ServerConfig(spec=spec, time_scale=20)) as srv:
        res = asyncio.run(cool_down("simserver", 50.0, 5.0, target=srv.urls[0]))
    assert res.waited_s == 0.0 and res.timed_out is False
    assert "no temperature" in res.note


# --- the agent -------------------------------------------------------------------------------

class FakeReader:
    """The agent's reader, without a GPU."""

    def __init__(self, gpu_index: int = 0, fail: bool = False) -> None:
        self.gpu_index = gpu_index
        self.name = "NVIDIA L4"
        self.fail = fail
        self.n = 0
        self.closed = False

    def read(self) -> dict[str, Any]:
        self.n += 1
        if self.fail:
            raise TelemetryError("NVML returned nothing for GPU 0")
        mask = 0x40 if self.n % 2 else 0
        return {"time": self.n * 0.1, "unix_time": time.time(), "gpu": self.name,
                "gpu_index": self.gpu_index, "sm_clock_mhz": 1320.0 if mask else 2040.0,
                "temp_c": 60.0 + self.n, "power_w": 72.0, "thermal_slowdown": bool(mask),
                "clock_event_reasons": decode_reasons(mask), "clock_event_mask": mask}

    def close(self) -> None:
        self.closed = True


def test_agent_serves_a_reader_and_the_sampler_reads_it() -> None:
    async def main() -> tuple[dict[str, Any], dict[str, Any], TelemetrySampler]:
        agent = await agent_cli.start_agent(FakeReader(), "127.0.0.1", 0)
        try:
            async with aiohttp.ClientSession() as sess:
                async with sess.get(agent.url + "/health") as r:
                    assert r.status == 200
                    health = await r.json()
                async with sess.get(agent.url + "/telemetry") as r:
                    assert r.status == 200
                    doc = await r.json()
            wall = SteppedWall(10)
            async with TelemetrySampler(f"agent:{agent.url}", interval_s=0.05,
                                        wall_clock=wall) as s:
                await wall.ran()
        finally:
            await agent.close()
        return health, doc, s

    health, doc, s = asyncio.run(main())
    assert health == {"status": "ok", "gpu": "NVIDIA L4", "gpu_index": 0}
    assert doc["clock_event_reasons"] == ["hw_thermal_slowdown"]
    assert doc["thermal_slowdown"] is True and doc["sm_clock_mhz"] == 1320.0
    assert len(s.samples) == 10 and s.failures == 0
    # the agent's reader throttles every other read: the sampler's 10 reads, half of them
    share = s.summary().to_json()["thermal_slowdown_share"]
    assert share == 0.5
    assert {x.reading.sm_clock_mhz for x in s.samples} == {1320.0, 2040.0}


def test_agent_reader_errors_become_503_and_counted_failures() -> None:
    async def main() -> tuple[int, TelemetrySampler]:
        agent = await agent_cli.start_agent(FakeReader(fail=True), "127.0.0.1", 0)
        try:
            async with aiohttp.ClientSession() as sess, \
                    sess.get(agent.url + "/telemetry") as r:
                status = r.status
            async with TelemetrySampler(f"agent:{agent.url}", interval_s=0.05) as s:
                assert await wait_for_async(lambda: s.failures >= 3)
        finally:
            await agent.close()
        return status, s

    status, s = asyncio.run(main())
    assert status == 503
    assert not s.samples and s.failures >= 3 and "HTTP 503" in (s.last_error or "")


def test_agent_command_without_nvml_exits_2(monkeypatch: pytest.MonkeyPatch) -> None:
    import typer

    def no_nvml(index: int) -> FakeReader:
        raise TelemetryUnavailable("NVML is unavailable (no NVIDIA driver or GPU here?): "
                                   "NVML Shared Library Not Found")

    monkeypatch.setattr(agent_cli, "READER_FACTORY", no_nvml)
    app = typer.Typer()
    app.command()(agent_cli.telemetry_agent)
    res = CliRunner().invoke(app, ["--port", "0", "--gpu-index", "0"])
    assert res.exit_code == 2
    assert "NVML is unavailable" in res.output
    res = CliRunner().invoke(app, ["--gpu-index", "-1"])
    assert res.exit_code == 2 and "--gpu-index" in res.output


# --- cool-down -------------------------------------------------------------------------------

class TempSource(TelemetrySource):
    def __init__(self, temps: list[float | None]) -> None:
        self.spec = TelemetrySpec("none")
        self.temps = temps
        self.reads = 0

    async def read(self) -> Reading:
        t = self.temps[min(self.reads, len(self.temps) - 1)]
        self.reads += 1
        return Reading(1500.0, t, 50.0, False, ())


def test_cool_down_returns_at_once_when_cool() -> None:
    src = TempSource([45.0])
    res = asyncio.run(cool_down(src, 60.0, 10.0, poll_s=0.05))
    assert res.timed_out is False and res.waited_s < 0.05
    assert res.start_temp_c == res.end_temp_c == 45.0
    assert src.reads == 1


def test_cool_down_waits_until_cool() -> None:
    src = TempSource([80.0, 75.0, 66.0, 59.5])
    res = asyncio.run(cool_down(src, 60.0, 10.0, poll_s=0.05))
    assert res.timed_out is False
    assert res.start_temp_c == 80.0 and res.end_temp_c == 59.5
    assert 0.1 <= res.waited_s < 1.0


@pytest.mark.timeout(10)
def test_cool_down_is_bounded_when_hot() -> None:
    src = TempSource([88.0])
    t0 = time.monotonic()
    res = asyncio.run(cool_down(src, 60.0, 0.5, poll_s=0.1))
    elapsed = time.monotonic() - t0
    assert res.timed_out is True and res.end_temp_c == 88.0
    assert 0.45 <= res.waited_s <= 0.8 and elapsed < 1.0


def test_cool_down_without_temperature() -> None:
    res = asyncio.run(cool_down("none", 60.0, 10.0))
    assert res.waited_s == 0.0 and "no temperature" in res.note
    res = asyncio.run(cool_down(TempSource([None]), 60.0, 10.0))
    assert res.timed_out is False and "no temperature" in res.note
    with pytest.raises(ValueError):
        asyncio.run(cool_down("none", 60.0, -1.0))


def test_make_source_kinds() -> None:
    assert isinstance(make_source("none"), tm.NoneSource)
    assert isinstance(make_source("nvml:1"), tm.NvmlSource)
    assert isinstance(make_source("dcgm:http://h:9400"), tm.DcgmSource)
    assert isinstance(make_source("simserver", "http://127.0.0.1:1"), tm.JsonTelemetrySource)
    src = TempSource([1.0])
    assert make_source(src) is src
