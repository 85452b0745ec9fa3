"""What a point adds beyond the contract's figures when a live sweep ran it (`LiveRun`: the
answer-length check, the run's index, the flush verdicts, the cool-down, the clock floor, its
files, its wall time) or a fleet behind the gateway's core did (`FleetBlock`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from chatfleet.core.documents.fields import (
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
    opt_obj,
    opt_text,
    put,
    rest,
    seq,
    text,
    with_extra,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenCheck:
    """Whether the engine sent the answer lengths asked for (with ignore_eos): requests
    checked, those that differed and up to 5 examples [asked, got]; a note where the engine
    takes no ignore_eos (then nothing is checked)."""

    checked: int = 0
    mismatched: int = 0
    examples: tuple[tuple[int, int], ...] = ()
    note: str | None = None
    extra: Extra = field(default_factory=no_extra)

    def to_json(self) -> JsonObject:
        return with_extra({"checked": self.checked, "mismatched": self.mismatched,
                           "examples": [list(e) for e in self.examples], "note": self.note},
                          self.extra)

    @classmethod
    def from_json(cls, data: Any, where: str) -> TokenCheck:
        d = obj(data, where)
        examples = seq(d, "examples", where) or []
        return cls(checked=integer(d, "checked", where),
                   mismatched=integer(d, "mismatched", where),
                   examples=tuple((e[0], e[1]) for e in examples),
                   note=opt_text(d, "note", where),
                   extra=rest(d, ("checked", "mismatched", "examples", "note")))


@dataclass(frozen=True, slots=True, kw_only=True)
class Cooldown:
    """The cool-down before a run: how long it waited (wall s), the temperatures at its start
    and end, whether it ran out of time, the threshold and the source; a note when the
    source has no temperature; failed reads and the last error."""

    waited_s: float = 0.0
    start_temp_c: float | None = None
    end_temp_c: float | None = None
    timed_out: bool = False
    below_c: float | None = None
    source: str | None = None
    note: str | None = None
    failures: int | None = None
    last_error: str | None = None
    extra: Extra = field(default_factory=no_extra)

    _KEYS: ClassVar[tuple[str, ...]] = ("waited_s", "start_temp_c", "end_temp_c", "timed_out",
                                        "below_c", "source", "note", "failures", "last_error")

    def to_json(self) -> JsonObject:
        out: JsonObject = {"waited_s": self.waited_s, "start_temp_c": self.start_temp_c,
                               "end_temp_c": self.end_temp_c, "timed_out": self.timed_out,
                               "below_c": self.below_c, "source": self.source}
        put(out, "note", self.note)
        put(out, "failures", self.failures)
        put(out, "last_error", self.last_error)
        return with_extra(out, self.extra)

    @classmethod
    def from_json(cls, data: Any, where: str) -> Cooldown:
        d = obj(data, where)
        return cls(waited_s=num(d, "waited_s", where),
                   start_temp_c=opt_num(d, "start_temp_c", where),
                   end_temp_c=opt_num(d, "end_temp_c", where),
                   timed_out=boolean(d, "timed_out", where), below_c=opt_num(d, "below_c", where),
                   source=opt_text(d, "source", where), note=opt_text(d, "note", where),
                   failures=opt_int(d, "failures", where),
                   last_error=opt_text(d, "last_error", where), extra=rest(d, cls._KEYS))


@dataclass(frozen=True, slots=True, kw_only=True)
class RunFiles:
    """A live run's files, relative to the sweep directory."""

    telemetry: str
    engine: str
    records: str | None = None
    extra: Extra = field(default_factory=no_extra)

    def to_json(self) -> JsonObject:
        out: JsonObject = {"telemetry": self.telemetry, "engine": self.engine}
        put(out, "records", self.records)
        return with_extra(out, self.extra)

    def get(self, kind: str) -> str | None:
        """The path of a run file by kind (telemetry, engine, records)."""
        if kind in ("telemetry", "engine", "records"):
            value: str | None = getattr(self, kind)
            return value
        got = self.extra.get(kind)
        return got if isinstance(got, str) else None

    @classmethod
    def from_json(cls, data: Any, where: str) -> RunFiles:
        d = obj(data, where)
        return cls(telemetry=text(d, "telemetry", where), engine=text(d, "engine", where),
                   records=opt_text(d, "records", where),
                   extra=rest(d, ("telemetry", "engine", "records")))


@dataclass(frozen=True, slots=True, kw_only=True)
class PromptTexts:
    """A chat run's prompt texts (docs/sweep.md): how many were built before its clock started
    and the seconds that took, how many the lookahead built during the run, and the requests
    that waited for theirs at their send time, in the window (`late`) and over the run
    (`run_late`)."""

    built_ahead: int = 0
    ahead_s: float = 0.0
    built_in_run: int = 0
    late: int = 0
    run_late: int = 0
    extra: Extra = field(default_factory=no_extra)

    _KEYS: ClassVar[tuple[str, ...]] = ("built_ahead", "ahead_s", "built_in_run", "late",
                                        "run_late")

    def to_json(self) -> JsonObject:
        return with_extra({"built_ahead": self.built_ahead, "ahead_s": self.ahead_s,
                           "built_in_run": self.built_in_run, "late": self.late,
                           "run_late": self.run_late}, self.extra)

    @classmethod
    def from_json(cls, data: Any, where: str) -> PromptTexts:
        d = obj(data, where)
        return cls(built_ahead=integer(d, "built_ahead", where), ahead_s=num(d, "ahead_s", where),
                   built_in_run=integer(d, "built_in_run", where),
                   late=integer(d, "late", where), run_late=integer(d, "run_late", where),
                   extra=rest(d, cls._KEYS))


@dataclass(frozen=True, slots=True, kw_only=True)
class LiveRun:
    """What a live sweep's run adds to its point: the answer-length check, the run's index
    (its seed is the base seed + the index), the flush verdicts where a flush needed proving,
    the cool-down before it (None when none was asked), the clock floor it was held to, its
    files, its wall time and, for the chat API, its prompt texts."""

    run_index: int
    token_check: TokenCheck | None = None
    flush_check: tuple[Mapping[str, Any], ...] | None = None
    cooldown: Cooldown | None = None
    clock_floor_mhz: float | None = None
    files: RunFiles | None = None
    wall_s: float | None = None
    prompt_texts: PromptTexts | None = None

    KEYS: ClassVar[tuple[str, ...]] = ("token_check", "run_index", "flush_check", "cooldown",
                                       "clock_floor_mhz", "files", "wall_s", "prompt_texts")

    def write(self, out: JsonObject) -> None:
        if self.token_check is not None:
            out["token_check"] = self.token_check.to_json()
        out["run_index"] = self.run_index
        if self.flush_check:
            out["flush_check"] = [dict(c) for c in self.flush_check]
        out["cooldown"] = None if self.cooldown is None else self.cooldown.to_json()
        out["clock_floor_mhz"] = self.clock_floor_mhz
        if self.files is not None:
            out["files"] = self.files.to_json()
        put(out, "wall_s", self.wall_s)
        if self.prompt_texts is not None:
            out["prompt_texts"] = self.prompt_texts.to_json()

    @classmethod
    def from_json(cls, d: Mapping[str, Any], where: str) -> LiveRun:
        checks = seq(d, "flush_check", where)
        token = d.get("token_check")
        cool = d.get("cooldown")
        files = d.get("files")
        texts = d.get("prompt_texts")
        return cls(run_index=integer(d, "run_index", where),
                   token_check=None if token is None
                   else TokenCheck.from_json(token, f"{where}: token_check"),
                   flush_check=None if checks is None
                   else tuple(obj(c, f"{where}: flush_check") for c in checks),
                   cooldown=None if cool is None else Cooldown.from_json(cool,
                                                                         f"{where}: cooldown"),
                   clock_floor_mhz=opt_num(d, "clock_floor_mhz", where),
                   files=None if files is None else RunFiles.from_json(files, f"{where}: files"),
                   wall_s=opt_num(d, "wall_s", where),
                   prompt_texts=None if texts is None
                   else PromptTexts.from_json(texts, f"{where}: prompt_texts"))


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetBlock:
    """A point run through a fleet behind the gateway's admission and routing: the fleet's
    settings (replicas, cap per replica, queue depth, TTFT budget, prefill reserve, session
    affinity, gateway hop) and what it did: the most requests in flight per replica, the
    queue's peak, sheds by reason, admissions, routes by rule; a live fleet reports the peak
    in flight each replica's own trace saw. `learn_reserve`: the deadline's reserve was
    learned per replica (`reserve_s`: each replica's at the end of the run); `spill`: the
    routing's spill rule (cost, full, never)."""

    replicas: int = 1
    cap: int = 0
    queue_depth: int | None = None
    ttft_budget_s: float | None = None
    prefill_reserve_s: float | None = None
    affinity: bool | None = None
    hop_s: float | None = None
    max_in_flight: tuple[int, ...] | None = None
    max_queue: int | None = None
    shed: Mapping[str, int] | None = None
    admitted: int | None = None
    routes: Mapping[str, int] | None = None
    max_in_flight_seen_by_replicas: Mapping[str, int] | None = None
    learn_reserve: bool | None = None
    spill: str | None = None
    reserve_s: Mapping[str, float] | None = None
    extra: Extra = field(default_factory=no_extra)

    _KEYS: ClassVar[tuple[str, ...]] = (
        "replicas", "cap", "queue_depth", "ttft_budget_s", "prefill_reserve_s", "affinity",
        "hop_s", "max_in_flight", "max_queue", "shed", "admitted", "routes",
        "max_in_flight_seen_by_replicas", "learn_reserve", "spill", "reserve_s")

    def to_json(self) -> JsonObject:
        out: JsonObject = {"replicas": self.replicas, "cap": self.cap}
        for key in self._KEYS[2:]:
            value = getattr(self, key)
            if isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, Mapping):
                value = dict(value)
            put(out, key, value)
        return with_extra(out, self.extra)

    @classmethod
    def from_json(cls, data: Any, where: str) -> FleetBlock:
        d = obj(data, where)
        peaks = seq(d, "max_in_flight", where)
        shed, routes = opt_obj(d, "shed", where), opt_obj(d, "routes", where)
        seen = opt_obj(d, "max_in_flight_seen_by_replicas", where)
        reserves = opt_obj(d, "reserve_s", where)
        return cls(replicas=integer(d, "replicas", where, 1), cap=integer(d, "cap", where),
                   queue_depth=opt_int(d, "queue_depth", where),
                   ttft_budget_s=opt_num(d, "ttft_budget_s", where),
                   prefill_reserve_s=opt_num(d, "prefill_reserve_s", where),
                   affinity=opt_bool(d, "affinity", where), hop_s=opt_num(d, "hop_s", where),
                   max_in_flight=None if peaks is None else tuple(peaks),
                   max_queue=opt_int(d, "max_queue", where),
                   shed=None if shed is None else dict(shed),
                   admitted=opt_int(d, "admitted", where),
                   routes=None if routes is None else dict(routes),
                   max_in_flight_seen_by_replicas=None if seen is None else dict(seen),
                   learn_reserve=opt_bool(d, "learn_reserve", where),
                   spill=opt_text(d, "spill", where),
                   reserve_s=None if reserves is None else dict(reserves),
                   extra=rest(d, cls._KEYS))

