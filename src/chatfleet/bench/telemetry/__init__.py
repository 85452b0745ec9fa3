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

Modules: `spec` (which source), `reading` (what a source reads), `nvml` (NVML on this host),
`sources` (NVML, DCGM, the JSON of /telemetry), `sampler` (the background sampler and the gpu
block), `cooldown` (the wait between runs).
"""

from chatfleet.bench.telemetry.cooldown import cool_down
from chatfleet.bench.telemetry.nvml import NvmlReader
from chatfleet.bench.telemetry.reading import (
    CLOCK_EVENT_REASONS,
    THERMAL_MASK,
    Reading,
    TelemetryError,
    TelemetrySample,
    TelemetryUnavailable,
    decode_reasons,
    is_thermal,
)
from chatfleet.bench.telemetry.sampler import TelemetrySampler, below_clock_floor, gpu_summary
from chatfleet.bench.telemetry.sources import (
    DCGM_NAMES,
    DCGM_POWER,
    DCGM_REASONS,
    DCGM_SM_CLOCK,
    DCGM_TEMP,
    HTTP_TIMEOUT_S,
    DcgmSource,
    JsonTelemetrySource,
    NoneSource,
    NvmlSource,
    TelemetrySource,
    make_source,
    parse_dcgm,
    source_from_spec,
)
from chatfleet.bench.telemetry.spec import KINDS, SourceKind, TelemetrySpec, parse_telemetry_spec

__all__ = [
    "CLOCK_EVENT_REASONS",
    "DCGM_NAMES",
    "DCGM_POWER",
    "DCGM_REASONS",
    "DCGM_SM_CLOCK",
    "DCGM_TEMP",
    "HTTP_TIMEOUT_S",
    "KINDS",
    "THERMAL_MASK",
    "DcgmSource",
    "JsonTelemetrySource",
    "NoneSource",
    "NvmlReader",
    "NvmlSource",
    "Reading",
    "SourceKind",
    "TelemetryError",
    "TelemetrySample",
    "TelemetrySampler",
    "TelemetrySource",
    "TelemetrySpec",
    "TelemetryUnavailable",
    "below_clock_floor",
    "cool_down",
    "decode_reasons",
    "gpu_summary",
    "is_thermal",
    "make_source",
    "parse_dcgm",
    "parse_telemetry_spec",
    "source_from_spec",
]
