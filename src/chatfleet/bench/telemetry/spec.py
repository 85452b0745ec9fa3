"""Which source to read, as the command line names it (`parse_telemetry_spec`): `none`,
`nvml[:N]`, `dcgm:URL[#gpu=N]`, `simserver[:URL]`, `agent:URL`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

from chatfleet.core.errors import ChatfleetError

SourceKind = Literal["nvml", "dcgm", "simserver", "agent", "none"]
KINDS: tuple[SourceKind, ...] = ("nvml", "dcgm", "simserver", "agent", "none")


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
        raise ChatfleetError(f"{what} needs an http(s) URL such as http://127.0.0.1:9400, "
                             f"not {url!r}")
    return url.rstrip("/")


def _gpu_index(text: str, what: str) -> int:
    try:
        idx = int(text)
    except ValueError:
        raise ChatfleetError(f"{what}: the GPU index must be a whole number, "
                             f"not {text!r}") from None
    if idx < 0:
        raise ChatfleetError(f"{what}: the GPU index must be 0 or more, not {idx}")
    return idx


def parse_telemetry_spec(text: str, *, target: str | None = None,
                         gpu_index: int = 0) -> TelemetrySpec:
    """`none`, `nvml[:N]`, `dcgm:URL[#gpu=N]`, `simserver[:URL]` (the target URL when left
    out), `agent:URL`. Raises ValueError with what was expected."""
    raw = (text or "").strip()
    if gpu_index < 0:
        raise ChatfleetError(f"the GPU index must be 0 or more, not {gpu_index}")
    kind, _, rest = raw.partition(":")
    kind = kind.strip().lower()
    rest = rest.strip()
    if kind in ("", "none", "off"):
        if rest:
            raise ChatfleetError(f"telemetry 'none' takes nothing after it, not {raw!r}")
        return TelemetrySpec("none")
    if kind == "nvml":
        return TelemetrySpec("nvml", None, _gpu_index(rest, "nvml:N") if rest else gpu_index)
    if kind == "dcgm":
        if not rest:
            raise ChatfleetError("dcgm needs the exporter's URL: dcgm:http://HOST:9400/metrics")
        url, _, frag = rest.partition("#")
        idx = gpu_index
        if frag:
            key, eq, val = frag.partition("=")
            if key.strip() != "gpu" or not eq:
                raise ChatfleetError(f"dcgm: the only option is #gpu=N, not #{frag}")
            idx = _gpu_index(val.strip(), "dcgm:URL#gpu=N")
        return TelemetrySpec("dcgm", _check_url(url, "dcgm"), idx)
    if kind == "simserver":
        url = rest or target or ""
        if not url:
            raise ChatfleetError("the simserver source reads <target>/telemetry: give a target, "
                                 "or write simserver:http://HOST:PORT")
        return TelemetrySpec("simserver", _check_url(url, "simserver"), gpu_index)
    if kind == "agent":
        if not rest:
            raise ChatfleetError("agent needs the telemetry agent's URL: agent:http://HOST:9400 "
                                 "(start it with `chatfleet telemetry-agent` on the engine host)")
        url = _check_url(rest, "agent")
        return TelemetrySpec("agent", url.removesuffix("/telemetry"), gpu_index)
    raise ChatfleetError(f"unknown telemetry source {kind!r}: use one of none, nvml[:GPU], "
                         "dcgm:URL, simserver[:URL], agent:URL")
