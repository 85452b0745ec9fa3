"""The report's tables and knee lines as plain text cells, shared by the HTML and the Markdown.

Times are model times (a simserver run at `--time-scale k` is converted back by the sweep; the
scale is shown where a point has one).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from chatfleet.core.documents.sweep import ClosedLoad, Knee, Load, SweepDoc, SweepPoint
from chatfleet.core.measure.point import MIN_WINDOW_CYCLES
from chatfleet.report import human
from chatfleet.report.human import DASH
from chatfleet.report.load import Sweep, number


@dataclass(slots=True)
class Table:
    headers: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)
    invalid_rows: set[int] = field(default_factory=set)  # indices of rows of invalid points
    numeric: bool = True  # right-align every column but the first


def fmt(value: Any, digits: int = 0) -> str:
    """A number with `digits` decimals and thousands separators; a dash when missing."""
    x = number(value)
    if x is None:
        return DASH if value is None or isinstance(value, float) else str(value)
    return f"{x:,.{digits}f}"


def load_text(load: Load) -> str:
    """"24 users", "0.3 rps" (for people: see `human`)."""
    if isinstance(load, ClosedLoad):
        return f"{human.users(load.concurrency)} users"
    text = f"{human.rate(load.rate_rps)} rps"
    if load.arrival is not None and load.arrival != "poisson":
        text += f" ({load.arrival})"
    return text


def ordered_points(points: Sequence[SweepPoint]) -> list[tuple[int, SweepPoint]]:
    """(index, point): closed loop first, then open loop, each by load (stable for repeats)."""
    mode_rank = {"closed": 0, "open": 1}
    indexed = list(enumerate(points))
    return sorted(indexed, key=lambda ip: (mode_rank[ip[1].load.mode], float(ip[1].load.value)))


def validity(point: SweepPoint) -> str:
    if point.valid:
        return "valid"
    reason = point.invalid_reason or "no reason given"
    return f"invalid: {reason}"


def _cooldown(point: SweepPoint) -> float | None:
    cool = None if point.live is None else point.live.cooldown
    return None if cool is None else cool.waited_s


def _floor(point: SweepPoint) -> float | None:
    return None if point.live is None else point.live.clock_floor_mhz


def points_table(sweep: Sweep) -> Table:
    """One row per point: load, validity, attainment, goodput, throughput, latencies, engine,
    GPU and client figures."""
    points = sweep.points
    has_run = any(p.run_index is not None for p in points)
    has_scale = any(number(p.time_scale) not in (None, 1.0) for p in points)
    has_floor = any(number(_floor(p)) is not None for p in points)
    has_cool = any(number(_cooldown(p)) is not None for p in points)
    headers = ["load"]
    if has_run:
        headers.append("run")
    headers += ["valid", "requests", "attainment", "goodput rps", "output tok/s",
                "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99", "ITL p99",
                "max running", "max queue", "peak usage", "SM clock p50", "SM clock min"]
    if has_floor:
        headers.append("clock floor")
    headers += ["temp max °C", "send lag p99", "loop lag p99"]
    if has_cool:
        headers.append("cool-down s")
    if has_scale:
        headers.append("time scale")
    rows: list[list[str]] = []
    invalid: set[int] = set()
    any_thin = any_few = False
    for _, p in ordered_points(points):
        thin = bool(p.thin)
        any_thin = any_thin or thin
        few = "~" if p.few_cycles else ""
        any_few = any_few or bool(few)
        row = [load_text(p.load)]
        if has_run:
            row.append(fmt(p.run_index))
        if not p.valid:
            invalid.add(len(rows))
        row += [
            validity(p),
            fmt(p.requests.offered) + ("*" if thin else ""),
            fmt(p.attainment, 3),
            human.rate(p.goodput_rps) + few,
            fmt(p.output_tok_s, 0) + few,
            fmt(p.ttft_ms.p50),
            fmt(p.ttft_ms.p99),
            fmt(p.tpot_ms.p50),
            fmt(p.tpot_ms.p99),
            fmt(p.itl_ms.p99),
            fmt(p.engine.max_running),
            fmt(p.engine.max_queue),
            fmt(p.engine.peak_token_usage, 2),
            fmt(p.gpu.sm_clock_mhz.p50),
            fmt(p.gpu.sm_clock_mhz.min),
        ]
        if has_floor:
            row.append(fmt(_floor(p)))
        row += [
            fmt(p.gpu.temp_c.max, 1),
            fmt(p.client.send_lag_ms_p99, 1),
            fmt(p.client.loop_lag_ms_p99, 1),
        ]
        if has_cool:
            row.append(fmt(_cooldown(p), 0))
        if has_scale:
            scale = number(p.time_scale)
            row.append(DASH if scale in (None, 1.0) else f"{scale:g}×")
        rows.append(row)
    itl_stat = sweep.doc.slo.itl_stat
    notes = ["Times in ms (model time); SM clock in MHz; usage is the KV pool's peak share.",
             f"TPOT is (e2e − TTFT) / (output tokens − 1); the per-request statistic of the "
             f"target is {itl_stat}. ITL p99 pools every gap of every completed request."]
    if any_thin:
        notes.append("* thin: fewer than 200 requests behind the percentiles.")
    if any_few:
        notes.append(f"~ few cycles: the window held fewer than {MIN_WINDOW_CYCLES:g} of the "
                     "closed loop's cycles (window_cycles in the sweep's JSON), so these rates "
                     "may move by up to 1 / cycles with its phase; a longer window steadies "
                     "them.")
    if has_scale:
        notes.append("Time scale: the point ran on a simserver at that --time-scale; its times "
                     "are converted back to model time.")
    if invalid:
        notes.append("Invalid points are kept with their reason and left out of the knee, the "
                     "peak and the cap.")
    return Table(headers, rows, notes, invalid)


def _knee_text(knee: Knee, mode: str) -> str:
    """"meets 24 users, fails 25 users"; a bracket's two rates are told apart ("meets 1.25
    rps, fails 1.31 rps", not 1.2 and 1.3)."""
    meets, fails = number(knee.meets), number(knee.fails)
    names = human.loads(mode, [meets, fails])
    unit = human.unit(mode)
    m = "none" if meets is None else f"{names[meets]} {unit}"
    f = "none tested" if fails is None else f"{names[fails]} {unit}"
    return f"meets {m}, fails {f}"


def has_mode(sweep: Sweep, mode: str) -> bool:
    return any(p.load.mode == mode for p in sweep.points)


def knee_lines(sweep: Sweep) -> list[str]:
    """The knee, open-loop knee, cap and peak of one sweep, one sentence each."""
    doc = sweep.doc
    if not sweep.points:
        return [f"{sweep.label}: no finished point: no knee"]
    lines = []
    if has_mode(sweep, "closed"):
        cap = doc.recommended_cap
        lines.append(f"{sweep.label}: closed-loop knee: {_knee_text(doc.knee, 'closed')}; "
                     f"recommended gateway cap: {DASH if cap is None else cap}")
    if has_mode(sweep, "open"):
        lines.append(f"{sweep.label}: open-loop knee: {_knee_text(doc.knee_rate, 'open')}")
    if doc.throughput_peak.load is not None:
        lines.append(f"{sweep.label}: throughput peak: {peak_text(doc)} (never the limit)")
    return lines


def peak_text(doc: SweepDoc) -> str:
    peak = doc.throughput_peak
    if peak.load is None:
        return "none (no valid point)"
    mode = "open" if peak.mode == "open" else "closed"
    return (f"{fmt(peak.output_tok_s)} output tok/s at "
            f"{human.load(mode, peak.load)} {human.unit(mode)}")


def slo_text(doc: SweepDoc) -> str:
    slo = doc.slo
    return (f"TTFT ≤ {fmt(slo.ttft_ms)} ms, per-token ({slo.itl_stat}) ≤ {fmt(slo.tpot_ms)} ms, "
            f"attainment ≥ {fmt(slo.attainment, 2)}")


def flatten(data: Any, prefix: str = "") -> list[tuple[str, str]]:
    """key=value pairs of a nested block (dotted keys), lists shortened."""
    out: list[tuple[str, str]] = []
    if isinstance(data, Mapping):
        for k, v in data.items():
            key = f"{prefix}.{k}" if prefix else str(k)
            if isinstance(v, Mapping):
                out += flatten(v, key)
            elif isinstance(v, list):
                shown = ", ".join(str(x) for x in v[:6]) + (", …" if len(v) > 6 else "")
                out.append((key, f"[{shown}]" if len(v) <= 6 else f"[{shown}] ({len(v)} items)"))
            elif isinstance(v, bool):
                out.append((key, "true" if v else "false"))
            else:
                out.append((key, DASH if v is None else str(v)))
    return out


def _scales(sweep: Sweep) -> str:
    scales = sorted({s for p in sweep.points
                     if (s := number(p.time_scale)) is not None and s != 1.0})
    if not scales:
        return "model time (no point scaled)"
    return "model time; points ran at time scale " + ", ".join(f"{s:g}×" for s in scales)


def summary_table(sweeps: Sequence[Sweep]) -> Table:
    """One column per sweep: knee, open-loop knee, peak, cap, SLO, points, times, source."""
    headers = ["", *[s.label for s in sweeps]]
    rows: list[list[str]] = []

    def add(name: str, values: list[str]) -> None:
        rows.append([name, *values])

    add("closed-loop knee", [_knee_text(s.doc.knee, "closed")
                             if has_mode(s, "closed") else "no closed-loop point"
                             for s in sweeps])
    add("open-loop knee", [_knee_text(s.doc.knee_rate, "open")
                           if has_mode(s, "open") else "no open-loop point" for s in sweeps])
    add("throughput peak (never the limit)", [peak_text(s.doc) for s in sweeps])
    add("recommended gateway cap", [
        DASH if s.doc.recommended_cap is None
        else f"{s.doc.recommended_cap} in flight per replica"
        + (f" (cap margin {s.doc.cap_margin})" if s.doc.cap_margin else "")
        for s in sweeps])
    add("target (SLO)", [slo_text(s.doc) for s in sweeps])
    add("points", [_point_counts(s) for s in sweeps])
    add("times", [_scales(s) for s in sweeps])
    add("source", [str(s.source) + (" (rebuilt from runs.jsonl)" if s.rebuilt else "")
                   for s in sweeps])
    return Table(headers, rows, numeric=False)


def setup_table(sweeps: Sequence[Sweep]) -> Table:
    """One column per sweep: every target and workload key (dotted), a dash where absent."""
    headers = ["", *[s.label for s in sweeps]]
    rows: list[list[str]] = []

    def add(name: str, values: list[str]) -> None:
        rows.append([name, *values])

    for block in ("target", "workload"):
        keyed = [dict(flatten(s.doc.target.fields if block == "target" else s.doc.workload))
                 for s in sweeps]
        keys: list[str] = []
        for k in keyed:
            keys += [x for x in k if x not in keys]
        for key in keys:
            add(f"{block}.{key}", [k.get(key, DASH) for k in keyed])
    return Table(headers, rows, numeric=False)


def _point_counts(sweep: Sweep) -> str:
    pts = sweep.points
    invalid = sum(1 for p in pts if not p.valid)
    thin = sum(1 for p in pts if p.thin)
    few = sum(1 for p in pts if p.few_cycles)
    text = f"{len(pts)} ({invalid} invalid, {thin} thin"
    return text + (f", {few} of few cycles)" if few else ")")
