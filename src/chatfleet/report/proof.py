"""The live proof: a gateway run past the fleet's cap, reported as what it is (did the cap hold,
what was shed, how the admitted users fared, each replica's own peak in flight, the twin's
prediction beside it), never as a sweep with a knee.

A `chatfleet.live-proof/1` document (`chatfleet demo` writes DIR/live/proof.json)::

    {"schema": "chatfleet.live-proof/1",
     "target": {"gpu": "l4", "model": "qwen3-8b", "weights": "fp8", "kv_cache": "fp8",
                "engine": "simserver", "via": "chatfleet gateway"},
     "replicas": 2, "cap_per_replica": 24,
     "load": {"mode": "closed", "concurrency": 96}, "load_multiple": 2.0,
     "duration_s": 60.0, "warmup_s": 20.0,
     "live": {"attempts": 1468, "completed": 249, "shed": 1219, "shed_with_retry_after": 1219,
              "retry_after_s_p50": 1.0, "failed": 0, "admitted_attainment": 0.996,
              "attainment": 0.169, "ttft_p99_ms": 983.0, "tpot_p99_ms": 96.6,
              "goodput_rps": 4.13, "peak_in_flight": {"replica-0": 24, "replica-1": 24}},
     "twin": {... the same keys, the twin's prediction of the same run ...},
     "peak_in_flight_source": "the replicas' own traces (trace.jsonl)",
     "files": {"sweep": "sweep.json", "trace": "trace.jsonl", "records": "records.jsonl"}}

Only `schema`, `replicas`, `cap_per_replica` and `live.peak_in_flight` are required; a missing
figure is shown as a dash. Bad input is a `ReportInputError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chatfleet.core.documents.fields import DocumentError
from chatfleet.core.documents.sweep import load_from_json
from chatfleet.report import human
from chatfleet.report.human import DASH
from chatfleet.report.load import ReportInputError, number, read_json
from chatfleet.report.tables import Table, load_text

PROOF_SCHEMA = "chatfleet.live-proof/1"
SIDES = (("live", "live"), ("twin", "twin (predicted)"))


@dataclass(frozen=True, slots=True)
class LiveProof:
    source: Path
    doc: dict[str, Any]

    @property
    def cap(self) -> int:
        return int(self.doc["cap_per_replica"])

    @property
    def replicas(self) -> int:
        return int(self.doc["replicas"])

    def side(self, name: str) -> Mapping[str, Any]:
        block = self.doc.get(name)
        return block if isinstance(block, Mapping) else {}

    def peaks(self, name: str = "live") -> dict[str, float]:
        """Each replica's most requests in flight at once (running + queued in its engine)."""
        peaks = self.side(name).get("peak_in_flight")
        if not isinstance(peaks, Mapping):
            return {}
        out: dict[str, float] = {}
        for name, value in sorted(peaks.items()):
            x = number(value)
            if x is not None:
                out[str(name)] = x
        return out

    @property
    def held(self) -> bool:
        """Every replica's own peak in flight at or under the cap."""
        peaks = self.peaks()
        return bool(peaks) and all(v <= self.cap for v in peaks.values())


def _positive_int(doc: Mapping[str, Any], key: str, where: str) -> int:
    value = doc.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ReportInputError(f"{where}: {key!r} must be a whole number >= 1, not {value!r}")
    return value


def load_live_proof(path: str | Path) -> LiveProof:
    """Read and check a chatfleet.live-proof/1 document."""
    src = Path(path)
    if not src.is_file():
        raise ReportInputError(f"no such live proof file: {src}")
    doc = read_json(src, "live proof")
    where = str(src)
    if not isinstance(doc, dict):
        raise ReportInputError(f"{where} is not a live proof: expected a JSON object")
    if doc.get("schema") != PROOF_SCHEMA:
        raise ReportInputError(f"{where}: schema {doc.get('schema')!r} is not {PROOF_SCHEMA!r}")
    _positive_int(doc, "replicas", where)
    _positive_int(doc, "cap_per_replica", where)
    for key in ("live", "twin", "load", "target"):
        if not isinstance(doc.get(key, {}), dict):
            raise ReportInputError(f"{where}: {key!r} must be a JSON object")
    peaks = doc.get("live", {}).get("peak_in_flight")
    if not isinstance(peaks, dict) or not peaks or any(number(v) is None
                                                       for v in peaks.values()):
        raise ReportInputError(f"{where}: 'live.peak_in_flight' must map each replica to the "
                               "most requests it held at once")
    return LiveProof(src, doc)


def _multiple(proof: LiveProof) -> str:
    m = number(proof.doc.get("load_multiple"))
    return DASH if m is None else f"{m:g}×"


def _load(proof: LiveProof) -> str:
    load = proof.doc.get("load")
    if not isinstance(load, Mapping) or load.get("mode") not in ("closed", "open"):
        return DASH
    try:
        return load_text(load_from_json(load))
    except DocumentError:
        return DASH


def headline(proof: LiveProof) -> str:
    """"The cap held with 2× the fleet's cap offered: 96 users on 2 replicas at cap 24 each
    (48 in all); peak in flight per replica (its own trace): replica-0 24/24, replica-1
    24/24." (or "did NOT hold" when a replica's own peak is over the cap)."""
    cap = proof.cap
    peaks = proof.peaks()
    each = ", ".join(f"{name} {human.whole(v)}/{cap}" for name, v in peaks.items())
    verdict = "The cap held" if proof.held else "The cap did NOT hold"
    return (f"{verdict} with {_multiple(proof)} the fleet's cap offered: {_load(proof)} on "
            f"{proof.replicas} replicas at cap {cap} each ({cap * proof.replicas} in all); "
            f"peak in flight per replica (its own trace): {each}.")


def _shed(side: Mapping[str, Any]) -> str:
    text = human.count(side.get("shed"))
    with_ra = side.get("shed_with_retry_after")
    if number(with_ra) is not None:
        wait = number(side.get("retry_after_s_p50"))
        text += f" ({human.count(with_ra)} with Retry-After"
        text += f", median {human.rate(wait)} s)" if wait is not None else ")"
    return text


def _ms(value: Any) -> str:
    text = human.ms(value)
    return text if text == DASH else f"{text} ms"


def outcome_table(proof: LiveProof) -> Table:
    """Rows: attempts, completed, shed, failed, attainments, latencies, goodput; one column for
    the live run and one for the twin's prediction of it."""
    sides = [(key, name) for key, name in SIDES if proof.side(key)]
    rows: list[list[str]] = []

    def add(name: str, cell: Any) -> None:
        rows.append([name, *[cell(proof.side(key)) for key, _ in sides]])

    add("attempts (retries of shed users included)", lambda s: human.count(s.get("attempts")))
    add("completed", lambda s: human.count(s.get("completed")))
    add("shed (429)", _shed)
    add("failed", lambda s: human.count(s.get("failed")))
    add("admitted attainment (met / admitted)", lambda s: human.share(
        s.get("admitted_attainment")))
    add("attainment (met / attempts)", lambda s: human.share(s.get("attainment")))
    add("TTFT p99", lambda s: _ms(s.get("ttft_p99_ms")))
    add("TPOT p99", lambda s: _ms(s.get("tpot_p99_ms")))
    add("goodput rps", lambda s: human.rate(s.get("goodput_rps")))
    notes = [f"Measurement window {human.rate(proof.doc.get('duration_s'))} s after a "
             f"{human.rate(proof.doc.get('warmup_s'))} s warm-up. Shed users wait their "
             "Retry-After and try again, so attempts count every retry; the attainment over "
             "attempts is low by design past the cap, the admitted attainment is what the "
             "gateway promises the users it lets in."]
    return Table(["", *[name for _, name in sides]], rows, notes)


def replica_table(proof: LiveProof) -> Table:
    """One row per replica: its cap, its own peak in flight, the twin's predicted peak."""
    live, twin = proof.peaks("live"), proof.peaks("twin")
    rows = [[name, str(proof.cap), human.whole(v), human.whole(twin.get(name)),
             "held" if v <= proof.cap else "over the cap"]
            for name, v in live.items()]
    source = proof.doc.get("peak_in_flight_source") or "the replicas' own traces"
    notes = [f"Peak in flight: the most requests the replica's engine held at once (running + "
             f"waiting), from {source}; the twin's from its own gateway counters."]
    return Table(["replica", "cap", "peak in flight (live)", "peak in flight (twin)", ""],
                 rows, notes)


def setup_line(proof: LiveProof) -> str:
    target = proof.doc.get("target") or {}
    what = " ".join(str(target[k]).upper() for k in ("gpu", "weights") if target.get(k))
    engine = target.get("engine") or "engine"
    via = target.get("via") or "the gateway"
    return (f"{proof.replicas} {engine} replicas{f' ({what})' if what else ''} behind {via}, "
            f"cap {proof.cap} in flight each, driven at {_load(proof)} for "
            f"{human.rate(proof.doc.get('duration_s'))} s. Source: {proof.source}.")
