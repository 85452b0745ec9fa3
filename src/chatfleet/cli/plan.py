"""`chatfleet plan`: KV pool sizing, and with `--users` the full answer (users per card for each
precision, the caps, the fleet, doubled traffic, launch commands, the gateway config)."""

from __future__ import annotations

from pathlib import Path

import typer
import yaml
from rich.table import Table

from chatfleet.cli.common import (
    clean_errors,
    fail,
    load_gpu,
    load_model,
    out,
    parse_list,
    print_json,
    progress_bars,
    uncalibrated_note,
    write_json_atomic,
)
from chatfleet.cli.twin import fmt
from chatfleet.core.documents.plan import Doubling, Plan
from chatfleet.core.measure.slo import SLO
from chatfleet.core.memory import PoolPlan, plan_pool


def plan(
    gpu: str = typer.Option(
        "l4", help="GPU: l4, a10g, l40s, a100-40gb, a100-80gb, h100-sxm, h200."),
    model: str = typer.Option("qwen3-8b", help="Built-in model name or path to a config.json."),
    weights: str = typer.Option("bf16", help="Pool sizing only: weight precision, bf16 or fp8."),
    kv_cache: str = typer.Option("bf16", "--kv-cache", help="Pool sizing only: KV cache "
                                 "precision, bf16 or fp8."),
    mem_fraction: float | None = typer.Option(
        None, help="SGLang's --mem-fraction-static; default: SGLang's rule for the card (the "
        "vLLM model: --gpu-memory-utilization, default 0.9)."),
    request_tokens: int = typer.Option(640, help="Pool sizing only: tokens one request adds."),
    system_prompt_tokens: int = typer.Option(2048, help="Tokens of the shared system prompt."),
    users: int | None = typer.Option(None, help="Concurrent users to serve: gives the full "
                                     "answer (without it: pool sizing only)."),
    sweep: list[Path] = typer.Option([], "--sweep", help="A chatfleet.sweep/1 file (or live "
                                     "sweep DIR) per precision, instead of twin sweeps."),
    accuracy: Path | None = typer.Option(None, help="A `chatfleet accuracy --out` result: a "
                                         "precision outside its margin is not recommended."),
    precisions: str = typer.Option("bf16,fp8", help="Precisions to sweep with the twin: bf16, "
                                   "fp8, or W/KV such as fp8/bf16."),
    headroom: float = typer.Option(0.2, help="Spare capacity for the fleet (0.2: 20%)."),
    slo_ttft_ms: float = typer.Option(1000.0, help="TTFT target."),
    slo_tpot_ms: float = typer.Option(100.0, help="Per-token target."),
    itl_stat: str = typer.Option("mean", help="Per-request statistic: mean (TPOT), p99, max."),
    attainment: float = typer.Option(0.99, help="Share of requests that must meet the target."),
    input_len: int = typer.Option(512, help="Session profile: user tokens per turn (mean)."),
    output_len: int = typer.Option(128, help="Session profile: answer tokens per turn (mean)."),
    range_ratio: float = typer.Option(0.5, help="Lengths uniform within +-this share."),
    turns: int = typer.Option(1, help="Session profile: turns per session."),
    think_time: float = typer.Option(0.0, help="Session profile: mean think time, seconds."),
    prompt_groups: int = typer.Option(1, help="Distinct shared system prompts."),
    grid: str = typer.Option("1,2,4,8,12,16,24,32,48,64", help="Twin: closed-loop user counts "
                             "(the knee is then bisected to one user)."),
    rates: str = typer.Option("0.125,0.25,0.5,1,2,4",
                              help="Twin: fixed arrival rates, requests/s."),
    duration: float = typer.Option(300.0, help="Twin: measurement window per point, seconds."),
    warmup: float = typer.Option(30.0, help="Twin: warm-up per point, seconds."),
    seed: int = typer.Option(1, help="Base seed."),
    host_kv_gib: float = typer.Option(16.0, help="Host memory a replica may give HiCache, GiB."),
    eviction: str = typer.Option("lru", help="Radix eviction policy for the launch command."),
    model_path: str | None = typer.Option(None, help="Checkpoint for the launch commands "
                                          "(default: the model's Hugging Face id)."),
    doubling_hours: float = typer.Option(1.0, help="How long the doubled traffic lasts."),
    cap_margin: int = typer.Option(0, help="Lower the gateway cap this many grid steps below "
                                   "the knee (after refinement a step is one user)."),
    out_path: Path | None = typer.Option(None, "--out", help="Write the JSON document here."),
    gateway_config_out: Path | None = typer.Option(
        None, "--gateway-config-out", help="Write the gateway's config file (YAML) here."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
    engine_model: str = typer.Option(
        "sglang", help="The engine the plan is for: sglang (SGLang's pool rule and twin) or "
        "vllm (vLLM's pool rule, the vLLM twin's knee, vLLM's launch command)."),
) -> None:
    """Size the KV pool the way SGLang (or vLLM) does; with --users, answer how many users fit
    on a card, which precision to serve, which caps, how many cards, and how to launch it."""
    if engine_model not in ("sglang", "vllm"):
        with clean_errors():
            fail(f"--engine-model {engine_model!r}: choose sglang or vllm")
    if users is None and not sweep:
        if engine_model == "vllm":
            vllm_pool_only(gpu, model, weights, kv_cache, mem_fraction, request_tokens,
                           system_prompt_tokens, as_json)
            return
        pool_only(gpu, model, weights, kv_cache, mem_fraction, request_tokens,
                  system_prompt_tokens, as_json)
        return
    from chatfleet.planner import PlanRequest, SessionProfile, make_plan, parse_precisions

    with clean_errors():
        if users is None:
            fail("--users is needed for the full answer (how many concurrent users to serve)")
        if doubling_hours <= 0 or duration <= 0 or warmup < 0:
            fail("--duration and --doubling-hours must be positive, --warmup not negative")
        if host_kv_gib < 0 or cap_margin < 0:
            fail("--host-kv-gib and --cap-margin must not be negative")
        req = PlanRequest(
            gpu=load_gpu(gpu), model=load_model(model), users=users,
            slo=SLO(slo_ttft_ms, slo_tpot_ms, itl_stat, attainment),  # type: ignore[arg-type]
            profile=SessionProfile(input_len, output_len, range_ratio, turns, think_time,
                                   system_prompt_tokens, prompt_groups),
            precisions=parse_precisions(precisions), sweeps=tuple(sweep), accuracy=accuracy,
            headroom=headroom, host_kv_gib=host_kv_gib, mem_fraction=mem_fraction,
            grid=tuple(parse_list(grid, int, "--grid")),
            rates=tuple(parse_list(rates, float, "--rates")), duration_s=duration,
            warmup_s=warmup, seed=seed, doubling_hours=doubling_hours, eviction=eviction,
            model_path=model_path, cap_margin=cap_margin, engine_model=engine_model)
        req.profile.workload()  # bad lengths or turns fail here, before any work
        with progress_bars() as progress:
            doc = make_plan(req, progress)
        if out_path is not None:
            write_json_atomic(out_path, doc.to_json())
        if gateway_config_out is not None and doc.gateway_config:
            gateway_config_out.parent.mkdir(parents=True, exist_ok=True)
            gateway_config_out.write_text(gateway_yaml(doc), encoding="utf-8")
    if as_json:
        print_json(doc.to_json())
        return
    print_answer(doc)
    for path in (out_path, gateway_config_out):
        if path is not None:
            out.print(f"wrote {path}")


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
        t.add_row(name, f"{p.pool.kv_pool_tokens:,}", fmt(f.users_per_card, "d"),
                  fmt(f.gateway_cap, "d"), fmt(f.goodput_rps, ".2f"), fmt(f.rate_rps, ".2f"),
                  fmt(p.replicas, "d"), fmt(p.cards, "d"),
                  ("ok" if p.accuracy.allowed else "outside margin")
                  + ("" if p.accuracy.checked else " (not checked)"), where)
    out.print(t)
    if not calibrated:
        out.print(f"[yellow]{uncalibrated_note(doc.pool.gpu)}[/]", highlight=False)
    if rec is None:
        out.print(f"[bold]no recommendation:[/] {doc.why_none}")
        return
    out.print(f"[bold]recommended:[/] {rec.precision}, {rec.users_per_card} users per "
              f"card, gateway cap {rec.gateway_cap} per replica (engine guard "
              f"--max-running-requests {rec.engine_guard}), {rec.replicas} replicas on "
              f"{rec.cards} cards for {doc.target_users} users with "
              f"{rec.headroom:.0%} headroom. Why: {rec.why}")
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


def pool_only(gpu: str, model: str, weights: str, kv_cache: str, mem_fraction: float | None,
              request_tokens: int, system_prompt_tokens: int, as_json: bool) -> None:
    with clean_errors():
        p = plan_pool(load_gpu(gpu), load_model(model), weights, kv_cache,
                      mem_fraction=mem_fraction, request_tokens=request_tokens,
                      system_prompt_tokens=system_prompt_tokens)
    if as_json:
        print_json(p.to_json())
        return
    out.print(pool_table(p))
    if not p.calibrated:
        out.print(f"[yellow]{uncalibrated_note(p.gpu)}[/]", highlight=False)


def vllm_pool_only(gpu: str, model: str, weights: str, kv_cache: str, util: float | None,
                   request_tokens: int, system_prompt_tokens: int, as_json: bool) -> None:
    """vLLM's memory rule (core/memory.py: its overheads are assumed, not measured)."""
    from chatfleet.core.memory import plan_vllm_pool

    with clean_errors():
        if request_tokens <= 0 or system_prompt_tokens < 0:
            fail("--request-tokens must be positive and --system-prompt-tokens not negative")
        p = plan_vllm_pool(load_gpu(gpu), load_model(model), weights, kv_cache,
                           gpu_memory_utilization=util)
    fit = max(0, (p.kv_pool_tokens - system_prompt_tokens) // request_tokens)
    prompts = p.kv_pool_tokens // system_prompt_tokens if system_prompt_tokens else 0
    if as_json:
        print_json({**p.to_json(), "request_tokens": request_tokens,
                    "system_prompt_tokens": system_prompt_tokens, "requests_fit": fit,
                    "prompts_fit": prompts})
        return
    t = Table(title=f"vLLM KV pool: {p.model} on {p.gpu}, weights {p.weights}, KV "
              f"{p.kv_cache} [yellow](vLLM's rule with assumed overheads: uncalibrated)[/]")
    t.add_column("figure")
    t.add_column("value", justify="right")
    rows = [
        ("card memory (total)", f"{p.total_gib:.3f} GiB"),
        ("gpu_memory_utilization", f"{p.gpu_memory_utilization:g}"),
        ("weights", f"{p.weights_gib:.3f} GiB"),
        ("activation peak (assumed)", f"{p.activation_peak_gib:.3f} GiB"),
        ("non-torch + CUDA graphs (assumed)", f"{p.non_torch_gib + p.cudagraph_gib:.3f} GiB"),
        ("KV cache", f"{p.kv_cache_gib:.3f} GiB"),
        ("KV pool", f"{p.kv_pool_tokens:,} tokens ({p.num_gpu_blocks:,} blocks of "
                    f"{p.block_size})"),
        ("max_num_batched_tokens / max_num_seqs",
         f"{p.max_num_batched_tokens} / {p.max_num_seqs}"),
        (f"requests that fit ({request_tokens} tokens each, one shared prompt cached)",
         f"{fit:,}"),
        (f"shared prompts that fit ({system_prompt_tokens} tokens each)", f"{prompts:,}"),
    ]
    for k, v in rows:
        t.add_row(k, v)
    out.print(t)


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
