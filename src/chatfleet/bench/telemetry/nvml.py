"""NVML on this host: one GPU's clock, temperature, power and clock-event reasons through
nvidia-ml-py (imported when first used). The NVML source and the telemetry agent both read
through `NvmlReader`."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from chatfleet.bench.telemetry.reading import (
    TelemetryError,
    TelemetryUnavailable,
    decode_reasons,
    is_thermal,
)


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
