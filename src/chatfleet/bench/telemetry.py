"""GPU telemetry during a run: SM clock, temperature, power and clock-event reasons, every 100 ms.

Sources (`parse_telemetry_spec`):

- `nvml` or `nvml:N`: NVML on this host (nvidia-ml-py, imported when first used), GPU index N.
- `dcgm:URL`: an NVIDIA DCGM exporter's Prometheus text (`URL` with no path gets `/metrics`),
  the series whose `gpu` label is the GPU index (`dcgm:URL#gpu=N`, 0 by default). The exporter
  must collect fast enough (`dcgm-exporter -c 100`) and list the clock-event field in its
  counters file, or `thermal_slowdown` is unknown.
- `simserver` or `simserver:URL`: the simserver's `/telemetry` (its thermal model).
- `agent:URL`: `chatfleet telemetry-agent` on the engine host (NVML there, JSON here).
- `none`: no telemetry.

`TelemetrySampler` samples in the background while a run goes on, into a list and optionally
a JSON-lines file; `summary(start, end)` gives the gpu block of the sweep contract. A sample
that fails is counted and skipped, never raised. Every sample time `t` is the harness clock's
model time (`chatfleet.bench.client.Clock`), the same time as the run's records.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import IO, Any, Literal
from urllib.parse import urlsplit

import aiohttp
import orjson

from chatfleet.bench.client import Clock
from chatfleet.core.documents.sweep import (
    ClockStats,
    Cooldown,
    GpuBlock,
    SampledGpu,
    SampledPower,
    TempStats,
)
from chatfleet.core.measure.percentiles import percentiles, time_weighted_percentile
from chatfleet.engines.prom import Metrics, parse_prometheus

SourceKind = Literal["nvml", "dcgm", "simserver", "agent", "none"]
KINDS: tuple[SourceKind, ...] = ("nvml", "dcgm", "simserver", "agent", "none")
HTTP_TIMEOUT_S = 2.0

# NVML's clocks-event (formerly "throttle") reasons, the bit values of nvmlClocksEventReason*
CLOCK_EVENT_REASONS: tuple[tuple[int, str], ...] = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)
THERMAL_MASK = 0x20 | 0x40

DCGM_SM_CLOCK = "DCGM_FI_DEV_SM_CLOCK"
DCGM_TEMP = "DCGM_FI_DEV_GPU_TEMP"
DCGM_POWER = "DCGM_FI_DEV_POWER_USAGE"
DCGM_REASONS = ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS")
# the only series parsed from the exporter's page (read 10 times a second, on the event loop)
DCGM_NAMES = frozenset((DCGM_SM_CLOCK, DCGM_TEMP, DCGM_POWER, *DCGM_REASONS))


class TelemetryError(Exception):
    """One reading failed (counted by the sampler, never fatal)."""


class TelemetryUnavailable(TelemetryError):
    """The source cannot work here at all: NVML missing, no GPU, a bad GPU index."""


def decode_reasons(mask: int) -> list[str]:
    """The names of the clock-event reason bits set in `mask`."""
    return [name for bit, name in CLOCK_EVENT_REASONS if mask & bit]


def is_thermal(mask: int) -> bool:
    return bool(mask & THERMAL_MASK)


@dataclass(frozen=True, slots=True)
class Reading:
    """One reading of one GPU; None where the source does not know."""

    sm_clock_mhz: float | None = None
    temp_c: float | None = None
    power_w: float | None = None
    thermal_slowdown: bool | None = None
    reasons: tuple[str, ...] = ()
    source_time: float | None = None  # the source's own clock (simserver: its model time)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Reading:
        """The JSON of the simserver's and the agent's /telemetry."""
        reasons = doc.get("clock_event_reasons")
        if not isinstance(reasons, list):
            reasons = []
        slow = doc.get("thermal_slowdown")
        if slow is None and reasons:
            slow = any("thermal" in str(r) for r in reasons)
        t = doc.get("time")
        return cls(_opt_float(doc.get("sm_clock_mhz")), _opt_float(doc.get("temp_c")),
                   _opt_float(doc.get("power_w")), None if slow is None else bool(slow),
                   tuple(str(r) for r in reasons), _opt_float(t))


def _opt_float(v: Any) -> float | None:
    if v is None or isinstance(v, bool):
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


@dataclass(frozen=True, slots=True)
class TelemetrySample:
    t: float  # harness model time
    wall: float  # monotonic seconds (for the sampling interval)
    reading: Reading

    def to_json(self) -> dict[str, Any]:
        r = self.reading
        row: dict[str, Any] = {"t": round(self.t, 6), "sm_clock_mhz": r.sm_clock_mhz,
                               "temp_c": r.temp_c, "power_w": r.power_w,
                               "thermal_slowdown": r.thermal_slowdown, "reasons": list(r.reasons)}
        if r.source_time is not None:
            row["source_time"] = r.source_time
        return row


# --- the spec ----------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class TelemetrySpec:
    kind: SourceKind
    url: str | None = None
    gpu_index: int = 0

    @property
    def label(self) -> str:
        if self.kind == "nvml":
            return f"nvml:{self.gpu_index}"
        if self.kind == "dcgm":
            return f"dcgm:{self.url}#gpu={self.gpu_index}"
        if self.kind in ("simserver", "agent"):
            return f"{self.kind}:{self.url}"
        return "none"


def _check_url(url: str, what: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"{what} needs an http(s) URL such as http://127.0.0.1:9400, "
                         f"not {url!r}")
    return url.rstrip("/")


def _gpu_index(text: str, what: str) -> int:
    try:
        idx = int(text)
    except ValueError:
        raise ValueError(f"{what}: the GPU index must be a whole number, not {text!r}") from None
    if idx < 0:
        raise ValueError(f"{what}: the GPU index must be 0 or more, not {idx}")
    return idx


def parse_telemetry_spec(text: str, *, target: str | None = None,
                         gpu_index: int = 0) -> TelemetrySpec:
    """`none`, `nvml[:N]`, `dcgm:URL[#gpu=N]`, `simserver[:URL]` (the target URL when left
    out), `agent:URL`. Raises ValueError with what was expected."""
    raw = (text or "").strip()
    if gpu_index < 0:
        raise ValueError(f"the GPU index must be 0 or more, not {gpu_index}")
    kind, _, rest = raw.partition(":")
    kind = kind.strip().lower()
    rest = rest.strip()
    if kind in ("", "none", "off"):
        if rest:
            raise ValueError(f"telemetry 'none' takes nothing after it, not {raw!r}")
        return TelemetrySpec("none")
    if kind == "nvml":
        return TelemetrySpec("nvml", None, _gpu_index(rest, "nvml:N") if rest else gpu_index)
    if kind == "dcgm":
        if not rest:
            raise ValueError("dcgm needs the exporter's URL: dcgm:http://HOST:9400/metrics")
        url, _, frag = rest.partition("#")
        idx = gpu_index
        if frag:
            key, eq, val = frag.partition("=")
            if key.strip() != "gpu" or not eq:
                raise ValueError(f"dcgm: the only option is #gpu=N, not #{frag}")
            idx = _gpu_index(val.strip(), "dcgm:URL#gpu=N")
        return TelemetrySpec("dcgm", _check_url(url, "dcgm"), idx)
    if kind == "simserver":
        url = rest or target or ""
        if not url:
            raise ValueError("the simserver source reads <target>/telemetry: give a target, "
                             "or write simserver:http://HOST:PORT")
        return TelemetrySpec("simserver", _check_url(url, "simserver"), gpu_index)
    if kind == "agent":
        if not rest:
            raise ValueError("agent needs the telemetry agent's URL: agent:http://HOST:9400 "
                             "(start it with `chatfleet telemetry-agent` on the engine host)")
        url = _check_url(rest, "agent")
        return TelemetrySpec("agent", url.removesuffix("/telemetry"), gpu_index)
    raise ValueError(f"unknown telemetry source {kind!r}: use one of none, nvml[:GPU], "
                     "dcgm:URL, simserver[:URL], agent:URL")


# --- NVML --------------------------------------------------------------------------------------

def _import_pynvml() -> ModuleType:
    """Import nvidia-ml-py's `pynvml` (tests replace this function)."""
    try:
        import pynvml
    except ImportError as exc:
        raise TelemetryUnavailable("NVML telemetry needs nvidia-ml-py: pip install "
                                   f"nvidia-ml-py ({exc})") from exc
    mod: ModuleType = pynvml
    return mod


class NvmlReader:
    """One GPU through NVML: blocking calls of a few microseconds each (run them in a thread
    from async code). Raises TelemetryUnavailable when NVML or the GPU is not there."""

    def __init__(self, gpu_index: int = 0, nvml: ModuleType | None = None) -> None:
        self.gpu_index = gpu_index
        self.nvml = nvml if nvml is not None else _import_pynvml()
        nv = self.nvml
        error = getattr(nv, "NVMLError", Exception)
        try:
            nv.nvmlInit()
        except error as exc:
            raise TelemetryUnavailable(f"NVML is unavailable (no NVIDIA driver or GPU here?): "
                                       f"{exc}") from exc
        try:
            count = int(nv.nvmlDeviceGetCount())
            if not 0 <= gpu_index < count:
                raise TelemetryUnavailable(f"GPU index {gpu_index} does not exist: NVML sees "
                                           f"{count} GPU(s)")
            self.handle = nv.nvmlDeviceGetHandleByIndex(gpu_index)
            name = nv.nvmlDeviceGetName(self.handle)
            self.name = name.decode() if isinstance(name, bytes) else str(name)
        except error as exc:
            with contextlib.suppress(Exception):
                nv.nvmlShutdown()
            raise TelemetryUnavailable(f"NVML cannot open GPU {gpu_index}: {exc}") from exc
        except TelemetryUnavailable:
            with contextlib.suppress(Exception):
                nv.nvmlShutdown()
            raise
        # nvmlDeviceGetCurrentClocksEventReasons since NVML 12.x; the Throttle name before
        self._reasons_fn: Callable[[Any], int] | None = (
            getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
            or getattr(nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None))
        self.t0 = time.monotonic()
        self._closed = False

    def _field(self, fn: Callable[[], Any]) -> Any:
        error = getattr(self.nvml, "NVMLError", Exception)
        try:
            return fn()
        except error:
            return None

    def read_mask(self) -> int | None:
        fn = self._reasons_fn
        if fn is None:
            return None
        v = self._field(lambda: fn(self.handle))
        return int(v) if v is not None else None

    def read(self) -> dict[str, Any]:
        """The reading as the JSON of /telemetry (the simserver's shape)."""
        nv = self.nvml
        h = self.handle
        clock = self._field(lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))
        temp = self._field(lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))
        power_mw = self._field(lambda: nv.nvmlDeviceGetPowerUsage(h))
        mask = self.read_mask()
        if clock is None and temp is None and power_mw is None:
            raise TelemetryError(f"NVML returned nothing for GPU {self.gpu_index}")
        return {
            "time": round(time.monotonic() - self.t0, 6), "unix_time": time.time(),
            "gpu": self.name, "gpu_index": self.gpu_index,
            "sm_clock_mhz": float(clock) if clock is not None else None,
            "temp_c": float(temp) if temp is not None else None,
            "power_w": round(power_mw / 1000.0, 3) if power_mw is not None else None,
            "thermal_slowdown": is_thermal(mask) if mask is not None else None,
            "clock_event_reasons": decode_reasons(mask) if mask is not None else [],
            "clock_event_mask": mask,
        }

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            with contextlib.suppress(Exception):
                self.nvml.nvmlShutdown()


# --- sources -----------------------------------------------------------------------------------

class TelemetrySource:
    """Read one GPU. `read` opens what it needs on first use; `aclose` releases it (a later
    `read` opens again), so one source serves a cool-down and then a run."""

    spec: TelemetrySpec = TelemetrySpec("none")
    has_temperature: bool = True

    @property
    def label(self) -> str:
        return self.spec.label

    async def open(self) -> None:
        """Check the source can work at all (raises TelemetryUnavailable when it cannot)."""

    async def read(self) -> Reading:
        raise TelemetryError("no telemetry source")

    async def aclose(self) -> None:
        pass


class NoneSource(TelemetrySource):
    has_temperature = False

    def __init__(self) -> None:
        self.spec = TelemetrySpec("none")


class NvmlSource(TelemetrySource):
    def __init__(self, spec: TelemetrySpec,
                 reader_factory: Callable[[int], NvmlReader] | None = None) -> None:
        self.spec = spec
        self.reader_factory = reader_factory or NvmlReader
        self.reader: NvmlReader | None = None

    async def open(self) -> None:
        if self.reader is None:
            self.reader = await asyncio.to_thread(self.reader_factory, self.spec.gpu_index)

    async def read(self) -> Reading:
        await self.open()
        assert self.reader is not None
        doc = await asyncio.to_thread(self.reader.read)
        return Reading.from_json(doc)

    async def aclose(self) -> None:
        if self.reader is not None:
            reader, self.reader = self.reader, None
            await asyncio.to_thread(reader.close)


class _HttpSource(TelemetrySource):
    def __init__(self, spec: TelemetrySpec, timeout_s: float = HTTP_TIMEOUT_S) -> None:
        self.spec = spec
        self.timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None

    def _sess(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        return self._session

    async def _fetch_text(self, url: str) -> str:
        try:
            async with self._sess().get(url) as resp:
                body = await resp.text(errors="replace")
                if resp.status != 200:
                    raise TelemetryError(f"GET {url}: HTTP {resp.status}: {body[:200]}")
                return body
        except (TimeoutError, aiohttp.ClientError, ConnectionError) as exc:
            raise TelemetryError(f"GET {url}: {type(exc).__name__}: {exc}") from exc

    async def aclose(self) -> None:
        if self._session is not None:
            sess, self._session = self._session, None
            await sess.close()


class JsonTelemetrySource(_HttpSource):
    """GET <url>/telemetry: the simserver, or the telemetry agent."""

    async def read(self) -> Reading:
        assert self.spec.url is not None
        url = self.spec.url + "/telemetry"
        text = await self._fetch_text(url)
        try:
            doc = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            raise TelemetryError(f"GET {url}: not JSON: {text[:100]!r}") from exc
        if not isinstance(doc, dict):
            raise TelemetryError(f"GET {url}: not a JSON object")
        if doc.get("error"):
            raise TelemetryError(f"GET {url}: {doc['error']}")
        return Reading.from_json(doc)


def parse_dcgm(text_or_metrics: str | Metrics, gpu_index: int = 0) -> Reading:
    """One GPU's reading from a DCGM exporter's Prometheus text (series with gpu="N")."""
    m = (text_or_metrics if isinstance(text_or_metrics, Metrics)
         else parse_prometheus(text_or_metrics, DCGM_NAMES))
    labels = {"gpu": str(gpu_index)}
    clock = m.value(DCGM_SM_CLOCK, labels, "first")
    temp = m.value(DCGM_TEMP, labels, "first")
    power = m.value(DCGM_POWER, labels, "first")
    mask_f = m.first_of(DCGM_REASONS, labels, "first")
    if clock is None and temp is None and power is None:
        seen = sorted({s.labels.get("gpu", "?") for name in (DCGM_SM_CLOCK, DCGM_TEMP)
                       for s in m.samples(name)})
        raise TelemetryError(f"the DCGM exporter reports no GPU {gpu_index} "
                             f"(gpu labels seen: {', '.join(seen) or 'none'})")
    mask = int(mask_f) if mask_f is not None else None
    return Reading(clock, temp, power,
                   is_thermal(mask) if mask is not None else None,
                   tuple(decode_reasons(mask)) if mask is not None else ())


class DcgmSource(_HttpSource):
    async def read(self) -> Reading:
        assert self.spec.url is not None
        url = self.spec.url
        if not urlsplit(url).path.strip("/"):
            url += "/metrics"
        return parse_dcgm(await self._fetch_text(url), self.spec.gpu_index)


def source_from_spec(spec: TelemetrySpec) -> TelemetrySource:
    if spec.kind == "nvml":
        return NvmlSource(spec)
    if spec.kind == "dcgm":
        return DcgmSource(spec)
    if spec.kind in ("simserver", "agent"):
        return JsonTelemetrySource(spec)
    return NoneSource()


def make_source(spec: str | TelemetrySpec | TelemetrySource,
                target: str | None = None) -> TelemetrySource:
    """A source from a spec string (see parse_telemetry_spec), a spec, or a source."""
    if isinstance(spec, TelemetrySource):
        return spec
    if isinstance(spec, str):
        spec = parse_telemetry_spec(spec, target=target)
    return source_from_spec(spec)


# --- the sampler -------------------------------------------------------------------------------

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
    the background until the block ends. Each read is bounded by `read_timeout_s`; a read that
    fails is counted in `failures` (the last reason in `last_error`), never raised. At most
    `max_samples` are kept in memory (the rest are counted in `dropped`; the file keeps all).
    The source is opened on entry, so a source that cannot work at all (no NVML, no GPU)
    raises TelemetryUnavailable there, before the run."""

    def __init__(self, source: str | TelemetrySpec | TelemetrySource, *,
                 interval_s: float = 0.1, clock: Clock | None = None,
                 path: str | Path | None = None, target: str | None = None,
                 read_timeout_s: float = 2.0, max_samples: int = 1_000_000,
                 flush_every_s: float = 1.0) -> None:
        if interval_s <= 0:
            raise ValueError("the sampling interval must be positive")
        self.source = make_source(source, target)
        self.interval_s = interval_s
        self.clock = clock or Clock()
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
        wall0 = time.monotonic()
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
        wall = (wall0 + time.monotonic()) / 2
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
        self._last_flush = time.monotonic()

    async def _run(self) -> None:
        next_at = time.monotonic()
        while True:
            await self.sample_once()
            next_at += self.interval_s
            now = time.monotonic()
            if next_at < now:  # fell behind: keep the cadence, do not burst
                next_at = now
            await asyncio.sleep(next_at - now)

    def summary(self, start: float | None = None, end: float | None = None) -> GpuBlock:
        """The contract's gpu block over start <= t <= end (model time), with the source,
        the failed reads and the samples dropped."""
        out = gpu_summary(self.samples, start, end, scale=self.clock.scale)
        assert out.sampled is not None
        return replace(out, sampled=replace(
            out.sampled, source=self.source.label, failures=self.failures,
            dropped=self.dropped or None, last_error=self.last_error,
            note=None if self.active else "no telemetry source"))


# --- cool-down ---------------------------------------------------------------------------------

async def cool_down(source: str | TelemetrySpec | TelemetrySource, below_c: float,
                    max_wait_s: float, poll_s: float = 1.0, *,
                    target: str | None = None) -> Cooldown:
    """Wait until the GPU is under `below_c`, at most `max_wait_s` (wall seconds): how long it
    waited, the start and end temperatures, whether it timed out (and a note when the source
    reports no temperature, which returns at once). Failed reads are retried until the
    bound."""
    if max_wait_s < 0 or poll_s <= 0:
        raise ValueError("max_wait_s must be 0 or more and poll_s positive")
    src = make_source(source, target)
    result = Cooldown(below_c=below_c, source=src.label)
    no_temp = "the source reports no temperature: no cool-down"
    if isinstance(src, NoneSource) or not src.has_temperature:
        return replace(result, note=no_temp)
    t0 = time.monotonic()
    end = t0 + max_wait_s
    failures = 0
    last_error: str | None = None
    start_temp: float | None = None
    timed_out = False

    async def temp() -> float | None:
        nonlocal failures, last_error
        try:
            async with asyncio.timeout(max(0.1, min(HTTP_TIMEOUT_S, end - time.monotonic()))):
                return (await src.read()).temp_c
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            failures += 1
            last_error = f"{type(exc).__name__}: {exc}"[:300]
            return None

    try:
        current = await temp()
        start_temp = current
        if current is None and failures == 0:
            return replace(result, note=no_temp)
        while current is None or current >= below_c:
            remaining = end - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            await asyncio.sleep(min(poll_s, remaining))
            t = await temp()
            if t is not None:
                current = t
                if start_temp is None:
                    start_temp = t
    finally:
        if src is not source:
            await src.aclose()
    return replace(result, waited_s=round(time.monotonic() - t0, 3), start_temp_c=start_temp,
                   end_temp_c=current, timed_out=timed_out, failures=failures or None,
                   last_error=last_error if failures else None)
