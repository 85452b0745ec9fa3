"""What the commands share to print: the sweep table and its knee lines, the plan's answer,
its gateway config as YAML and the KV pool table."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml
from rich.table import Table

from chatfleet.cli.common import out, uncalibrated_note
from chatfleet.core.documents.plan import CountEdges, Doubling, Plan
from chatfleet.core.documents.sweep import ClosedLoad, Load, SweepDoc, SweepPoint
from chatfleet.core.measure.point import MIN_WINDOW_CYCLES
from chatfleet.core.memory import PoolPlan


def load_label(load: Load) -> str:
    """"16 users", "2.0 rps"."""
    if isinstance(load, ClosedLoad):
        return f"{load.concurrency} users"
    return f"{load.rate_rps} rps"


def point_row(p: SweepPoint) -> list[str]:
    label = load_label(p.load)
    thin = "*" if p.thin else ""
    few = "~" if p.few_cycles else ""
    if not p.valid:
        label += " (invalid)"
    e = p.engine
    return [
        label,
        f"{p.attainment:.3f}{thin}",
        fmt(p.goodput_rps, ".2f") + few,
        fmt(p.output_tok_s, ".0f") + few,
        fmt(p.ttft_ms.p50, ".0f"),
        fmt(p.ttft_ms.p99, ".0f"),
        fmt(p.tpot_ms.p50, ".0f"),
        fmt(p.tpot_ms.p99, ".0f"),
        fmt(p.itl_ms.p99, ".0f"),
        fmt(e.max_running, "d"),
        fmt(e.max_queue, "d"),
        fmt(e.peak_token_usage, ".2f"),
    ]


def fmt(value: Any, spec: str) -> str:
    """A figure, or a dash where the source had none (an engine without metrics)."""
    if value is None:
        return "-"
    if spec == "d":
        return str(int(value))
    return format(value, spec)


def sweep_table(doc: SweepDoc, title: str) -> Table:
    caption = "times in ms; * thin: fewer than 200 requests behind the percentiles"
    if any(p.few_cycles for p in doc.points):
        caption += (f"; ~ few cycles: the window held fewer than {MIN_WINDOW_CYCLES:g} "
                    "closed-loop cycles, the rate may move by up to 1 / cycles with its phase")
    t = Table(title=title, caption=caption)
    gated = any(p.fleet is not None or p.requests.shed for p in doc.points)
    cols = ["load", "attain", "goodput/s", "tok/s", "TTFT p50", "TTFT p99", "TPOT p50",
            "TPOT p99", "ITL p99", "running", "queue", "usage"]
    if gated:  # a gateway in front: what it shed, and what the admitted users saw
        cols[2:2] = ["admitted attain", "shed"]
    for col in cols:
        t.add_column(col, justify="right")
    for p in doc.points:
        row = point_row(p)
        if gated:
            row[2:2] = [fmt(p.admitted_attainment, ".3f"), str(p.requests.shed)]
        t.add_row(*row)
    return t


def knee_lines(doc: SweepDoc) -> list[str]:
    k, kr, peak = doc.knee, doc.knee_rate, doc.throughput_peak
    lines = []
    if doc.has_mode("closed"):
        lines.append(f"closed-loop knee: meets {k.meets} users, fails {k.fails} users; "
                     f"recommended gateway cap: {doc.recommended_cap}")
        if peak.load is not None:
            lines.append(f"throughput peak: {peak.output_tok_s:.0f} output tok/s at "
                         f"{peak.load} users (never the limit)")
    if doc.has_mode("open"):
        lines.append(f"open-loop knee: meets {kr.meets} rps, fails {kr.fails} rps")
    return lines


def band_lines(doc: SweepDoc) -> list[str]:
    """The knees at the edges of the twin's error band, and where the constants come from
    (a twin sweep's knee_band and calibration blocks), when the sweep has them."""
    band = doc.extra.get("knee_band")
    if not isinstance(band, Mapping):
        return []
    lines = []
    for mode, unit in (("closed", "users"), ("open", "rps")):
        edges = band.get("knee" if mode == "closed" else "knee_rate") or {}
        if not doc.has_mode(mode):  # type: ignore[arg-type]
            continue
        slower, faster = (edges.get("slower") or {}), (edges.get("faster") or {})
        lines.append(f"{mode}-loop knee with every step {band['error_band']:.0%} slower: meets "
                     f"{slower.get('meets')} {unit}; {band['error_band']:.0%} faster: meets "
                     f"{faster.get('meets')} {unit}")
    cal = doc.extra.get("calibration")
    if isinstance(cal, Mapping):
        lines += provenance_lines(cal)
    return lines


def gateway_yaml(doc: Plan) -> str:
    assert doc.recommendation is not None and doc.gateway_config is not None
    head = (f"# chatfleet gateway config from `chatfleet plan` ({doc.pool.gpu}, "
            f"{doc.pool.model}, {doc.recommendation.precision}): docs/gateway.md\n")
    return head + str(yaml.safe_dump(dict(doc.gateway_config), sort_keys=False))


def print_answer(doc: Plan) -> None:
    rec = doc.recommendation
    calibrated = doc.pool.calibrated
    cal = "" if calibrated else " (uncalibrated)"
    t = Table(title=f"users per card at the knee: {doc.pool.model} on {doc.pool.gpu}{cal}, "
              f"{doc.target_users} users, SLO TTFT <= {doc.slo.ttft_ms:.0f} ms, "
              f"TPOT <= {doc.slo.tpot_ms:.0f} ms for {doc.slo.attainment:.0%}")
    for col in ("precision", "KV pool", "users/card", "gateway cap", "goodput/s", "rate/replica",
                "replicas", "cards", "accuracy", "from"):
        t.add_column(col, justify="right")
    for name, p in doc.by_precision.items():
        f, src = p.figures, p.figures.source
        where = (f"{src.sweep} point {src.point}" if src.point is not None
                 else f"{src.sweep}: no load meets")
        band = p.uncertainty
        t.add_row(name, f"{p.pool.kv_pool_tokens:,}",
                  fmt(f.users_per_card, "d") + ("" if band is None
                                                else f" ({span(band.users_per_card)})"),
                  fmt(f.gateway_cap, "d"), fmt(f.goodput_rps, ".2f"), fmt(f.rate_rps, ".2f"),
                  fmt(p.replicas, "d"),
                  fmt(p.cards, "d") + ("" if band is None else f" ({span(band.cards)})"),
                  ("ok" if p.accuracy.allowed else "outside margin")
                  + ("" if p.accuracy.checked else " (not checked)"), where)
    out.print(t)
    if doc.calibration is not None:
        for line in provenance_lines(doc.calibration):
            out.print(f"[yellow]{line}[/]", highlight=False)
        out.print("[yellow](in brackets: users per card and cards at the band's edges)[/]",
                  highlight=False)
    elif not calibrated:
        out.print(f"[yellow]{uncalibrated_note(doc.pool.gpu)}[/]", highlight=False)
    if rec is None:
        out.print(f"[bold]no recommendation:[/] {doc.why_none}")
        return
    out.print(f"[bold]recommended:[/] {rec.precision}, {rec.users_per_card} users per "
              f"card, gateway cap {rec.gateway_cap} per replica (engine guard "
              f"--max-running-requests {rec.engine_guard}), {rec.replicas} replicas on "
              f"{rec.cards} cards for {doc.target_users} users with "
              f"{rec.headroom:.0%} headroom. Why: {rec.why}")
    if rec.cooling is not None:
        out.print(f"cooling: {rec.cooling.note}", highlight=False)
    d = doc.doubling
    assert d is not None and doc.host_tier is not None and doc.launch is not None
    t = Table(title=f"traffic doubled for {d.hours:g} h ({d.users} -> {d.doubled_users}"
              f" users on {d.replicas} replicas; simulated on a slice of "
              f"{d.replicas_simulated})")
    for col in ("traffic", "thermal model", "attempts", "shed", "admitted attain",
                "TTFT p99 ms", "gateway queue max", "SM clock p50/min MHz", "max temp C",
                "thermal slowdown"):
        t.add_column(col, justify="right")
    for r in d.runs:
        g = r.gpu
        t.add_row(r.traffic, "on" if r.thermal_model else "off",
                  str(r.requests.offered), f"{r.shed_share:.1%}",
                  fmt(r.admitted_attainment, ".3f"), fmt(r.ttft_ms.p99, ".0f"),
                  str(r.gateway_queue_max),
                  f"{g.sm_clock_mhz.p50:.0f}/{g.sm_clock_mhz.min:.0f}",
                  fmt(g.temp_c.max, ".1f"), f"{g.thermal_slowdown_share or 0.0:.1%}")
    out.print(t)
    for line in cooling_lines(d):
        out.print(line, highlight=False)
    for line in held_clock_lines(doc):
        out.print(line, highlight=False)
    print_launch(doc)


def print_launch(doc: Plan) -> None:
    """The host tier, the launch commands and the gateway config of a recommendation."""
    assert doc.host_tier is not None and doc.launch is not None
    out.print(f"host tier: {'HiCache on' if doc.host_tier.enable else 'off'}: "
              f"{doc.host_tier.why}")
    for engine, cmd in doc.launch.items():
        out.print(f"\n[bold]{engine}:[/] {cmd.shell}", highlight=False, soft_wrap=True)
        for note in cmd.notes:
            out.print(f"  note: {note}", highlight=False)
    out.print("\n[bold]gateway config:[/]")
    out.print(gateway_yaml(doc), highlight=False, soft_wrap=True)


COLDEST_INLET_C = 18.0  # the low end of ASHRAE's recommended data-centre inlet range


def cooling_lines(doubling: Doubling) -> list[str]:
    """What the thermal-on runs say, in words a user can act on: whether the card holds its
    clock at each traffic level under the modelled cooling, and if not, what would."""
    hot = [(r, r.cooling) for r in doubling.runs if r.cooling is not None]
    if not hot:
        return []
    prof = hot[0][1].profile
    hold = hot[0][1].hold_w
    lines = [f"thermal: the modelled cooling is fitted to the L4 overload measurement "
             f"(docs/calibration.md): {prof.inlet_c:g} C inlet, {prof.r_c_per_w:.2f} C/W, "
             f"so it sheds {hold:.1f} W at the {prof.slowdown_c:g} C slowdown point"]
    for r, c in hot:
        mix = (f"its load draws {c.loaded_power_w:.1f} W at {prof.loaded_mhz:.0f} MHz "
               f"(busy {c.busy_share:.0%}, {c.prefill_share or 0:.0%} of that prefill; "
               f"decode alone {c.decode_power_w:.1f} W)")
        head = f"  {r.traffic} ({r.users_simulated} users on the slice): "
        if c.held_clock:
            lines.append(head + f"holds its clock: {mix}, settling at "
                         f"{c.steady_temp_c:.0f} C.")
            continue
        after = c.slowdown_after_s
        when = f"after {after / 60:.1f} min " if after is not None else ""
        lines.append(head + f"throttles {when}to {c.settled_mhz:.0f} MHz "
                     f"({r.gpu.thermal_slowdown_share or 0.0:.0%} of busy time in slowdown, "
                     f"admitted attainment {fmt(r.admitted_attainment, '.3f')}): {mix}.")
        fixes = [f"cooling with at most {c.max_r_c_per_w:.2f} C/W at a {prof.inlet_c:g} C "
                 f"inlet ({c.cooling_factor:.1f}x better than modelled: more airflow "
                 f"through the card)"]
        if c.max_inlet_c >= COLDEST_INLET_C:
            fixes.append(f"an inlet at or below {c.max_inlet_c:.0f} C at the modelled cooling")
        else:
            fixes.append(f"no practical inlet does it at the modelled cooling (it would take "
                         f"{c.max_inlet_c:.0f} C)")
        if c.decode_power_w <= hold:
            fixes.append(f"a power limit of {hold:.0f} W (nvidia-smi -pl) keeps decode at full "
                         f"speed and slows only prefill")
        if c.max_busy_share < c.busy_share:
            fixes.append(f"or the card busy at most {c.max_busy_share:.0%} of the time (a "
                         f"lower cap does not do it: these users send their next request at "
                         f"once; with real think time, --turns and --think-time, the card "
                         f"rests between turns)")
        lines.append("    to hold the clock: " + "; ".join(fixes) + ".")
    lines.append("  the cooling is one measured card's, yours decides: record clocks in the "
                 "pre-launch sweep (chatfleet sweep --telemetry nvml --clock-floor MHZ).")
    return lines


def held_clock_lines(doc: Plan) -> list[str]:
    """The fleet at the clock the card holds, beside the recommended one (issue 25 item 5)."""
    h, rec = doc.held_clock, doc.recommendation
    if h is None or rec is None:
        return []
    lines = [f"[bold]at the clock the card holds under the modelled cooling ({h.clock_mhz:.0f} "
             f"MHz):[/] " + (f"{h.users_per_card} users per card, gateway cap "
                             f"{h.gateway_cap}, {h.replicas} replicas on {h.cards} cards"
                             if h.replicas is not None else "no fleet") + f". {h.why}"]
    if h.check is not None:
        c = h.check
        lines.append(f"  checked: that fleet's slice for {doubling_hours(doc)} with the thermal "
                     f"model on: SM clock p50 {c.gpu.sm_clock_mhz.p50:.0f} MHz, admitted "
                     f"attainment {fmt(c.admitted_attainment, '.3f')}, shed {c.shed_share:.1%}")
    if h.cards is not None:
        lines.append(f"  the recommendation's {rec.cards} cards assume cooling that holds the "
                     f"loaded clock; with cooling like the modelled card's, run these "
                     f"{h.cards}")
    return lines


def doubling_hours(doc: Plan) -> str:
    hours = doc.doubling.hours if doc.doubling is not None else 1.0
    return f"{hours:g} h"


def span(edges: CountEdges) -> str:
    """'16-32' from a count at the band's two edges, in increasing order."""
    ends = sorted(v for v in (edges.slower, edges.faster) if v is not None)
    if not ends:
        return "none"
    return str(ends[0]) if ends[0] == ends[-1] else f"{ends[0]}-{ends[-1]}"


def provenance_lines(prov: Mapping[str, Any]) -> list[str]:
    """What the twin's constants were fitted on, borrow and assume, and the band (a plan's
    `calibration` block): one line each."""
    lines = []
    for key in ("fitted", "borrowed", "assumed"):
        items = prov.get(key) or []
        if items:
            lines.append(f"{key}: " + "; ".join(items))
    band = prov.get("error_band")
    if band is not None:
        lines.append(f"error band: every step +/-{band:.0%}: {prov.get('error_band_source')}")
    return lines


def pool_table(p: PoolPlan) -> Table:
    cal = "" if p.calibrated else " [yellow](uncalibrated: figures from datasheet, not measured)[/]"
    t = Table(title=f"KV pool: {p.model} on {p.gpu}, weights {p.weights}, KV {p.kv_cache}{cal}")
    t.add_column("figure")
    t.add_column("value", justify="right")
    rows = [
        ("visible memory", f"{p.visible_gib:.3f} GiB"),
        ("free before weights (P)", f"{p.free_gib:.3f} GiB"),
        ("mem_fraction_static (m)", f"{p.mem_fraction_static:.3f}"),
        ("weights (W)", f"{p.weights_gib:.3f} GiB"),
        ("KV bytes per token", f"{p.kv_bytes_per_token:,}"),
        ("KV pool", f"{p.kv_pool_tokens:,} tokens"),
        ("chunked prefill / CUDA-graph max batch",
         f"{p.chunked_prefill_size} / {p.cuda_graph_max_bs}"),
        (f"requests that fit ({p.request_tokens} tokens each, one shared prompt cached)",
         f"{p.requests_fit:,}"),
        (f"shared prompts that fit ({p.system_prompt_tokens} tokens each)", f"{p.prompts_fit:,}"),
    ]
    for k, v in rows:
        t.add_row(k, v)
    return t
