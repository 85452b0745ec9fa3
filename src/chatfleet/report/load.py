"""Read sweep results: a sweep directory (or a bare chatfleet.sweep/1 file) and its run files.

A sweep directory, as `chatfleet sweep --out DIR` writes it::

    DIR/sweep.json                  the chatfleet.sweep/1 document
    DIR/runs.jsonl                  one finished run (a sweep point) per line
    DIR/meta.json                   optional: {"target", "workload", "slo", "cap_margin"}
    DIR/runs/NNN/telemetry.jsonl    GPU samples {"t", "sm_clock_mhz", "temp_c", ...}
    DIR/runs/NNN/engine.jsonl       engine scrapes {"t", "running", "queue", "token_usage", ...}

When sweep.json is missing but runs.jsonl exists (an interrupted sweep), the document is rebuilt
from runs.jsonl with `chatfleet.core.measure.knee.sweep_document`. The checked JSON becomes a
typed `SweepDoc` (`core.documents.sweep`); the report reads its attributes. A truncated last
line of a JSONL file (a run cut short while it was being written) is skipped with a warning;
any other malformed line is an error. Every error of the input is a `ReportInputError`
(a ValueError).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from chatfleet.core.documents.fields import DocumentError
from chatfleet.core.documents.sweep import (
    MODES,
    SCHEMA,
    SweepDoc,
    SweepPoint,
    Target,
    points_from_json,
)
from chatfleet.core.errors import ChatfleetError
from chatfleet.core.measure.knee import sweep_document
from chatfleet.core.slo import SLO
from chatfleet.io import run_file

SWEEP_FILE = "sweep.json"
RUNS_FILE = "runs.jsonl"
META_FILE = "meta.json"
SUMMARY_KEYS = ("knee", "knee_rate", "throughput_peak", "recommended_cap")


class ReportInputError(ChatfleetError):
    """The report's input is missing or is not a readable chatfleet.sweep/1 sweep."""


@dataclass(slots=True)
class Series:
    """One run's samples from a JSONL file (telemetry or engine scrapes), in file order."""

    path: Path
    rows: list[dict[str, Any]]

    @property
    def t0(self) -> float:
        """The first sample's time (0 when no sample has one)."""
        for row in self.rows:
            t = number(row.get("t"))
            if t is not None:
                return t
        return 0.0

    def column(self, key: str) -> tuple[list[float], list[float]]:
        """(t, value) for the samples holding a finite number under `key` (and a finite t)."""
        ts: list[float] = []
        vs: list[float] = []
        for row in self.rows:
            t, v = number(row.get("t")), number(row.get(key))
            if t is not None and v is not None:
                ts.append(t)
                vs.append(v)
        return ts, vs


@dataclass(slots=True)
class Sweep:
    """One sweep's document and the run files it names, ready to report."""

    source: Path  # the directory (or the bare sweep file) given
    base: Path  # the folder that relative run file paths start from
    doc: SweepDoc
    label: str = ""
    rebuilt: bool = False  # rebuilt from runs.jsonl (sweep.json missing)
    warnings: list[str] = field(default_factory=list)
    telemetry: dict[int, Series] = field(default_factory=dict)  # point index -> samples
    engine: dict[int, Series] = field(default_factory=dict)  # point index -> scrapes

    @property
    def points(self) -> tuple[SweepPoint, ...]:
        return self.doc.points


def number(value: Any) -> float | None:
    """A finite float, or None (None, NaN, booleans, strings and other types)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    out = float(value)
    return out if math.isfinite(out) else None


def read_json(path: Path, what: str) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ReportInputError(f"cannot read {what} {path}: {exc.strerror or exc}") from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ReportInputError(f"{path} is not valid JSON ({what}): {exc}") from exc


def read_jsonl(path: Path, what: str, warnings: list[str]) -> list[dict[str, Any]]:
    """The JSON objects of a JSONL file, one a line (blank lines ignored).

    A malformed last line without its newline is a line cut off while it was written: skipped
    with a warning. Any other malformed line, or a line that is not a JSON object, is an error.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ReportInputError(f"cannot read {what} {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ReportInputError(f"{path} is not UTF-8 text ({what})") from exc
    lines = text.split("\n")
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    rows: list[dict[str, Any]] = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            if i == last:
                # the last line, cut short by an interrupted write
                warnings.append(f"{path}: skipped a truncated last line (line {i + 1})")
                continue
            raise ReportInputError(f"{path}, line {i + 1}: malformed JSON ({what}): "
                                   f"{exc.msg}") from exc
        if not isinstance(row, dict):
            raise ReportInputError(f"{path}, line {i + 1}: expected a JSON object ({what})")
        rows.append(row)
    return rows


def _check_point(point: Any, where: str) -> dict[str, Any]:
    if not isinstance(point, dict):
        raise ReportInputError(f"{where}: a sweep point must be a JSON object")
    load = point.get("load")
    if not isinstance(load, dict) or load.get("mode") not in MODES:
        raise ReportInputError(
            f"{where}: a sweep point needs a load {{'mode': 'closed'|'open', ...}}"
        )
    key = "concurrency" if load["mode"] == "closed" else "rate_rps"
    if number(load.get(key)) is None:
        raise ReportInputError(f"{where}: a {load['mode']}-loop load needs a number {key!r}")
    return point


def check_document(doc: Any, where: str) -> dict[str, Any]:
    """`doc` if it is a chatfleet.sweep/1 document with well-formed points; else the error."""
    if not isinstance(doc, dict):
        raise ReportInputError(f"{where} is not a sweep: expected a JSON object")
    schema = doc.get("schema")
    if schema is None:
        raise ReportInputError(f"{where} is not a sweep: no 'schema' key "
                               f"(expected {SCHEMA!r})")
    if schema != SCHEMA:
        raise ReportInputError(f"{where}: unsupported schema {schema!r} (expected {SCHEMA!r})")
    points = doc.get("points")
    if not isinstance(points, list):
        raise ReportInputError(f"{where}: 'points' must be a list")
    for i, p in enumerate(points):
        _check_point(p, f"{where}, point {i}")
    for key in ("target", "workload", "slo"):
        if not isinstance(doc.get(key, {}), dict):
            raise ReportInputError(f"{where}: {key!r} must be a JSON object")
    return doc


def _typed(doc: dict[str, Any], where: str) -> SweepDoc:
    try:
        return SweepDoc.from_json(doc, where)
    except DocumentError as exc:
        raise ReportInputError(str(exc)) from None


def _rebuild(points: Sequence[SweepPoint], meta: Mapping[str, Any],
             given: SweepDoc | None = None, given_slo: Mapping[str, Any] | None = None
             ) -> SweepDoc:
    """The document over `points`, with knee, peak and cap recomputed (and the rest of
    `given`, a document that lacks them, kept)."""
    src: Mapping[str, Any] = meta if given is None else {"slo": given_slo or {},
                                                         "cap_margin": given.cap_margin}
    slo_json = dict(src.get("slo") or {})
    if "itl_stat" not in slo_json and points and points[0].itl_stat:
        slo_json["itl_stat"] = points[0].itl_stat
    try:
        slo = SLO.from_json(slo_json)
        cap_margin = int(src.get("cap_margin", 0) or 0)
        target = given.target if given is not None else Target(dict(meta.get("target") or {}))
        workload = given.workload if given is not None else meta.get("workload") or {}
        doc = sweep_document(target, workload, slo, points, cap_margin=cap_margin)
    except (TypeError, ValueError, KeyError) as exc:
        raise ReportInputError(f"cannot rebuild the sweep from its runs: {exc}") from exc
    if given is not None:
        doc = replace(given, slo=slo, knee=doc.knee, knee_rate=doc.knee_rate,
                      throughput_peak=doc.throughput_peak, recommended_cap=doc.recommended_cap)
    return doc


def load_sweep(path: str | Path) -> Sweep:
    """Read one sweep: a directory (sweep.json, else runs.jsonl) or a bare sweep JSON file.

    Raises ReportInputError for a missing path, a directory without either file, invalid JSON,
    a document of another schema, or malformed points or lines.
    """
    src = Path(path)
    warnings: list[str] = []
    rebuilt = False
    if src.is_dir():
        base = src
        sweep_file = src / SWEEP_FILE
        runs_file = src / RUNS_FILE
        meta: dict[str, Any] = {}
        if (src / META_FILE).is_file():
            meta_doc = read_json(src / META_FILE, "sweep metadata")
            if not isinstance(meta_doc, dict):
                raise ReportInputError(f"{src / META_FILE}: expected a JSON object")
            meta = meta_doc
        if sweep_file.is_file():
            raw = check_document(read_json(sweep_file, "sweep document"), str(sweep_file))
            if runs_file.is_file():
                runs = read_jsonl(runs_file, "finished runs", warnings)
                if len(runs) > len(raw["points"]):
                    warnings.append(
                        f"{runs_file} holds {len(runs)} runs but {sweep_file} only "
                        f"{len(raw['points'])} points: reporting {SWEEP_FILE}")
        elif runs_file.is_file():
            runs = read_jsonl(runs_file, "finished runs", warnings)
            rows = [_check_point(p, f"{runs_file}, run {i}") for i, p in enumerate(runs)]
            if not rows:
                raise ReportInputError(f"{runs_file} holds no finished run: nothing to report")
            try:
                points = points_from_json(rows, str(runs_file))
            except DocumentError as exc:
                raise ReportInputError(str(exc)) from None
            doc = _rebuild(points, meta)
            rebuilt = True
            warnings.append(f"no {SWEEP_FILE} in {src} (an interrupted sweep?): rebuilt from "
                            f"{len(points)} runs in {RUNS_FILE}"
                            + ("" if meta else f"; no {META_FILE}, so no target or workload"))
        else:
            raise ReportInputError(
                f"{src} is not a sweep directory: it holds neither {SWEEP_FILE} nor {RUNS_FILE}"
            )
    elif src.is_file():
        base = src.parent
        raw = check_document(read_json(src, "sweep document"), str(src))
    else:
        raise ReportInputError(f"no such sweep directory or file: {src}")
    if not rebuilt:
        doc = _typed(raw, str(src))
        missing = [k for k in SUMMARY_KEYS if k not in raw]
        if missing and doc.points:
            doc = _rebuild(doc.points, {}, given=doc, given_slo=raw.get("slo"))
            warnings.append(f"{src}: no {', '.join(missing)} in the document: recomputed")
    sweep = Sweep(source=src, base=base, doc=doc, rebuilt=rebuilt, warnings=warnings)
    _load_run_files(sweep)
    return sweep


def _load_run_files(sweep: Sweep) -> None:
    for i, point in enumerate(sweep.points):
        for kind, store in (("telemetry", sweep.telemetry), ("engine", sweep.engine)):
            path = run_file(sweep.base, point, kind)
            if path is None:
                continue
            if not path.is_file():
                sweep.warnings.append(f"{path}: {kind} file named by point {i} is missing")
                continue
            rows = read_jsonl(path, f"{kind} samples", sweep.warnings)
            if rows:
                store[i] = Series(path, rows)


def sweep_label(target: Target) -> str:
    """'L4 BF16', 'L4 FP8', 'L4 FP8 / KV BF16' from target.gpu, weights and kv_cache."""
    gpu = str(target.get("gpu") or "").upper()
    weights = str(target.get("weights") or "").upper()
    kv = str(target.get("kv_cache") or "").upper()
    parts = [x for x in (gpu, weights) if x]
    label = " ".join(parts)
    if kv and kv != weights:
        label = f"{label} / KV {kv}" if label else f"KV {kv}"
    return label


def load_sweeps(paths: Sequence[str | Path]) -> list[Sweep]:
    """Every sweep, labelled from its target (distinct labels: a duplicate gets its folder)."""
    if not paths:
        raise ReportInputError("give at least one sweep directory or file")
    sweeps = [load_sweep(p) for p in paths]
    for s in sweeps:
        name = s.source.name if s.source.is_dir() else s.source.stem
        s.label = sweep_label(s.doc.target) or name or str(s.source)
    seen: dict[str, int] = {}
    for s in sweeps:
        seen[s.label] = seen.get(s.label, 0) + 1
    for i, s in enumerate(sweeps):
        if seen[s.label] > 1:
            name = s.source.name if s.source.is_dir() else s.source.stem
            s.label = f"{s.label} ({name or i + 1})"
    labels = [s.label for s in sweeps]
    for i, s in enumerate(sweeps):  # still equal (same folder name): number them
        if labels.count(s.label) > 1:
            s.label = f"{s.label} #{i + 1}"
    return sweeps
