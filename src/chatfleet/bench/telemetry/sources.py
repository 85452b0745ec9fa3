"""Telemetry sources: one GPU read through NVML on this host (`NvmlSource`), an NVIDIA DCGM
exporter's Prometheus text (`DcgmSource`), the JSON of a simserver's or a telemetry agent's
`/telemetry` (`JsonTelemetrySource`), or none; `make_source` builds one from its spec."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from urllib.parse import urlsplit

import aiohttp
import orjson

from chatfleet.bench.telemetry.nvml import NvmlReader
from chatfleet.bench.telemetry.reading import (
    Reading,
    TelemetryError,
    decode_reasons,
    is_thermal,
)
from chatfleet.bench.telemetry.spec import TelemetrySpec, parse_telemetry_spec
from chatfleet.engines.prom import Metrics, parse_prometheus

HTTP_TIMEOUT_S = 2.0

DCGM_SM_CLOCK = "DCGM_FI_DEV_SM_CLOCK"
DCGM_TEMP = "DCGM_FI_DEV_GPU_TEMP"
DCGM_POWER = "DCGM_FI_DEV_POWER_USAGE"
DCGM_REASONS = ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS")
# the only series parsed from the exporter's page (read 10 times a second, on the event loop)
DCGM_NAMES = frozenset((DCGM_SM_CLOCK, DCGM_TEMP, DCGM_POWER, *DCGM_REASONS))


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
