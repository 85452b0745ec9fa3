"""`chatfleet plan --trace`'s answer as tables and lines (the JSON is the plan's document)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.table import Table

from chatfleet.cli.common import out
from chatfleet.cli.render import fmt, print_launch, provenance_lines
from chatfleet.core.documents.plan import Plan
from chatfleet.core.documents.trace_plan import TraceLevel


def _duration(seconds: float) -> str:
    if seconds >= 2 * 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 120:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


def _replicas(level: TraceLevel | None) -> str:
    if level is None:
        return "-"
    if level.replicas is None:
        return "none"
    return str(level.replicas) + ("" if level.verified else "*")


def print_trace_answer(doc: Plan) -> None:
    t = doc.trace
    assert t is not None
    f = t.fields
    window = f.get("window_s")
    head = (f"your traffic: {f['source']}: {f['lines']:,} lines ({f['turns']:,} turns, "
            f"{f['sessions']:,} sessions) over {_duration(float(f['span_s']))}"
            + (f", window {window[0]:g}-{window[1]:g} s" if window else "")
            + (f", time scale {f['time_scale']:g}" if f["time_scale"] != 1 else ""))
    table = Table(title=f"{head}\n{doc.pool.model} on {doc.pool.gpu}: the fewest replicas with "
                        f"{f['rule']} (TTFT <= {doc.slo.ttft_ms:.0f} ms, TPOT <= "
                        f"{doc.slo.tpot_ms:.0f} ms)",
                  caption="* judged on the busiest hours only; times in ms")
    for col in ("precision", "cap", "replicas", "peak users", "users/card at peak",
                "attainment (worst hour)", "TTFT p99", "TPOT p99",
                f"x{f['doubling']:g} traffic: replicas"):
        table.add_column(col, justify="right")
    for name, p in t.precisions.items():
        lvl, dbl = p.level("target"), p.level("doubled")
        att = "-"
        if lvl is not None and lvl.attainment is not None:
            worst = lvl.fields.get("worst_segment") or {}
            att = f"{lvl.attainment:.4f} ({worst.get('attainment', 0):.4f})"
        table.add_row(name, fmt(p.cap, "d"), _replicas(lvl),
                      fmt(None if lvl is None else lvl.peak_users, "d"),
                      fmt(None if lvl is None else lvl.users_per_card, "d"), att,
                      fmt(None if lvl is None else lvl.figure("ttft_ms", "p99"), ".0f"),
                      fmt(None if lvl is None else lvl.figure("tpot_ms", "p99"), ".0f"),
                      _replicas(dbl))
    out.print(table)
    if doc.calibration is not None:
        for line in provenance_lines(doc.calibration):
            out.print(f"[yellow]{line}[/]", highlight=False)
    rec = doc.recommendation
    if rec is None:
        out.print(f"[bold]no recommendation:[/] {doc.why_none}")
        return
    p = t.precisions[rec.precision]
    lvl, dbl = p.level("target"), p.level("doubled")
    assert lvl is not None
    out.print(f"[bold]recommended:[/] {rec.precision}, gateway cap {rec.gateway_cap} per "
              f"replica (engine guard {rec.engine_guard}), {rec.replicas} replicas on "
              f"{rec.cards} cards: at the peak {lvl.peak_users} users open, "
              f"{rec.users_per_card} per card. Why: {rec.why}", highlight=False)
    if "meets_target" in lvl.fields and not lvl.fields["meets_target"]:
        out.print(f"[bold red]this fleet does not meet the target:[/] "
                  f"{int(lvl.fields.get('shed') or 0):,} of {int(lvl.fields['offered']):,} "
                  f"turns shed, attainment {fmt(lvl.attainment, '.4f')} (worst hour "
                  f"{(lvl.fields.get('worst_segment') or {}).get('attainment', 0):.4f})",
                  highlight=False)
    if dbl is not None:
        out.print(f"the traffic x{f['doubling']:g} (sessions start {f['doubling']:g} times as "
                  "often): " + (f"{dbl.replicas} replicas" if dbl.replicas is not None
                                else f"no fleet found ({dbl.why_none})"), highlight=False)
    on = p.level("doubled_on_target_fleet")
    if on is not None and on.fields.get("offered"):
        shed = int(on.fields.get("shed") or 0) / max(1, int(on.fields["offered"]))
        out.print(f"  on the {rec.replicas} replicas sized for the trace, its busiest hour "
                  f"doubled: {shed:.1%} shed (429 + Retry-After), admitted attainment "
                  f"{fmt(on.fields.get('admitted_attainment'), '.3f')}", highlight=False)
    for line in band_lines(p.band):
        out.print(f"[yellow]{line}[/]", highlight=False)
    if rec.cooling is not None:
        out.print(f"cooling: {rec.cooling.note}", highlight=False)
    for line in thermal_lines(t.thermal):
        out.print(line, highlight=False)
    print_launch(doc)


def band_lines(band: Mapping[str, Any] | None) -> list[str]:
    if not band:
        return []
    lines = []
    for lvl in ("target", "doubled"):
        edges = band.get(lvl) or {}
        lines.append(f"error band, {lvl} traffic: {edges.get('slower')} replicas with every "
                     f"step slower, {edges.get('faster')} with every step faster "
                     f"({band.get('judged_on')})")
    return lines


def thermal_lines(thermal: Mapping[str, Any] | None) -> list[str]:
    if not thermal:
        return []
    c = thermal.get("cooling") or {}
    held = thermal.get("held_clock")
    where = f"the busiest hour (segment {thermal['segment']}) on {thermal['replicas']} replicas"
    if c.get("held_clock"):
        return [f"thermal: {where}: the card holds its clock under the modelled cooling"]
    lines = [f"thermal: {where}: under the modelled cooling the card throttles to "
             f"{fmt(c.get('settled_mhz'), '.0f')} MHz"
             + (f" after {_duration(float(after))} of its replay (lead-in included)"
                if (after := c.get("slowdown_after_s")) is not None else "")
             + f" (busy {c.get('busy_share', 0):.0%}; "
             f"holding the clock needs at most {c.get('max_r_c_per_w', 0):.2f} C/W at the "
             f"inlet)"]
    if held:
        if held.get("replicas") is None:
            lines.append(f"  at {held['clock_mhz']:.0f} MHz: no fleet found "
                         f"({held.get('why_none')})")
        else:
            lines.append(f"  at the {held['clock_mhz']:.0f} MHz it holds: cap {held['cap']}, "
                         f"{held['replicas']} replicas on {held['replicas']} cards serve the "
                         "trace (run these with cooling like the modelled card's)")
    return lines
