"""The chatfleet.sweep/1 document, typed: what every sweep writes (twin and live alike).

```
SweepDoc        schema, target, workload, slo, points, knee, knee_rate, throughput_peak,
                recommended_cap, cap_margin
  SweepPoint    load, seed, flushed, valid, invalid_reason, duration_s, requests, output_tok_s,
                request_rps, goodput_rps, attainment, admitted_attainment, ttft_ms, itl_ms,
                tpot_ms, e2e_ms, cached_token_share, engine, gpu, client, itl_stat,
                itl_estimated, thin, in_flight_max, window_s, time_scale, window_cycles,
                few_cycles
                + a live run's extras (LiveRun: token_check, run_index, flush_check, cooldown,
                  clock_floor_mhz, files, wall_s, prompt_texts) or a fleet's (FleetBlock:
                  fleet)
    Load        ClosedLoad {"mode": "closed", "concurrency": N}
                | OpenLoad {"mode": "open", "rate_rps": R, "arrival": ..., "burstiness": B}
    Quantiles   ttft_ms, itl_ms, tpot_ms, e2e_ms: p50, p90, p99, max, n
    EngineBlock max_running, max_queue, peak_token_usage (+ the twin's or the scraper's figures)
    GpuBlock    sm_clock_mhz {p50, min}, temp_c {max}, thermal_slowdown_share
                + ModelledGpu (the twin) or SampledGpu (live telemetry)
    ClientBlock send_lag_ms_p99, loop_lag_ms_p99 (+ the live client's maxima and bounds)
```

`to_json` / `from_json` are the file boundary: producers build these types, consumers read
attributes. The JSON keys, their order and the numbers' formatting are the contract's
(docs/metrics.md); `core/documents/fields.py` says how a file reads and writes back the same
and where unknown keys go.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from chatfleet.core.documents.blocks import (
    ClientBlock,
    ClockStats,
    EngineBlock,
    GpuBlock,
    ModelledGpu,
    ModelledPower,
    Quantiles,
    RequestCounts,
    SampledGpu,
    SampledPower,
    TempStats,
)
from chatfleet.core.documents.extras import (
    Cooldown,
    FleetBlock,
    LiveRun,
    PromptTexts,
    RunFiles,
    TokenCheck,
)
from chatfleet.core.documents.fields import (
    DocumentError,
    Extra,
    JsonObject,
    boolean,
    integer,
    no_extra,
    num,
    obj,
    opt_bool,
    opt_int,
    opt_num,
    opt_text,
    put,
    rest,
    seq,
    with_extra,
)
from chatfleet.core.documents.load import (
    MODES,
    ClosedLoad,
    Load,
    Mode,
    OpenLoad,
    check_mode,
    load_from_json,
)
from chatfleet.core.slo import SLO

__all__ = [  # the sweep document's types, wherever they live
    "MODES", "SCHEMA", "ClientBlock", "ClockStats", "ClosedLoad", "Cooldown", "EngineBlock",
    "FleetBlock", "GpuBlock", "Knee", "LiveRun", "Load", "Mode", "ModelledGpu", "ModelledPower",
    "OpenLoad", "Peak", "PromptTexts", "Quantiles", "RequestCounts", "RunFiles", "SampledGpu",
    "SampledPower", "SweepDoc", "SweepPoint", "Target", "TempStats", "TokenCheck", "check_mode",
    "load_from_json", "points_from_json", "valid_points",
]

SCHEMA = "chatfleet.sweep/1"


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepPoint:
    """One entry of a sweep's "points": a load run once (docs/metrics.md defines every
    figure; `core.measure.point.summarize_point` computes them). A point is built once, by
    its runner, with everything it holds."""

    load: Load
    seed: int = 0
    flushed: bool = False
    valid: bool = False
    invalid_reason: str | None = None
    duration_s: float = 0.0
    requests: RequestCounts = field(default_factory=RequestCounts)
    output_tok_s: float = 0.0
    request_rps: float = 0.0
    goodput_rps: float = 0.0
    attainment: float = 0.0
    admitted_attainment: float | None = None
    ttft_ms: Quantiles = field(default_factory=Quantiles)
    itl_ms: Quantiles = field(default_factory=Quantiles)
    tpot_ms: Quantiles = field(default_factory=Quantiles)
    e2e_ms: Quantiles = field(default_factory=Quantiles)
    cached_token_share: float = 0.0
    engine: EngineBlock = field(default_factory=EngineBlock)
    gpu: GpuBlock = field(default_factory=GpuBlock)
    client: ClientBlock = field(default_factory=ClientBlock)
    itl_stat: str | None = None
    itl_estimated: bool | None = None
    thin: bool | None = None
    in_flight_max: int | None = None
    window_s: tuple[float, float] | None = None
    time_scale: float | None = None
    window_cycles: float | None = None
    few_cycles: bool | None = None
    live: LiveRun | None = None
    fleet: FleetBlock | None = None
    extra: Extra = field(default_factory=no_extra)

    _KEYS: ClassVar[tuple[str, ...]] = (
        "load", "seed", "flushed", "valid", "invalid_reason", "duration_s", "requests",
        "output_tok_s", "request_rps", "goodput_rps", "attainment", "admitted_attainment",
        "ttft_ms", "itl_ms", "tpot_ms", "e2e_ms", "cached_token_share", "engine", "gpu",
        "client", "itl_stat", "itl_estimated", "thin", "in_flight_max", "window_s",
        "time_scale", "window_cycles", "few_cycles", "fleet")

    @property
    def mode(self) -> Mode:
        return self.load.mode

    @property
    def run_index(self) -> int | None:
        """A live run's index, None for a twin point."""
        return None if self.live is None else self.live.run_index

    def quantiles(self, block: str) -> Quantiles:
        """A percentile block by its key: ttft_ms, itl_ms, tpot_ms or e2e_ms."""
        if block not in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"):
            raise KeyError(block)
        got: Quantiles = getattr(self, block)
        return got

    def to_json(self) -> JsonObject:
        out: JsonObject = {
            "load": self.load.to_json(),
            "seed": self.seed,
            "flushed": self.flushed,
            "valid": self.valid,
            "invalid_reason": self.invalid_reason,
            "duration_s": self.duration_s,
            "requests": self.requests.to_json(),
            "output_tok_s": self.output_tok_s,
            "request_rps": self.request_rps,
            "goodput_rps": self.goodput_rps,
            "attainment": self.attainment,
        }
        put(out, "admitted_attainment", self.admitted_attainment)
        out.update(ttft_ms=self.ttft_ms.to_json(), itl_ms=self.itl_ms.to_json(),
                   tpot_ms=self.tpot_ms.to_json(), e2e_ms=self.e2e_ms.to_json(),
                   cached_token_share=self.cached_token_share, engine=self.engine.to_json(),
                   gpu=self.gpu.to_json(), client=self.client.to_json())
        put(out, "itl_stat", self.itl_stat)
        put(out, "itl_estimated", self.itl_estimated)
        put(out, "thin", self.thin)
        put(out, "in_flight_max", self.in_flight_max)
        if self.window_s is not None:
            out["window_s"] = list(self.window_s)
        put(out, "time_scale", self.time_scale)
        put(out, "window_cycles", self.window_cycles)
        put(out, "few_cycles", self.few_cycles)
        if self.live is not None:
            self.live.write(out)
        if self.fleet is not None:
            out["fleet"] = self.fleet.to_json()
        return with_extra(out, self.extra)

    @classmethod
    def from_json(cls, data: Any, where: str = "point") -> SweepPoint:
        d = obj(data, where)
        if "load" not in d:
            raise DocumentError(f"{where}: a sweep point needs a load "
                                "{'mode': 'closed'|'open', ...}")
        live = LiveRun.from_json(d, where) if "run_index" in d else None
        window = seq(d, "window_s", where)
        fleet = d.get("fleet")

        def block(key: str) -> Any:
            return d.get(key) or {}

        return cls(
            load=load_from_json(d["load"], f"{where}: load"),
            seed=integer(d, "seed", where), flushed=boolean(d, "flushed", where),
            valid=boolean(d, "valid", where), invalid_reason=opt_text(d, "invalid_reason", where),
            duration_s=num(d, "duration_s", where),
            requests=RequestCounts.from_json(block("requests"), f"{where}: requests"),
            output_tok_s=num(d, "output_tok_s", where), request_rps=num(d, "request_rps", where),
            goodput_rps=num(d, "goodput_rps", where), attainment=num(d, "attainment", where),
            admitted_attainment=opt_num(d, "admitted_attainment", where),
            ttft_ms=Quantiles.from_json(block("ttft_ms"), f"{where}: ttft_ms"),
            itl_ms=Quantiles.from_json(block("itl_ms"), f"{where}: itl_ms"),
            tpot_ms=Quantiles.from_json(block("tpot_ms"), f"{where}: tpot_ms"),
            e2e_ms=Quantiles.from_json(block("e2e_ms"), f"{where}: e2e_ms"),
            cached_token_share=num(d, "cached_token_share", where),
            engine=EngineBlock.from_json(block("engine"), f"{where}: engine"),
            gpu=GpuBlock.from_json(block("gpu"), f"{where}: gpu"),
            client=ClientBlock.from_json(block("client"), f"{where}: client"),
            itl_stat=opt_text(d, "itl_stat", where),
            itl_estimated=opt_bool(d, "itl_estimated", where), thin=opt_bool(d, "thin", where),
            in_flight_max=opt_int(d, "in_flight_max", where),
            window_s=None if window is None else (window[0], window[1]),
            time_scale=opt_num(d, "time_scale", where),
            window_cycles=opt_num(d, "window_cycles", where),
            few_cycles=opt_bool(d, "few_cycles", where), live=live,
            fleet=None if fleet is None else FleetBlock.from_json(fleet, f"{where}: fleet"),
            extra=rest(d, (*cls._KEYS, *(LiveRun.KEYS if live is not None else ()))),
        )


# --------------------------------------------------------------------------------------------
# The document


@dataclass(frozen=True, slots=True)
class Knee:
    """A knee bracket of one load mode: `meets`, the highest tested load that meets the target
    attainment with every lower load, and `fails`, the next tested load above it (None where
    there is none)."""

    meets: float | None = None
    fails: float | None = None
    extra: Extra = field(default_factory=no_extra)

    def to_json(self) -> JsonObject:
        return with_extra({"meets": self.meets, "fails": self.fails}, self.extra)

    @classmethod
    def from_json(cls, data: Any, where: str) -> Knee:
        d = obj(data, where)
        return cls(opt_num(d, "meets", where), opt_num(d, "fails", where),
                   rest(d, ("meets", "fails")))


@dataclass(frozen=True, slots=True)
class Peak:
    """The valid point of highest output tok/s (closed loop first): its load and mode, None
    when no point is valid. Reported beside the knee, never used for the limit."""

    load: float | None = None
    output_tok_s: float = 0.0
    mode: Mode | None = None
    extra: Extra = field(default_factory=no_extra)

    def to_json(self) -> JsonObject:
        return with_extra({"load": self.load, "output_tok_s": self.output_tok_s,
                           "mode": self.mode}, self.extra)

    @classmethod
    def from_json(cls, data: Any, where: str) -> Peak:
        d = obj(data, where)
        mode = opt_text(d, "mode", where)
        return cls(opt_num(d, "load", where), num(d, "output_tok_s", where),
                   None if mode is None else check_mode(mode),
                   rest(d, ("load", "output_tok_s", "mode")))


@dataclass(frozen=True, slots=True)
class Target:
    """What was measured, as its producer wrote it (the engine, model, GPU, precisions,
    versions, flags; the twin's spec and calibration; a live sweep's URLs and engine info),
    kept in its producer's order, with typed reads of the keys consumers need."""

    fields: Mapping[str, Any] = field(default_factory=no_extra)

    def _str(self, key: str) -> str | None:
        value = self.fields.get(key)
        return value if isinstance(value, str) else None

    @property
    def engine(self) -> str | None:
        return self._str("engine")

    @property
    def model(self) -> str | None:
        return self._str("model")

    @property
    def gpu(self) -> str | None:
        return self._str("gpu")

    @property
    def weights(self) -> str | None:
        return self._str("weights")

    @property
    def kv_cache(self) -> str | None:
        return self._str("kv_cache")

    @property
    def engine_model(self) -> str | None:
        return self._str("engine_model")

    def get(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)

    def to_json(self) -> JsonObject:
        return dict(self.fields)


@dataclass(frozen=True, slots=True)
class SweepDoc:
    """A whole sweep: what was measured, the workload (every parameter, in its producer's
    order), the target, every point (invalid ones with their reason), the closed-loop knee,
    the open-loop knee in requests/s, the throughput peak, the recommended gateway cap and
    the cap margin it was lowered by (absent in documents older than it)."""

    target: Target
    workload: Mapping[str, Any]
    slo: SLO
    points: tuple[SweepPoint, ...]
    knee: Knee = field(default_factory=Knee)
    knee_rate: Knee = field(default_factory=Knee)
    throughput_peak: Peak = field(default_factory=Peak)
    recommended_cap: int | None = None
    cap_margin: int | None = None
    schema: str = SCHEMA
    slo_extra: Extra = field(default_factory=no_extra)
    extra: Extra = field(default_factory=no_extra)

    _KEYS: ClassVar[tuple[str, ...]] = (
        "schema", "target", "workload", "slo", "points", "knee", "knee_rate", "throughput_peak",
        "recommended_cap", "cap_margin")

    def has_mode(self, mode: Mode) -> bool:
        return any(p.load.mode == mode for p in self.points)

    def to_json(self) -> JsonObject:
        out: JsonObject = {
            "schema": self.schema,
            "target": self.target.to_json(),
            "workload": dict(self.workload),
            "slo": with_extra(self.slo.to_json(), self.slo_extra),
            "points": [p.to_json() for p in self.points],
            "knee": self.knee.to_json(),
            "knee_rate": self.knee_rate.to_json(),
            "throughput_peak": self.throughput_peak.to_json(),
            "recommended_cap": self.recommended_cap,
        }
        put(out, "cap_margin", self.cap_margin)
        return with_extra(out, self.extra)

    @classmethod
    def from_json(cls, data: Any, where: str = "sweep") -> SweepDoc:
        """A chatfleet.sweep/1 document (DocumentError for another schema or a bad shape)."""
        d = obj(data, where)
        schema = d.get("schema")
        if schema != SCHEMA:
            raise DocumentError(f"{where}: schema is {schema!r}, not {SCHEMA!r}")
        points = seq(d, "points", where) or []
        slo_data = obj(d.get("slo") or {}, f"{where}: slo")
        try:
            slo = SLO.from_json(slo_data)
        except (TypeError, ValueError) as exc:
            raise DocumentError(f"{where}: bad 'slo' block: {exc}") from exc
        return cls(
            target=Target(dict(obj(d.get("target") or {}, f"{where}: target"))),
            workload=dict(obj(d.get("workload") or {}, f"{where}: workload")),
            slo=slo,
            points=tuple(SweepPoint.from_json(p, f"{where}, point {i}")
                         for i, p in enumerate(points)),
            knee=Knee.from_json(d.get("knee") or {}, f"{where}: knee"),
            knee_rate=Knee.from_json(d.get("knee_rate") or {}, f"{where}: knee_rate"),
            throughput_peak=Peak.from_json(d.get("throughput_peak") or {},
                                           f"{where}: throughput_peak"),
            recommended_cap=opt_int(d, "recommended_cap", where),
            cap_margin=opt_int(d, "cap_margin", where),
            schema=SCHEMA,
            slo_extra=rest(slo_data, ("ttft_ms", "tpot_ms", "itl_stat", "attainment")),
            extra=rest(d, cls._KEYS),
        )


def valid_points(points: Iterable[SweepPoint], mode: Mode | None = None) -> list[SweepPoint]:
    """The valid points (of one mode)."""
    return [p for p in points if p.valid and (mode is None or p.load.mode == mode)]


def points_from_json(rows: Sequence[Any], where: str) -> list[SweepPoint]:
    return [SweepPoint.from_json(r, f"{where}, run {i}") for i, r in enumerate(rows)]
