"""The sampler: `TelemetrySampler` reads a source in the background while a run goes on, and
`gpu_summary` turns its samples into the sweep contract's gpu block (`core.documents`'s
`GpuBlock`, its median the twin's time-weighted one); `below_clock_floor`, the validity rule a
run's median SM clock is held to, lives with the others in `core.measure.validity`.

The sampler reads the time and waits through a `WallClock` (the system's by default), so that
a test can run it on a clock it moves itself: exactly so many samples, exactly an interval
apart, whatever the machine's load."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import IO, Protocol

import orjson

from chatfleet.bench.client import Clock
from chatfleet.bench.telemetry.reading import TelemetrySample
from chatfleet.bench.telemetry.sources import NoneSource, TelemetrySource, make_source
from chatfleet.bench.telemetry.spec import TelemetrySpec
from chatfleet.core.documents.sweep import (
    ClockStats,
    GpuBlock,
    SampledGpu,
    SampledPower,
    TempStats,
)
from chatfleet.core.errors import ChatfleetError
from chatfleet.core.measure.percentiles import percentiles, time_weighted_percentile
from chatfleet.core.measure.validity import below_clock_floor

__all__ = ["SystemWallClock", "TelemetrySampler", "WallClock", "below_clock_floor",
           "gpu_summary"]


class WallClock(Protocol):
    """Where a component reads the wall clock and waits on it."""

    def monotonic(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class SystemWallClock:
    """time.monotonic and asyncio.sleep."""

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def _p50(values: Sequence[float]) -> float | None:
    """The median of samples taken at a fixed interval: each stands for the same time, so
    this is the time-weighted median the twin reports for the same field."""
    p50 = time_weighted_percentile(values, None, 50.0)
    return None if p50 is None else float(p50)


def gpu_summary(samples: Sequence[TelemetrySample], start: float | None = None,
                end: float | None = None, *, scale: float = 1.0) -> GpuBlock:
    """The gpu block of a sweep point over samples with start <= t <= end: median and lowest
    SM clock, highest temperature, the share of samples in thermal slowdown (of those whose
    reasons are known), and how often each clock-event reason was seen. None where no sample
    holds the figure."""
    sel = [s for s in samples if (start is None or s.t >= start) and (end is None or s.t <= end)]
    clocks = [s.reading.sm_clock_mhz for s in sel if s.reading.sm_clock_mhz is not None]
    temps = [s.reading.temp_c for s in sel if s.reading.temp_c is not None]
    powers = [s.reading.power_w for s in sel if s.reading.power_w is not None]
    known = [s.reading.thermal_slowdown for s in sel if s.reading.thermal_slowdown is not None]
    gaps = [(b.wall - a.wall) * 1000.0 for a, b in itertools.pairwise(sel)]
    reasons: dict[str, int] = {}
    for s in sel:
        for r in s.reading.reasons:
            reasons[r] = reasons.get(r, 0) + 1
    wall_p50 = percentiles(gaps, (50.0,))["p50"] if gaps else None
    return GpuBlock(
        sm_clock_mhz=ClockStats(p50=_p50(clocks), min=min(clocks) if clocks else None),
        temp_c=TempStats(max=max(temps) if temps else None),
        thermal_slowdown_share=(sum(1 for k in known if k) / len(known)) if known else None,
        sampled=SampledGpu(
            power_w=SampledPower(p50=_p50(powers), max=max(powers) if powers else None),
            samples=len(sel),
            # model milliseconds, like every reported time; the wall interval beside it
            interval_ms_p50=round(wall_p50 * scale, 3) if wall_p50 is not None else None,
            interval_wall_ms_p50=round(wall_p50, 3) if wall_p50 is not None else None,
            reasons_share={k: round(v / len(sel), 4) for k, v in sorted(reasons.items())}))


class TelemetrySampler:
    """`async with TelemetrySampler(source, interval_s=0.1, clock=clock) as s:` samples in
    the background until the block ends (`clock`: model time; `wall_clock`: where it reads
    the wall time and waits for the next sample, the system's unless a test gives another).
    Each read is bounded by `read_timeout_s`; a read that fails is counted in `failures` (the
    last reason in `last_error`), never raised. At most `max_samples` are kept in memory (the
    rest are counted in `dropped`; the file keeps all).
    The source is opened on entry, so a source that cannot work at all (no NVML, no GPU)
    raises TelemetryUnavailable there, before the run."""

    def __init__(self, source: str | TelemetrySpec | TelemetrySource, *,
                 interval_s: float = 0.1, clock: Clock | None = None,
                 path: str | Path | None = None, target: str | None = None,
                 read_timeout_s: float = 2.0, max_samples: int = 1_000_000,
                 flush_every_s: float = 1.0, wall_clock: WallClock | None = None) -> None:
        if interval_s <= 0:
            raise ChatfleetError("the sampling interval must be positive")
        self.source = make_source(source, target)
        self.interval_s = interval_s
        self.clock = clock or Clock()
        self.wall_clock: WallClock = wall_clock or SystemWallClock()
        self.path = Path(path) if path is not None else None
        self.read_timeout_s = read_timeout_s
        self.max_samples = max_samples
        self.flush_every_s = flush_every_s
        self.samples: list[TelemetrySample] = []
        self.failures = 0
        self.dropped = 0
        self.last_error: str | None = None
        self._task: asyncio.Task[None] | None = None
        self._file: IO[bytes] | None = None
        self._buf: list[bytes] = []
        self._last_flush = 0.0

    @property
    def active(self) -> bool:
        return not isinstance(self.source, NoneSource)

    async def __aenter__(self) -> TelemetrySampler:
        if self.active:
            await self.source.open()
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "ab")  # noqa: SIM115 (closed in __aexit__)
        if self.active:
            self._task = asyncio.get_running_loop().create_task(self._run(),
                                                                name="telemetry")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.source.aclose()
        self._flush()
        if self._file is not None:
            self._file.close()
            self._file = None

    async def sample_once(self) -> TelemetrySample | None:
        wall0 = self.wall_clock.monotonic()
        try:
            async with asyncio.timeout(self.read_timeout_s):
                reading = await self.source.read()
        except asyncio.CancelledError:
            raise
        except TimeoutError:
            self.failures += 1
            self.last_error = f"the read took more than {self.read_timeout_s:g} s"
            return None
        except Exception as exc:  # counted, never fatal: the run goes on
            self.failures += 1
            self.last_error = f"{type(exc).__name__}: {exc}"[:300]
            return None
        wall = (wall0 + self.wall_clock.monotonic()) / 2
        sample = TelemetrySample((wall - self.clock.t0) * self.clock.scale, wall, reading)
        if len(self.samples) < self.max_samples:
            self.samples.append(sample)
        else:
            self.dropped += 1
        if self._file is not None:
            self._buf.append(orjson.dumps(sample.to_json()) + b"\n")
            if wall - self._last_flush >= self.flush_every_s:
                self._flush()
        return sample

    def _flush(self) -> None:
        if self._file is not None and self._buf:
            self._file.write(b"".join(self._buf))
            self._file.flush()
            self._buf.clear()
        self._last_flush = self.wall_clock.monotonic()

    async def _run(self) -> None:
        wall = self.wall_clock
        next_at = wall.monotonic()
        while True:
            await self.sample_once()
            next_at += self.interval_s
            now = wall.monotonic()
            if next_at < now:  # fell behind: keep the cadence, do not burst
                next_at = now
            await wall.sleep(next_at - now)

    def summary(self, start: float | None = None, end: float | None = None) -> GpuBlock:
        """The contract's gpu block over start <= t <= end (model time), with the source,
        the failed reads and the samples dropped."""
        out = gpu_summary(self.samples, start, end, scale=self.clock.scale)
        assert out.sampled is not None
        return replace(out, sampled=replace(
            out.sampled, source=self.source.label, failures=self.failures,
            dropped=self.dropped or None, last_error=self.last_error,
            note=None if self.active else "no telemetry source"))
