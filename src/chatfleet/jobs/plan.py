"""`chatfleet plan`'s full answer: for each precision, the KV pool and a sweep (run through the
twin, or read from a sweep's JSON); then users per card at the knee, goodput at the target, the
caps, the fleet for the target users, what an hour of doubled traffic does, the launch commands
for SGLang and vLLM, and the gateway's config file. With `engine_model` "vllm" the twin runs the
vLLM model: its pool rule, its knee, and vLLM's launch command only.

The arithmetic from sweep to answer is pure (core/plan.py); this module runs the twin, reads
files and builds the commands.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from chatfleet import __version__
from chatfleet.core.documents.fields import DocumentError
from chatfleet.core.documents.plan import (
    CountEdges,
    HostTier,
    KneeEdges,
    Launch,
    Plan,
    PrecisionEntry,
    Recommendation,
    SweepRef,
    Uncertainty,
)
from chatfleet.core.documents.sweep import SCHEMA, ClosedLoad, Load, OpenLoad, SweepDoc
from chatfleet.core.engine.build import provenance_of, scaled_spec
from chatfleet.core.memory import PoolPlan, VLLMPoolPlan
from chatfleet.core.plan import (
    PlanError,
    PrecisionFigures,
    accuracy_verdicts,
    choose_precision,
    figures_from_sweep,
    fleet_size,
    host_tier,
    precision_name,
    prefill_reserve_s,
    working_set_tokens,
)
from chatfleet.core.specs import GIB, precision
from chatfleet.engines import SGLangAdapter, VLLMAdapter
from chatfleet.engines.base import LaunchCommand
from chatfleet.gateway.config import parse_config
from chatfleet.jobs.plan_fleet import DOUBLING_LEVELS as DOUBLING_LEVELS
from chatfleet.jobs.plan_fleet import DOUBLING_RUNS as DOUBLING_RUNS
from chatfleet.jobs.plan_fleet import FLEET_STEP as FLEET_STEP
from chatfleet.jobs.plan_fleet import THERMAL_MODELS as THERMAL_MODELS
from chatfleet.jobs.plan_fleet import cooling_block as cooling_block
from chatfleet.jobs.plan_fleet import doubling as doubling
from chatfleet.jobs.plan_fleet import fleet_runs_of as fleet_runs_of
from chatfleet.jobs.plan_fleet import run_fleet_runs as run_fleet_runs
from chatfleet.jobs.plan_request import DEFAULT_GRID as DEFAULT_GRID
from chatfleet.jobs.plan_request import DEFAULT_RATES as DEFAULT_RATES
from chatfleet.jobs.plan_request import PlanRequest as PlanRequest
from chatfleet.jobs.plan_request import Progress as Progress
from chatfleet.jobs.plan_request import engine_spec as engine_spec
from chatfleet.jobs.plan_request import model_path as model_path
from chatfleet.jobs.plan_request import pool_json as pool_json
from chatfleet.jobs.plan_request import pool_of as pool_of
from chatfleet.jobs.plan_tasks import FleetRun as FleetRun
from chatfleet.jobs.plan_tasks import SweepTask
from chatfleet.jobs.plan_thermal import cooling_assumption, held_clock_fleet
from chatfleet.jobs.workers import WorkerPool, default_workers
from chatfleet.twin.sweep import TwinSweep

SGLANG_PORT = 30000
VLLM_PORT = 8000




def _read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PlanError(f"{what} {path}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PlanError(f"{what} {path}: not readable JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise PlanError(f"{what} {path}: not a JSON object")
    return doc


def load_sweep(path: Path) -> SweepDoc:
    """A chatfleet.sweep/1 document: a file, or a live sweep's directory (DIR/sweep.json)."""
    file = path / "sweep.json" if path.is_dir() else path
    doc = _read_json(file, "sweep")
    if doc.get("schema") != SCHEMA:
        raise PlanError(f"sweep {file}: schema is {doc.get('schema')!r}, not {SCHEMA}")
    try:
        return SweepDoc.from_json(doc, f"sweep {file}")
    except DocumentError as exc:
        raise PlanError(str(exc)) from None


def load_accuracy(path: Path) -> dict[str, Any]:
    doc = _read_json(path, "accuracy result")
    if doc.get("schema") != "chatfleet.accuracy/1" or not isinstance(doc.get("targets"), dict):
        raise PlanError(f"accuracy result {path}: not a chatfleet.accuracy/1 document")
    return doc


def sweep_task(req: PlanRequest, weights: str, kv: str, scale: float = 1.0) -> SweepTask:
    """A flushed closed-loop grid and a fixed-rate grid through the twin, both knees refined;
    with every step `scale` times as long for the edges of the error band."""
    loads: list[Load] = [ClosedLoad(c) for c in req.grid]
    loads += [OpenLoad(r, "poisson", 1.0) for r in req.rates]
    spec = engine_spec(req, weights, kv)
    if scale != 1.0:
        spec = scaled_spec(spec, scale)
    sweeper = TwinSweep(spec, req.profile.workload(), req.slo,
                        duration_s=req.duration_s, warmup_s=req.warmup_s, seed=req.seed)
    return SweepTask(sweeper, tuple(loads))


# each twin sweep three times: as the constants are, and with every step (1 + band) and
# (1 - band) times as long (the edges of the calibration's error band)
BAND_EDGES = ("slower", "faster")


def launch_commands(req: PlanRequest, fig: PrecisionFigures, pool: PoolPlan | VLLMPoolPlan,
                    tier: HostTier) -> dict[str, LaunchCommand]:
    """SGLang's and vLLM's launch commands for one replica at the plan's figures (vLLM's only
    when the figures come from the vLLM model)."""
    assert fig.gateway_cap is not None
    path = model_path(req, fig.weights)
    context = (pool.kv_pool_tokens if pool.kv_pool_tokens < req.model.max_position_embeddings
               else None)
    if isinstance(pool, VLLMPoolPlan):
        usable = (pool.num_gpu_blocks - 1) * pool.block_size
        vllm = VLLMAdapter().launch_command(
            path, (fig.weights, fig.kv_cache), req.mem_fraction,
            max_running_requests=fig.gateway_cap, host="0.0.0.0", port=VLLM_PORT,
            context_length=usable if usable < req.model.max_position_embeddings else None,
            chunked_prefill_size=pool.max_num_batched_tokens,
            served_model_name=req.model.name)
        vllm.notes.append(f"the figures are the vLLM model's (uncalibrated until `twin "
                          f"calibrate --engine-model vllm`): its pool of {pool.kv_pool_tokens:,} "
                          "tokens is vLLM's memory rule with assumed overheads; check 'GPU KV "
                          "cache size' in vLLM's log")
        return {"vllm": vllm}
    extra = ["--radix-eviction-policy", req.eviction]
    if tier.enable:
        extra += ["--enable-hierarchical-cache", "--hicache-ratio", str(tier.hicache_ratio)]
    common: dict[str, Any] = dict(max_running_requests=fig.gateway_cap, host="0.0.0.0",
                                  context_length=context,
                                  chunked_prefill_size=pool.chunked_prefill_size,
                                  served_model_name=req.model.name)
    sglang = SGLangAdapter().launch_command(path, (fig.weights, fig.kv_cache),
                                            pool.mem_fraction_static, port=SGLANG_PORT,
                                            extra=extra, **common)
    vllm = VLLMAdapter().launch_command(path, (fig.weights, fig.kv_cache), None, **common)
    vllm.notes.append("--gpu-memory-utilization left at vLLM's default: it counts the whole "
                      "card, SGLang's mem fraction does not; check the pool in vLLM's log")
    return {"sglang": sglang, "vllm": vllm}


def gateway_config(req: PlanRequest, fig: PrecisionFigures, replicas: int) -> dict[str, Any]:
    """The gateway's config file (docs/gateway.md), replicas named sglang-0..R-1 on port
    30000 (the Kubernetes Services of `chatfleet deploy k8s`; edit the URLs elsewhere), or
    vllm-0..R-1 on port 8000 for a plan of the vLLM model."""
    assert fig.gateway_cap is not None
    name, port = (("vllm", VLLM_PORT) if req.engine_model == "vllm"
                  else ("sglang", SGLANG_PORT))
    doc: dict[str, Any] = {
        "replicas": [{"name": f"{name}-{i}", "url": f"http://{name}-{i}:{port}"}
                     for i in range(replicas)],
        "cap": fig.gateway_cap,
        "queue_depth": fig.gateway_cap * replicas,
        "ttft_budget_s": req.slo.ttft_ms / 1000.0,
        "prefill_reserve_s": prefill_reserve_s(fig, req.slo.ttft_ms / 1000.0),
        "prioritize_returning": True,
        "routing": {"affinity": True, "gpu": req.gpu.name, "model": req.model.name,
                    "weights": fig.weights, "kv_cache": fig.kv_cache,
                    "shared_prefix_tokens": req.profile.system_prompt_tokens},
    }
    parse_config(doc)  # the gateway must accept what the plan writes
    return doc


def host_tier_of(req: PlanRequest, fig: PrecisionFigures,
                 pool: PoolPlan | VLLMPoolPlan) -> HostTier:
    """The method's host-tier rule (docs/facts.md#the-method) on the working set of a card's
    users at this precision."""
    assert fig.users_per_card is not None
    prof = req.profile
    ws = working_set_tokens(fig.users_per_card, prof.system_prompt_tokens, prof.prompt_groups,
                            prof.history_tokens())
    host_tokens = int(req.host_kv_gib * GIB // pool.kv_bytes_per_token)
    if isinstance(pool, VLLMPoolPlan):
        return HostTier(enable=False, why="the vLLM model has no host tier (HiCache is "
                        f"SGLang's); the working set is {ws:,} tokens against a pool of "
                        f"{pool.kv_pool_tokens:,}", working_set_tokens=ws,
                        host_tokens=host_tokens)
    return replace(host_tier(ws, pool.kv_pool_tokens, host_tokens), working_set_tokens=ws,
                   host_tokens=host_tokens)


def _launch(cmd: LaunchCommand) -> Launch:
    return Launch(argv=tuple(cmd.argv), env=dict(cmd.env), shell=cmd.shell(),
                  notes=tuple(cmd.notes))


def make_plan(req: PlanRequest, progress: Progress | None = None) -> Plan:
    """The whole answer as one document (keys in docs/plan.md). One worker pool serves the
    whole plan, started before any simulation (its workers import once, while the sweeps are
    set up): the precisions' twin sweeps (each also at the edges of the error band) at once,
    then the doubled-traffic hour's fleet runs."""
    if req.users < 1:
        raise PlanError("--users must be at least 1")
    accuracy = load_accuracy(req.accuracy) if req.accuracy is not None else None
    docs = read_sweeps(req)
    pairs = ([(str(d.target.weights), str(d.target.kv_cache)) for _, d in docs.values()]
             if docs else list(req.precisions))
    to_sweep: dict[str, tuple[str, str]] = {}  # the twin sweeps when no file is given
    for w, kv in () if docs else req.precisions:
        to_sweep.setdefault(precision_name(w, kv), (w, kv))
    workers = default_workers(max(len(to_sweep) * (1 + len(BAND_EDGES)), DOUBLING_RUNS))
    with WorkerPool(workers, preload=[SweepTask.__module__]) as pool:
        swept, edges = run_sweeps(req, to_sweep, pool, progress)
        docs.update(swept)
        return answer(req, pairs, docs, accuracy, pool, progress, edges)


def read_sweeps(req: PlanRequest) -> dict[str, tuple[str, SweepDoc]]:
    """The --sweep files by precision name, each with where it came from."""
    docs: dict[str, tuple[str, SweepDoc]] = {}
    for path in req.sweeps:
        doc = load_sweep(path)
        t = doc.target
        name = precision_name(str(t.weights), str(t.kv_cache))
        if name in docs:
            raise PlanError(f"two sweeps of {name}: {docs[name][0]} and {path}")
        if t.gpu not in (None, req.gpu.name):
            raise PlanError(f"sweep {path} was measured on {t.gpu}, not {req.gpu.name}")
        docs[name] = (str(path), doc)
    return docs


def run_sweeps(req: PlanRequest, pairs: dict[str, tuple[str, str]], pool: WorkerPool,
               progress: Progress | None
               ) -> tuple[dict[str, tuple[str, SweepDoc]], dict[str, tuple[SweepDoc, SweepDoc]]]:
    """The twin sweep of each precision, and the same at the edges of the error band (every
    step 1 + band and 1 - band times as long), all at once in the pool; the bar moves a step
    per point of any of them and ends at its total."""
    band = provenance_of(engine_spec(req, "bf16", "bf16")).band
    scales = (1.0, 1.0 + band, 1.0 - band)
    steps = len(pairs) * len(scales) * (len(req.grid) + len(req.rates) + 8)
    done = 0

    def tick() -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress("twin sweeps", min(done, steps), steps)

    tasks = [sweep_task(req, w, kv, k) for w, kv in pairs.values() for k in scales]
    swept = iter(pool.run(tasks, tick))
    if progress is not None and steps:
        progress("twin sweeps", steps, steps)
    docs: dict[str, tuple[str, SweepDoc]] = {}
    edges: dict[str, tuple[SweepDoc, SweepDoc]] = {}
    for name in pairs:
        docs[name] = ("twin", next(swept))
        edges[name] = (next(swept), next(swept))
    return docs, edges


def uncertainty(req: PlanRequest, edges: tuple[SweepDoc, SweepDoc]) -> Uncertainty:
    """The figures at the edges of the error band: knees, users per card, cards."""
    prov = provenance_of(engine_spec(req, "bf16", "bf16"))
    figs = [figures_from_sweep(doc, "twin", req.cap_margin) for doc in edges]
    users = tuple(f.users_per_card for f in figs)
    cards = tuple(None if u is None else fleet_size(req.users, u, req.headroom)["cards"]
                  for u in users)
    return Uncertainty(error_band=prov.band, source=prov.band_source,
                       knee=KneeEdges(figs[0].knee, figs[1].knee),
                       knee_rate=KneeEdges(figs[0].knee_rate, figs[1].knee_rate),
                       users_per_card=CountEdges(users[0], users[1]),
                       cards=CountEdges(cards[0], cards[1]))


def answer(req: PlanRequest, pairs: list[tuple[str, str]],
           docs: dict[str, tuple[str, SweepDoc]], accuracy: dict[str, Any] | None,
           pool: WorkerPool, progress: Progress | None,
           edges: dict[str, tuple[SweepDoc, SweepDoc]] | None = None) -> Plan:
    """The plan from each precision's sweep: the figures, the choice, the fleet, the range
    under the error band (twin sweeps: `edges`), and the doubled-traffic hour through
    `pool`."""
    pools = {precision_name(w, kv): pool_of(req, w, kv) for w, kv in pairs}
    figures = [figures_from_sweep(doc, src, req.cap_margin) for src, doc in docs.values()]
    verdicts = accuracy_verdicts(accuracy, [f.name for f in figures])
    best, why = choose_precision(figures, verdicts)

    by_precision: dict[str, PrecisionEntry] = {}
    for f in figures:
        entry = PrecisionEntry(figures=f, pool=pool_json(req, pools[f.name]),
                               accuracy=verdicts[f.name],
                               uncertainty=(uncertainty(req, edges[f.name])
                                            if edges and f.name in edges else None))
        if f.users_per_card:
            size = fleet_size(req.users, f.users_per_card, req.headroom)
            tier = host_tier_of(req, f, pools[f.name])
            entry = replace(entry, replicas=size["replicas"], cards=size["cards"],
                            host_tier=tier,
                            launch={k: _launch(v) for k, v in
                                    launch_commands(req, f, pools[f.name], tier).items()})
        by_precision[f.name] = entry

    plan = Plan(pool=pool_json(req, next(iter(pools.values()))), chatfleet_version=__version__,
                engine_model=req.engine_model, target_users=req.users, slo=req.slo,
                session_profile={**req.profile.workload().to_json()}, recommendation=None,
                why_none=why, by_precision=by_precision,
                calibration=(provenance_of(engine_spec(req, "bf16", "bf16")).to_json()
                             if edges else None),
                sweeps={name: SweepRef(src, doc if src == "twin" else None)
                        for name, (src, doc) in docs.items()})
    if best is None:
        return plan
    assert best.users_per_card is not None and best.gateway_cap is not None
    size = fleet_size(req.users, best.users_per_card, req.headroom)
    gw = gateway_config(req, best, size["replicas"])
    fleet_runs = 0

    def fleet_tick() -> None:
        nonlocal fleet_runs
        fleet_runs += 1
        if progress is not None:
            progress(FLEET_STEP, fleet_runs, DOUBLING_RUNS)

    if progress is not None:
        progress(FLEET_STEP, 0, DOUBLING_RUNS)
    chosen = by_precision[best.name]
    hour = doubling(req, best, size["replicas"], gw["queue_depth"], pool, fleet_tick)
    held = held_clock_fleet(req, best, hour, pool)
    target_on = next(r for r in hour.runs if r.traffic == "target" and r.thermal_model)
    return replace(
        plan, pool=pool_json(req, pools[best.name]), why_none=None,
        recommendation=Recommendation(
            precision=best.name, weights=best.weights, kv_cache=best.kv_cache,
            users_per_card=best.users_per_card, gateway_cap=best.gateway_cap,
            engine_guard=best.gateway_cap, goodput_rps=best.goodput_rps,
            replicas=size["replicas"], cards=size["cards"], headroom=req.headroom, why=why,
            source=best.source,
            cooling=cooling_assumption(target_on.cooling,
                                       None if held is None else held.clock_mhz)),
        host_tier=chosen.host_tier, doubling=hour, held_clock=held, launch=chosen.launch,
        gateway_config=gw)


def parse_precisions(text: str) -> tuple[tuple[str, str], ...]:
    """'bf16,fp8' -> ((bf16, bf16), (fp8, fp8)); 'fp8/bf16' -> FP8 weights, BF16 KV cache."""
    out: list[tuple[str, str]] = []
    for item in (x.strip().lower() for x in text.split(",")):
        if not item:
            continue
        w, _, kv = item.partition("/")
        pair = (w, kv or w)
        precision(*pair)  # raises SpecError for anything but bf16/fp8
        if pair in out:
            raise PlanError(f"precision {item!r} given twice")
        out.append(pair)
    if not out:
        raise PlanError("no precision given")
    return tuple(out)
