"""`chatfleet plan --trace FILE`: the fewest cards for a product's own traffic (docs/plan.md).

1. The trace (the format of core/traffic/trace.py, or an imported log), its `--window` and
   `--time-scale`; a session profile read from it (its lengths, turns and think time) for the
   twin sweeps that give each precision's knee, cap and prefill reserve, as `plan --users`.
2. The trace cut into hour segments; for each precision, the fewest replicas at which,
   in every segment, nothing is shed and the target attainment holds
   (core/traffic/search.py), every replay the gateway's own admission and routing in front
   of the engine model (twin/trace_fleet.py), at the cap and reserve of that precision;
   judged on the busiest hours, and only the chosen precision's answer verified on every
   hour (the search goes on upward from there if an hour fails it).
3. For the precision with the fewest: the same with the sessions' arrivals compressed by
   `--doubling` (2: twice the sessions an hour), the searches at the edges of the
   calibration's error band (judged on the busiest hours), what the fleet sized for the trace
   does with the doubled busiest hour, and the card's clocks in the busiest hour: when it
   throttles under the modelled cooling, the fleet at the clock it holds
   (jobs/plan_thermal.py).
4. The answer in the shape of `plan --users` (core/documents/plan.Plan) with a `trace` block.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from chatfleet import __version__
from chatfleet.core.documents.plan import (
    Plan,
    PrecisionEntry,
    Recommendation,
    SweepRef,
    TraceAnswer,
)
from chatfleet.core.engine.build import build_engine, provenance_of, scaled_spec
from chatfleet.core.plan import (
    PlanError,
    PrecisionFigures,
    accuracy_verdicts,
    figures_from_sweep,
    precision_name,
    prefill_reserve_s,
)
from chatfleet.core.slo import SLO
from chatfleet.core.traffic.columns import HOUR_S, Segment, Trace, busiest_first
from chatfleet.core.traffic.tally import SegmentResult
from chatfleet.core.traffic.trace import TraceError
from chatfleet.core.workload import SessionProfile
from chatfleet.data.traffic import read_trace
from chatfleet.data.traffic_import import import_log
from chatfleet.jobs.plan import (
    BAND_EDGES,
    PlanRequest,
    Progress,
    engine_spec,
    gateway_config,
    host_tier_of,
    launch_commands,
    load_accuracy,
    pool_json,
    pool_of,
    read_sweeps,
    run_sweeps,
    uncertainty,
)
from chatfleet.jobs.plan import _launch as launch_of
from chatfleet.jobs.plan_tasks import ReplayTask
from chatfleet.jobs.plan_thermal import cooling_assumption, trace_thermal
from chatfleet.jobs.trace_search import Engine, Search, TracePlanner, level
from chatfleet.jobs.workers import WorkerPool, default_workers

TRACE_FORMATS = ("trace", "openai", "records")
LEAD_IN_S = 300.0  # each segment's warm-up: five minutes of the trace before it, uncounted
MAX_REPLICAS = 100_000


@dataclass(frozen=True, slots=True)
class TraceRequest:
    path: Path
    fmt: str = "trace"
    window: tuple[float, float] | None = None  # seconds after the trace's first line
    time_scale: float = 1.0  # sessions start this many times sooner
    doubling: float = 2.0  # the doubled traffic's further time scale
    replicas: int | None = None  # a fixed fleet: replay it, search nothing
    cap: int | None = None  # the gateway cap per replica (default: each precision's knee)
    segment_s: float = HOUR_S
    lead_in_s: float = LEAD_IN_S


def load_traffic(treq: TraceRequest, context_tokens: int,
                 default_output: int) -> tuple[Trace, dict[str, int]]:
    """The trace as the plan replays it: read (or imported), windowed, every line with an
    answer length. Also what an importer left out, by reason."""
    if treq.fmt not in TRACE_FORMATS:
        raise TraceError(f"unknown trace format {treq.fmt!r}: one of "
                         f"{', '.join(TRACE_FORMATS)}")
    skipped: dict[str, int] = {}
    if treq.fmt == "trace":
        trace = read_trace(treq.path, context_tokens)
    else:
        imported = import_log(treq.fmt, treq.path)
        skipped = imported.skipped
        trace = Trace.build(enumerate(imported.rows, start=1), str(treq.path))
        over = np.flatnonzero(trace.prompt + trace.output > context_tokens)
        if over.size:
            i = int(over[0])
            raise TraceError(f"{treq.path}: request {trace.line[i]} holds "
                             f"{trace.prompt[i] + trace.output[i]} tokens, more than the "
                             f"model's context of {context_tokens}")
    if treq.window is not None:
        trace = trace.windowed(*treq.window)
    return trace.with_output(default_output), skipped


def session_profile(trace: Trace, base: SessionProfile, slo: SLO) -> SessionProfile:
    """What the trace's users do, as the twin sweeps' workload: the mean new tokens a turn
    adds (its prompt beyond the previous turn's prompt and answer; the first turn's beyond
    the shared prompt), the mean answer, the mean turns per session, and the median pause
    between two turns less the answer's time at the per-token target."""
    first = trace.attempt == 0
    order = np.lexsort((trace.rank, trace.session))
    order = order[first[order]]
    s, p, o, t = (trace.session[order], trace.prompt[order], trace.output[order],
                  trace.time[order])
    same = np.concatenate(([False], s[1:] == s[:-1]))
    before = np.concatenate(([0], p[:-1] + o[:-1]))
    new = np.where(same, p - np.where(p >= before, before, 0),
                   p - np.minimum(p - 1, base.system_prompt_tokens))
    gaps = (t[1:] - t[:-1])[same[1:]]
    answer_s = float(o.mean()) * slo.tpot_ms / 1000.0
    think = max(0.0, float(np.median(gaps)) - answer_s) if gaps.size else 0.0
    sessions = max(1, len(np.unique(s)))
    return replace(base, input_len=max(1, round(float(np.maximum(new, 1).mean()))),
                   output_len=max(1, round(float(o.mean()))),
                   turns=max(1, round(s.size / sessions)), think_time_s=round(think, 1))


def trace_summary(trace: Trace, treq: TraceRequest, skipped: dict[str, int]) -> dict[str, Any]:
    priorities = trace.priority[trace.priority > -(2**61)]
    values, counts = np.unique(priorities, return_counts=True)
    return {
        "source": str(treq.path), "format": treq.fmt, "lines": trace.num_lines,
        "turns": int(np.count_nonzero(trace.attempt == 0)),
        "retries": int(np.count_nonzero(trace.attempt > 0)),
        "sessions": len(np.unique(trace.session)), "span_s": round(trace.span_s, 3),
        "window_s": None if trace.window is None else list(trace.window),
        "time_scale": treq.time_scale, "doubling": treq.doubling,
        "prompt_tokens_mean": round(float(trace.prompt.mean()), 1),
        "output_tokens_mean": round(float(trace.output.mean()), 1),
        "api_keys": len(trace.keys),
        "priorities": {str(int(v)): int(c) for v, c in zip(values, counts, strict=True)},
        "skipped": skipped, "segment_s": treq.segment_s, "lead_in_s": treq.lead_in_s,
    }


def fits_pool(req: PlanRequest, fig: PrecisionFigures, trace: Trace) -> str | None:
    """Why the engine cannot take the trace's longest turn, or None."""
    spec = engine_spec(req, fig.weights, fig.kv_cache)
    engine = build_engine(spec)
    i = int(np.argmax(trace.prompt + trace.output))
    why = engine.check_request(int(trace.prompt[i]), int(trace.output[i]))
    return None if why is None else f"line {trace.line[i]}: {why}"


def first_guess(fig: PrecisionFigures, segments: list[Segment]) -> int:
    """Replicas from the busiest segment's answer tokens a second over what a card makes at
    its knee (the search's first guess; bursts within the hour need more)."""
    seg = segments[busiest_first(segments)[0]]
    span = max(60.0, float(seg.time[seg.counted].max()) - seg.start)
    rate = fig.output_tok_s or 1.0
    return max(1, math.ceil(seg.work()[0] / span / rate))


def make_trace_plan(req: PlanRequest, treq: TraceRequest,
                    progress: Progress | None = None) -> Plan:
    """The whole answer for a trace (module docstring)."""
    trace, skipped = load_traffic(treq, req.model.max_position_embeddings,
                                  req.profile.output_len)
    req = replace(req, profile=session_profile(trace, req.profile, req.slo))
    target = trace.scaled(treq.time_scale).segments(treq.segment_s, treq.lead_in_s)
    doubled = trace.scaled(treq.time_scale * treq.doubling).segments(treq.segment_s,
                                                                    treq.lead_in_s)
    accuracy = load_accuracy(req.accuracy) if req.accuracy is not None else None
    docs = read_sweeps(req)
    to_sweep = {} if docs else {precision_name(w, kv): (w, kv) for w, kv in req.precisions}
    pairs = ([(str(d.target.weights), str(d.target.kv_cache)) for _, d in docs.values()]
             if docs else list(req.precisions))
    with WorkerPool(default_workers(64), preload=[ReplayTask.__module__]) as pool:
        swept, edges = run_sweeps(req, to_sweep, pool, progress)
        docs.update(swept)
        figures = {f.name: f for f in (figures_from_sweep(doc, src, req.cap_margin)
                                       for src, doc in docs.values())}
        if treq.cap is not None:
            figures = {k: replace(f, gateway_cap=treq.cap) if f.gateway_cap else f
                       for k, f in figures.items()}
        verdicts = accuracy_verdicts(accuracy, list(figures))
        state: dict[str, Any] = {}
        planner = TracePlanner(req.profile.system_prompt_tokens, req.slo, progress)
        planner.stages = _stages(planner, req, treq, trace, figures, verdicts, target,
                                 doubled, bool(edges), state)
        pool.feed(planner)
    return _answer(req, treq, trace, skipped, pairs, docs, edges, figures, verdicts, target,
                   doubled, planner, state)


def _engine(req: PlanRequest, fig: PrecisionFigures, scale: float = 1.0) -> Engine:
    assert fig.gateway_cap is not None
    spec = engine_spec(req, fig.weights, fig.kv_cache, max_running_requests=fig.gateway_cap)
    if scale != 1.0:
        spec = scaled_spec(spec, scale)
    return Engine(spec, fig.gateway_cap, prefill_reserve_s(fig, req.slo.ttft_ms / 1000.0))


def _stages(planner: TracePlanner, req: PlanRequest, treq: TraceRequest, trace: Trace,
            figures: dict[str, PrecisionFigures], verdicts: dict[str, Any],
            target: list[Segment], doubled: list[Segment], band: bool,
            state: dict[str, Any]) -> Iterator[None]:
    """The plan's stages (jobs/trace_search.py): each precision's fleet for the trace; then
    the chosen one's doubled traffic, error band and clocks; then its fleet at a held clock."""
    usable: dict[str, PrecisionFigures] = {}
    for name, fig in figures.items():
        if not fig.gateway_cap or not verdicts[name].allowed:
            continue
        why = fits_pool(req, fig, trace)
        if why is not None:
            state.setdefault("unfit", {})[name] = why
            continue
        usable[name] = fig
    for name, fig in usable.items():
        if treq.replicas is not None:
            for seg in target:
                planner.single(f"{name}/target/{seg.index}", _engine(req, fig), treq.replicas,
                               seg)
            continue
        # judged on the busiest hours only: only the chosen precision is verified on every
        # hour (the others' fleets are the costlier ones, and their answers say so)
        guess = first_guess(fig, target)
        planner.search(f"{name}/target", _engine(req, fig), target, guess,
                       min(MAX_REPLICAS, max(64, 16 * guess)), verify=len(usable) == 1)
    yield
    best = _choose(usable, planner, treq)
    state["best"] = best
    if best is None:
        return
    judged = planner.searches.get(f"{best}/target")
    if judged is not None and not judged.search.verify:
        start = judged.search.answer
        assert start is not None
        verified = planner.search(f"{best}/target", _engine(req, usable[best]), target,
                                  start, judged.search.max_replicas)
        verified.search.lo = judged.search.lo  # one fewer is known to fail: verify at once
        yield
        if planner.searches[f"{best}/target"].search.answer is None:  # no fleet up to the
            state["best"] = None  # limit serves every hour
            return
    fig = usable[best]
    eng = _engine(req, fig)
    replicas = _replicas(planner, best, treq)
    assert replicas is not None
    if treq.replicas is not None:
        for seg in doubled:
            planner.single(f"{best}/doubled/{seg.index}", eng, replicas, seg)
    else:
        guess = max(replicas, first_guess(fig, doubled))
        cap = min(MAX_REPLICAS, max(64, 16 * guess))
        planner.search(f"{best}/doubled", eng, doubled, guess, cap)
        if band:
            k = provenance_of(eng.spec).band
            for edge, scale in zip(BAND_EDGES, (1.0 + k, 1.0 - k), strict=True):
                edge_eng = _engine(req, fig, scale)
                planner.search(f"{best}/target/{edge}", edge_eng, target, replicas, cap,
                               verify=False)
                planner.search(f"{best}/doubled/{edge}", edge_eng, doubled, guess, cap,
                               verify=False)
        planner.single(f"{best}/doubled-on-target-fleet", eng, replicas,
                       doubled[busiest_first(doubled)[0]])
    busiest = target[busiest_first(target)[0]]
    planner.single(f"{best}/clocks/off", eng, replicas, busiest, gpu=True, groups=1)
    planner.single(f"{best}/clocks/on", replace(eng, spec=replace(eng.spec, thermal=True)),
                   replicas, busiest, gpu=True, groups=1)
    yield
    yield from trace_thermal(planner, req, best, fig, eng, replicas, target, state,
                             MAX_REPLICAS, treq.time_scale)


def _replicas(planner: TracePlanner, name: str, treq: TraceRequest) -> int | None:
    if treq.replicas is not None:
        return treq.replicas
    return planner.searches[f"{name}/target"].search.answer


def _choose(usable: dict[str, PrecisionFigures], planner: TracePlanner,
            treq: TraceRequest) -> str | None:
    """The precision with the fewest replicas (then the most users per card at its knee,
    then the wider format)."""
    found = [(r, -(f.users_per_card or 0), i, name)
             for i, (name, f) in enumerate(usable.items())
             if (r := _replicas(planner, name, treq)) is not None]
    return min(found)[3] if found else None


def _results(planner: TracePlanner, name: str, segments: list[Segment],
             fixed: int | None) -> tuple[list[SegmentResult], Search | None, int | None,
                                          str | None]:
    if fixed is not None:
        res = [planner.singles[f"{name}/{s.index}"].result for s in segments]
        return [r for r in res if r is not None], None, fixed, None
    s = planner.searches.get(name)
    if s is None:
        return [], None, None, None
    return s.search.at_answer(), s, s.search.answer, s.search.why_none


def _answer(req: PlanRequest, treq: TraceRequest, trace: Trace, skipped: dict[str, int],
            pairs: list[tuple[str, str]], docs: dict[str, Any], edges: dict[str, Any],
            figures: dict[str, PrecisionFigures], verdicts: dict[str, Any],
            target: list[Segment], doubled: list[Segment], planner: TracePlanner,
            state: dict[str, Any]) -> Plan:
    pools = {precision_name(w, kv): pool_of(req, w, kv) for w, kv in pairs}
    best: str | None = state.get("best")
    block = trace_summary(trace, treq, skipped)
    block["segments"] = len(target)
    block["profile"] = {k: getattr(req.profile, k) for k in
                        ("input_len", "output_len", "turns", "think_time_s")}
    block["rule"] = ("nothing shed, and in every segment at least "
                     f"{req.slo.attainment:.0%} of the counted turns within the target")
    per: dict[str, Any] = {}
    by_precision: dict[str, PrecisionEntry] = {}
    for name, f in figures.items():
        res, search, replicas, why = _results(planner, f"{name}/target", target, treq.replicas)
        entry: dict[str, Any] = {
            "cap": f.gateway_cap,
            "prefill_reserve_s": prefill_reserve_s(f, req.slo.ttft_ms / 1000.0),
            "target": level(res, len(target), search, treq.time_scale, replicas,
                            why or state.get("unfit", {}).get(name))}
        if name == best:
            dres, dsearch, dreplicas, dwhy = _results(planner, f"{name}/doubled", doubled,
                                                      treq.replicas)
            entry["doubled"] = level(dres, len(doubled), dsearch,
                                     treq.time_scale * treq.doubling, dreplicas, dwhy)
            entry["band"] = _band(planner, name)
            on = planner.singles.get(f"{name}/doubled-on-target-fleet")
            if on is not None and on.result is not None:
                entry["doubled_on_target_fleet"] = level([on.result], 1, None,
                                                         treq.time_scale * treq.doubling,
                                                         replicas)
        per[name] = entry
        pe = PrecisionEntry(figures=f, pool=pool_json(req, pools[name]),
                            accuracy=verdicts[name],
                            uncertainty=(uncertainty(req, edges[name]) if name in edges
                                         else None))
        if replicas is not None and f.users_per_card:
            tier = host_tier_of(req, f, pools[name])
            pe = replace(pe, replicas=replicas, cards=replicas, host_tier=tier,
                         launch={k: launch_of(v) for k, v in
                                 launch_commands(req, f, pools[name], tier).items()})
        by_precision[name] = pe
    block["precisions"] = per
    if "thermal" in state:
        block["thermal"] = state["thermal"]
    target_users = (per[best]["target"].get("peak_users") or 1) if best else 1
    plan = Plan(pool=pool_json(req, pools[best] if best else next(iter(pools.values()))),
                chatfleet_version=__version__, engine_model=req.engine_model,
                target_users=target_users, slo=req.slo,
                session_profile={**req.profile.workload().to_json()}, recommendation=None,
                why_none=None, by_precision=by_precision,
                calibration=(provenance_of(engine_spec(req, "bf16", "bf16")).to_json()
                             if edges else None),
                sweeps={n: SweepRef(src, doc if src == "twin" else None)
                        for n, (src, doc) in docs.items()},
                trace=TraceAnswer(block))
    if best is None:
        return replace(plan, why_none=_why_none(per, figures, verdicts, state))
    f = figures[best]
    t = per[best]["target"]
    replicas = t["replicas"]
    assert f.gateway_cap is not None and replicas is not None
    gw = gateway_config(req, f, replicas)
    chosen = by_precision[best]
    others = [f"{n}: {per[n]['target']['replicas']}" for n in per
              if n != best and per[n]["target"].get("replicas") is not None]
    why = (f"{best}: {replicas} replicas serve the trace" if treq.replicas is None
           else f"{best}: the fleet of {replicas} replicas given")
    if others:
        why += " (" + ", ".join(others) + ")"
    rec = Recommendation(
        precision=best, weights=f.weights, kv_cache=f.kv_cache,
        users_per_card=t.get("users_per_card") or 0, gateway_cap=f.gateway_cap,
        engine_guard=f.gateway_cap, goodput_rps=f.goodput_rps, replicas=replicas,
        cards=replicas, headroom=0.0, why=why, source=f.source,
        cooling=cooling_assumption(state.get("cooling"), state.get("held_mhz")))
    return replace(plan, recommendation=rec, host_tier=chosen.host_tier,
                   launch=chosen.launch, gateway_config=gw)


def _band(planner: TracePlanner, name: str) -> dict[str, Any] | None:
    out: dict[str, Any] = {}
    for lvl in ("target", "doubled"):
        edges = {edge: planner.searches.get(f"{name}/{lvl}/{edge}") for edge in BAND_EDGES}
        if all(s is None for s in edges.values()):
            return None
        out[lvl] = {edge: None if s is None else s.search.answer for edge, s in edges.items()}
    out["judged_on"] = "the critical segments (the busiest hours) only, not verified"
    return out


def _why_none(per: dict[str, Any], figures: dict[str, PrecisionFigures],
              verdicts: dict[str, Any], state: dict[str, Any]) -> str:
    reasons = []
    for name, f in figures.items():
        if not f.gateway_cap:
            reasons.append(f"{name}: no load meets the target in its sweep")
        elif not verdicts[name].allowed:
            reasons.append(f"{name}: excluded by accuracy")
        elif name in state.get("unfit", {}):
            reasons.append(f"{name}: {state['unfit'][name]}")
        else:
            reasons.append(f"{name}: {per[name]['target'].get('why_none')}")
    if not reasons:
        raise PlanError("no precision to plan")
    return "; ".join(reasons)
