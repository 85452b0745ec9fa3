"""`chatfleet plan`: KV pool sizing, and with `--users` the full answer (users per card for each
precision, the caps, the fleet, doubled traffic, launch commands, the gateway config)."""

from __future__ import annotations

import math
from pathlib import Path

import typer
from rich.table import Table

from chatfleet.cli.common import (
    check_output_file,
    clean_errors,
    fail,
    load_gpu,
    load_model,
    out,
    parse_list,
    print_json,
    progress_bars,
    uncalibrated_note,
)
from chatfleet.cli.options import MAX_PLAN_USERS, profile_calibration, read_sweep_file
from chatfleet.cli.render import gateway_yaml, pool_table, print_answer
from chatfleet.cli.render_trace import print_trace_answer
from chatfleet.core.defaults import DURATION_S, SEED, SYSTEM_PROMPT_TOKENS, WARMUP_S
from chatfleet.core.documents.load import load_from_json
from chatfleet.core.memory import REQUEST_TOKENS, plan_pool, plan_vllm_pool
from chatfleet.core.slo import SLO
from chatfleet.core.workload import LengthSpec, SessionProfile
from chatfleet.io import write_atomic, write_json
from chatfleet.jobs.plan import PlanRequest, make_plan, parse_precisions
from chatfleet.jobs.plan_trace import TRACE_FORMATS, TraceRequest, make_trace_plan
from chatfleet.jobs.workers import WorkerError
from chatfleet.report.load import number, read_json


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
    request_tokens: int = typer.Option(
        REQUEST_TOKENS, help="Pool sizing only: tokens one request adds."),
    system_prompt_tokens: int = typer.Option(
        SYSTEM_PROMPT_TOKENS, help="Tokens of the shared system prompt."),
    users: int | None = typer.Option(None, help="Concurrent users to serve: gives the full "
                                     "answer (without it: pool sizing only)."),
    sweep: list[Path] = typer.Option([], "--sweep", help="A chatfleet.sweep/1 file (or live "
                                     "sweep DIR) per precision, instead of twin sweeps."),
    accuracy: Path | None = typer.Option(None, help="A `chatfleet accuracy --out` result: a "
                                         "precision outside its margin is not recommended."),
    precisions: str = typer.Option("bf16,fp8", help="Precisions to sweep with the twin: bf16, "
                                   "fp8, or W/KV such as fp8/bf16."),
    headroom: float = typer.Option(0.2, help="Spare capacity for the fleet (0.2: 20%)."),
    slo_ttft_ms: float = typer.Option(SLO().ttft_ms, help="TTFT target."),
    slo_tpot_ms: float = typer.Option(SLO().tpot_ms, help="Per-token target."),
    itl_stat: str = typer.Option(
        SLO().itl_stat, help="Per-request statistic: mean (TPOT), p99, max."),
    attainment: float = typer.Option(
        SLO().attainment, help="Share of requests that must meet the target."),
    input_len: int = typer.Option(
        LengthSpec().input_len, help="Session profile: user tokens per turn (mean)."),
    output_len: int = typer.Option(
        LengthSpec().output_len, help="Session profile: answer tokens per turn (mean)."),
    range_ratio: float = typer.Option(0.5, help="Lengths uniform within +-this share."),
    turns: int = typer.Option(1, help="Session profile: turns per session."),
    think_time: float = typer.Option(0.0, help="Session profile: mean think time, seconds."),
    prompt_groups: int = typer.Option(1, help="Distinct shared system prompts."),
    grid: str = typer.Option("1,2,4,8,12,16,24,32,48,64", help="Twin: closed-loop user counts "
                             "(the knee is then bisected to one user)."),
    rates: str = typer.Option("0.125,0.25,0.5,1,2,4",
                              help="Twin: fixed arrival rates, requests/s."),
    duration: float = typer.Option(DURATION_S, help="Twin: measurement window per point, seconds."),
    warmup: float = typer.Option(WARMUP_S, help="Twin: warm-up per point, seconds."),
    seed: int = typer.Option(SEED, help="Base seed."),
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
    profile: Path | None = typer.Option(
        None, help="A profile `chatfleet twin calibrate` fitted on your engine: the twin runs "
        "its constants and carries its error band (default: the built-in ones)."),
    trace: Path | None = typer.Option(
        None, "--trace", help="Your own traffic instead of --users: a trace (docs/traffic.md), "
        "an OpenAI-style request log or a run's records; the answer is the fewest cards that "
        "serve it with the P99 user within target and nothing shed."),
    trace_format: str = typer.Option(
        "auto", help="--trace: trace, openai (a request log with timestamps and usage) or "
        "records (a chatfleet run's records.jsonl, its folder or a sweep's); auto: records "
        "for a folder or records.jsonl, else trace."),
    window: str | None = typer.Option(
        None, help="--trace: replay only the turns sent in START-END of the trace (seconds "
        "after its first line, or with s/m/h: 13h-14h)."),
    time_scale: float = typer.Option(
        1.0, help="--trace: sessions start this many times sooner (2: twice the sessions an "
        "hour, each at its own pace)."),
    doubling: float = typer.Option(
        2.0, help="--trace: the doubled traffic's time scale on top of --time-scale."),
    replicas: int | None = typer.Option(
        None, help="--trace: replay on this many replicas, searching nothing (what your "
        "fleet does with the traffic)."),
    cap: int | None = typer.Option(
        None, help="--trace: the gateway cap per replica (default: each precision's knee)."),
) -> None:
    """Size the KV pool the way SGLang (or vLLM) does; with --users, answer how many users fit
    on a card, which precision to serve, which caps, how many cards, and how to launch it."""
    if engine_model not in ("sglang", "vllm"):
        with clean_errors():
            fail(f"--engine-model {engine_model!r}: choose sglang or vllm")
    if trace is not None:
        with clean_errors():
            if users is not None:
                fail("--users and --trace ask two questions: give one (the trace's own peak "
                     "of users is the answer's)")
            treq = trace_request(trace, trace_format, window, time_scale, doubling, replicas,
                                 cap)
        users = 1  # the trace's peak replaces it
    else:
        treq = None
        for flag, value in (("--window", window), ("--replicas", replicas), ("--cap", cap)):
            if value is not None:
                with clean_errors():
                    fail(f"{flag} is for --trace")
    if users is None and not sweep:
        if engine_model == "vllm":
            vllm_pool_only(gpu, model, weights, kv_cache, mem_fraction, request_tokens,
                           system_prompt_tokens, as_json)
            return
        pool_only(gpu, model, weights, kv_cache, mem_fraction, request_tokens,
                  system_prompt_tokens, as_json)
        return
    with clean_errors():
        if users is None:
            fail("--users is needed for the full answer (how many concurrent users to serve)")
        if users > MAX_PLAN_USERS:
            fail(f"--users {users}: at most {MAX_PLAN_USERS:,} (the plan lists every replica "
                 "of the fleet; plan a region's share and multiply)")
        if doubling_hours <= 0 or duration <= 0 or warmup < 0:
            fail("--duration and --doubling-hours must be positive, --warmup not negative")
        if host_kv_gib < 0 or cap_margin < 0:
            fail("--host-kv-gib and --cap-margin must not be negative")
        if engine_model == "vllm" and eviction != "lru":
            fail(f"--eviction {eviction} is SGLang's radix policy: the vLLM model evicts from "
                 "its free-block queue (drop --eviction, or plan --engine-model sglang)")
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
            model_path=model_path, cap_margin=cap_margin, engine_model=engine_model,
            calibration=profile_calibration(profile, gpu, engine_model))
        req.profile.workload()  # bad lengths or turns fail here, before any work
        for sweep_path in sweep:
            check_plan_sweep(sweep_path)
        if accuracy is not None:
            check_plan_accuracy(accuracy)
        check_output_file(out_path, "--out")
        check_output_file(gateway_config_out, "--gateway-config-out")
        with progress_bars() as progress:
            try:
                doc = (make_plan(req, progress) if treq is None
                       else make_trace_plan(req, treq, progress))
            except WorkerError as exc:  # not bad input, but one line all the same
                fail(str(exc), code=1)
        if out_path is not None:
            write_json(out_path, doc.to_json())
        if gateway_config_out is not None and doc.gateway_config:
            write_atomic(gateway_config_out, gateway_yaml(doc))
    if as_json:
        print_json(doc.to_json())
        return
    if doc.trace is not None:
        print_trace_answer(doc)
    else:
        print_answer(doc)
    for path in (out_path, gateway_config_out):
        if path is not None:
            out.print(f"wrote {path}")


def parse_window(text: str) -> tuple[float, float]:
    """'START-END', each seconds or a number with s, m or h: (start, end) in seconds."""
    def seconds(part: str) -> float:
        part = part.strip().lower()
        unit = {"s": 1.0, "m": 60.0, "h": 3600.0}.get(part[-1:], 0.0)
        try:
            value = float(part[:-1] if unit else part) * (unit or 1.0)
        except ValueError:
            fail(f"--window {text!r}: give START-END in seconds or with s/m/h (13h-14h)")
        if not math.isfinite(value) or value < 0:
            fail(f"--window {text!r}: times must be finite and not negative")
        return value

    start, sep, end = text.partition("-")
    if not sep:
        fail(f"--window {text!r}: give START-END in seconds or with s/m/h (13h-14h)")
    a, b = seconds(start), seconds(end)
    if not b > a:
        fail(f"--window {text!r}: the end must come after the start")
    return a, b


def trace_request(path: Path, fmt: str, window: str | None, time_scale: float,
                  doubling: float, replicas: int | None, cap: int | None) -> TraceRequest:
    if fmt == "auto":
        fmt = "records" if path.is_dir() or path.name.endswith("records.jsonl") else "trace"
    if fmt not in TRACE_FORMATS:
        fail(f"--trace-format {fmt!r}: one of auto, {', '.join(TRACE_FORMATS)}")
    if not path.exists():
        fail(f"--trace {path}: file not found")
    if not (time_scale > 0 and doubling >= 1):
        fail("--time-scale must be positive and --doubling at least 1")
    if replicas is not None and not 1 <= replicas <= MAX_PLAN_USERS:
        fail(f"--replicas must be between 1 and {MAX_PLAN_USERS:,}")
    if cap is not None and cap < 1:
        fail("--cap must be at least 1")
    return TraceRequest(path, fmt, None if window is None else parse_window(window),
                        time_scale, doubling, replicas, cap)


def check_plan_sweep(path: Path) -> None:
    """A --sweep file holds what the plan reads from it: a well-formed chatfleet.sweep/1
    document whose target names its precision and whose knee is one of its valid points. A
    file that does not is one line, not a KeyError deep in the plan."""
    doc = read_sweep_file(path, "--sweep")
    where = f"--sweep {path}"
    target = doc.get("target") or {}
    if not all(isinstance(target.get(k), str) for k in ("weights", "kv_cache")):
        fail(f"{where}: target.weights and target.kv_cache are needed to know which precision "
             "the sweep measured")
    # read_sweep_file checked every point's load: the typed loads of the valid points
    valid = [load_from_json(p["load"], f"{where}, point {i}")
             for i, p in enumerate(doc["points"]) if p.get("valid", True)]
    for key, mode in (("knee", "closed"), ("knee_rate", "open")):
        knee = doc.get(key)
        if knee is None:
            continue
        meets = knee.get("meets") if isinstance(knee, dict) else None
        if not isinstance(knee, dict) or (meets is not None and number(meets) is None):
            fail(f"{where}: {key} must be an object {{'meets': number or null, 'fails': ...}}")
        if meets is not None and not any(
                load.mode == mode and load.value == meets for load in valid):
            fail(f"{where}: {key}.meets {meets} is not one of its valid {mode}-loop points")


def check_plan_accuracy(path: Path) -> None:
    """An --accuracy file holds what the plan reads: a chatfleet.accuracy/1 result whose
    targets are objects and whose comparisons carry their difference's interval."""
    where = f"--accuracy {path}"
    if not path.is_file():
        fail(f"{where}: no such file (give the file `chatfleet accuracy --out` wrote)")
    try:
        doc = read_json(path, "accuracy result")
    except UnicodeDecodeError:
        fail(f"{where}: not UTF-8 text, so not an accuracy result")
    targets = doc.get("targets") if isinstance(doc, dict) else None
    if (not isinstance(doc, dict) or doc.get("schema") != "chatfleet.accuracy/1"
            or not isinstance(targets, dict)):
        fail(f"{where}: not a chatfleet.accuracy/1 result (give the file `chatfleet accuracy "
             "--out` wrote)")
    comparisons = doc.get("comparisons") or []
    paired = doc.get("paired")
    if not isinstance(comparisons, list) or (paired and not isinstance(paired, dict)):
        fail(f"{where}: 'comparisons' must be a list and 'paired' an object")
    if any(not isinstance(t, dict) for t in targets.values()):
        fail(f"{where}: every target must be an object (its accuracy, interval, ...)")
    for c in [*comparisons, *([paired] if paired else [])]:
        ci = c.get("diff_ci95") if isinstance(c, dict) else None
        if (not isinstance(ci, list) or len(ci) != 2
                or any(number(v) is None for v in ci)):
            fail(f"{where}: every comparison needs diff_ci95, two numbers")
    if doc.get("margin") is not None and number(doc["margin"]) is None:
        fail(f"{where}: 'margin' must be a number")


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
