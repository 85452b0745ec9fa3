"""`chatfleet twin ...`: the engine model in virtual time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from chatfleet.cli.common import (
    clean_errors,
    console,
    fail,
    load_gpu,
    load_model,
    out,
    parse_list,
    print_json,
    uncalibrated_note,
    write_json_atomic,
)
from chatfleet.core.calibration import Calibration
from chatfleet.core.documents.sweep import (
    ClosedLoad,
    Load,
    OpenLoad,
    SweepDoc,
    SweepPoint,
    load_from_json,
)
from chatfleet.core.engine.build import EngineSpec
from chatfleet.core.engine.radix import EVICTION_POLICIES
from chatfleet.core.measure.slo import SLO
from chatfleet.core.specs import precision
from chatfleet.core.workload import GROUP_DRAWS, GroupDraw, LengthSpec, WorkloadConfig
from chatfleet.twin.fleet import MEASURED_HOP_S
from chatfleet.twin.run import is_calibrated
from chatfleet.twin.sweep import TwinSweep

twin_app = typer.Typer(help="The engine twin: SGLang or vLLM on a given GPU, in virtual time.",
                       no_args_is_help=True)

ENGINE_MODEL_HELP = ("The engine model: sglang (v0.5, prefill first) or vllm (0.26 V1: token "
                     "budget, mixed batches, block prefix cache); docs/twin.md.")


def parse_arrival(text: str) -> float:
    """'poisson' -> burstiness 1; 'gamma:B' -> B."""
    if text == "poisson":
        return 1.0
    if text.startswith("gamma:"):
        try:
            b = float(text.split(":", 1)[1])
        except ValueError:
            fail(f"bad arrival {text!r}: use poisson or gamma:B with B a number")
        if b <= 0:
            fail("gamma burstiness must be positive")
        return b
    fail(f"bad arrival {text!r}: use poisson or gamma:B")


def build_lengths(kind: str, input_len: int, output_len: int, range_ratio: float,
                  convention: str, length_file: Path | None) -> LengthSpec:
    if kind in ("fixed", "uniform"):
        return LengthSpec(kind, input_len, output_len, range_ratio,  # type: ignore[arg-type]
                          convention)  # type: ignore[arg-type]
    if kind == "sharegpt":
        from chatfleet.datasets import cached_sharegpt_length_pairs

        with console.status("loading ShareGPT length pairs (cached after the first run)"):
            pairs = cached_sharegpt_length_pairs()
        return LengthSpec("sharegpt", pairs=tuple(pairs))
    if kind == "file":
        if length_file is None:
            fail("--lengths file needs --length-file PATH")
        from chatfleet.datasets import load_length_file

        return LengthSpec("file", pairs=tuple(load_length_file(length_file)))
    fail(f"unknown --lengths {kind!r}: fixed, uniform, sharegpt or file")


GROUP_DRAW_HELP = ("How a session gets its prompt group: round-robin (over sessions, in "
                   "creation order), user (user u always in group u mod G) or request (each "
                   "session draws one of the G at random from its seeded generator, as "
                   "SGLang's generated-shared-prefix benchmark; one turn: each request).")


def parse_group_draw(text: str) -> GroupDraw:
    for draw in GROUP_DRAWS:
        if text == draw:
            return draw
    fail(f"unknown --group-draw {text!r}: {', '.join(GROUP_DRAWS)}")


def build_loads(concurrency: str | None, rate: str | None, arrival: str) -> list[Load]:
    """The load points of a sweep: closed-loop user counts, then open-loop rates."""
    loads: list[Load] = [ClosedLoad(c) for c in parse_list(concurrency, int, "--concurrency")
                         ] if concurrency else []
    if rate:
        b = parse_arrival(arrival)
        loads += [OpenLoad(r, arrival, b) for r in parse_list(rate, float, "--rate")]
    if not loads:
        fail("nothing to run: give --concurrency or --rate")
    return loads


def load_label(load: Load) -> str:
    """"16 users", "2.0 rps"."""
    if isinstance(load, ClosedLoad):
        return f"{load.concurrency} users"
    return f"{load.rate_rps} rps"


def point_row(p: SweepPoint) -> list[str]:
    label = load_label(p.load)
    thin = "*" if p.thin else ""
    if not p.valid:
        label += " (invalid)"
    e = p.engine
    return [
        label,
        f"{p.attainment:.3f}{thin}",
        fmt(p.goodput_rps, ".2f"),
        fmt(p.output_tok_s, ".0f"),
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
    t = Table(title=title,
              caption="times in ms; * thin: fewer than 200 requests behind the percentiles")
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


def engine_model_args(engine_model: str, max_num_batched_tokens: int | None,
                      long_prefill_token_threshold: int) -> dict[str, Any]:
    """The EngineSpec fields of --engine-model and its vLLM-only flags, checked."""
    from chatfleet.core.engine.build import ENGINE_MODELS

    if engine_model not in ENGINE_MODELS:
        fail(f"--engine-model {engine_model!r}: choose {' or '.join(ENGINE_MODELS)}")
    if engine_model != "vllm" and (max_num_batched_tokens is not None
                                   or long_prefill_token_threshold):
        fail("--max-num-batched-tokens and --long-prefill-token-threshold need "
             "--engine-model vllm")
    if max_num_batched_tokens is not None and max_num_batched_tokens < 1:
        fail("--max-num-batched-tokens must be at least 1")
    if long_prefill_token_threshold < 0:
        fail("--long-prefill-token-threshold must not be negative")
    return {"engine_model": engine_model, "max_num_batched_tokens": max_num_batched_tokens,
            "long_prefill_token_threshold": long_prefill_token_threshold}


def profile_calibration(profile: Path | None, gpu: str,
                        engine_model: str = "sglang") -> Calibration | None:
    if profile is None:
        return None
    from chatfleet.core.specs import get_gpu
    from chatfleet.twin.calibrate import load_profile

    cal, doc = load_profile(profile)
    if get_gpu(gpu).name != cal.gpu:
        console.print(f"[yellow]note:[/] profile {profile} was fitted on {cal.gpu}, used for "
                      f"{gpu}: the results are marked uncalibrated")
    fitted_for = doc.get("engine_model", "sglang")
    if fitted_for != engine_model:
        console.print(f"[yellow]note:[/] profile {profile} was fitted for the {fitted_for} "
                      f"engine model, used with the {engine_model} one")
    return cal


@twin_app.command("calibrate")
def calibrate_cmd(
    from_: Path = typer.Option(..., "--from", help="A live sweep: DIR or DIR/sweep.json."),
    out_path: Path = typer.Option(..., "--out", help="Where to write the profile (JSON)."),
    gpu: str | None = typer.Option(None, help="The card (default: the sweep's target.gpu)."),
    model: str | None = typer.Option(None, help="Model spec (default: qwen3-8b)."),
    weights: str | None = typer.Option(None, help="Default: the sweep's target.weights."),
    kv_cache: str | None = typer.Option(None, "--kv-cache", help="Default: target.kv_cache."),
    gemm_eff: float = typer.Option(0.5, help="Assumed GEMM efficiency of its prefill."),
    as_json: bool = typer.Option(False, "--json", help="Print the profile as JSON."),
    engine_model: str | None = typer.Option(
        None, help="sglang or vllm (default: the sweep's target.engine: vllm for a vLLM "
        "sweep, sglang otherwise)."),
    fit_points: str | None = typer.Option(
        None, help="Closed-loop user counts to fit, concurrency 1 first (sglang: 1; vllm: 1 "
        "and one more, default the largest tested <= 16)."),
    bandwidth_eff: float | None = typer.Option(
        None, help="Hold the bandwidth efficiency here and fit the decode fixed cost instead "
        "(the vLLM model's default holds the L4 fit's)."),
    frontend_ms: str = typer.Option(
        "0", help="vLLM model: the API server's time per request before the engine sees it, "
        "taken from the concurrency-1 TTFT (ms), or auto: searched on the second point's "
        "TTFT (fragile with fixed lengths, docs/twin.md)."),
) -> None:
    """Fit the twin's step-time constants to a live sweep (its concurrency-1 point; the vLLM
    model a second point too) and report the fit's error on the sweep's other points."""
    from chatfleet.twin.calibrate import calibrate

    with clean_errors():
        points = parse_list(fit_points, int, "--fit-points") if fit_points else None
        frontend: float | str = "auto"
        if frontend_ms != "auto":
            try:
                frontend = float(frontend_ms) / 1000
            except ValueError:
                fail(f"--frontend-ms {frontend_ms!r}: a number of milliseconds or auto")
        prof = calibrate(from_, gpu=gpu, model=model, weights=weights, kv_cache=kv_cache,
                         gemm_eff=gemm_eff, engine_model=engine_model, fit_points=points,
                         bandwidth_eff=bandwidth_eff, frontend_s=frontend)
        write_json_atomic(out_path, prof)
    if as_json:
        print_json(prof)
        return
    cal = prof["calibration"]
    out.print(f"profile for {prof['gpu']} {prof['weights']}/{prof['kv_cache']} "
              f"({prof['engine_model']} model, fitted on "
              f"{', '.join(map(str, prof['fit_points']))} users): bandwidth "
              f"efficiency {cal['bandwidth_eff']:.3f}, prefill fixed "
              f"{cal['prefill_fixed_s'] * 1000:.1f} ms, decode fixed "
              f"{cal['decode_fixed_s'] * 1000:.1f} ms"
              + (f", per sequence {cal['per_seq_s'] * 1e6:.0f} us, front end "
                 f"{cal['frontend_s'] * 1000:.1f} ms per request"
                 if prof["engine_model"] == "vllm" else ""))
    for note in prof.get("fit_notes") or ():
        out.print(f"note: {note}")
    t = Table(title="fit error on the sweep's points (twin against live, medians)")
    for col in ("load", "fitted on", "TTFT live", "TTFT twin", "TPOT live", "TPOT twin",
                "tok/s live", "tok/s twin"):
        t.add_column(col, justify="right")
    for row in prof["fit_error"]:
        label = load_label(load_from_json(row["load"]))
        t.add_row(label, "yes" if row["fitted_on"] else "",
                  f"{row['ttft_p50']['live']:.0f}", f"{row['ttft_p50']['twin']:.0f}",
                  f"{row['tpot_p50']['live']:.1f}", f"{row['tpot_p50']['twin']:.1f}",
                  f"{row['output_tok_s']['live']:.0f}", f"{row['output_tok_s']['twin']:.0f}")
    out.print(t)
    out.print(f"wrote {out_path}")


@twin_app.command("sweep")
def sweep(
    gpu: str = typer.Option("l4", help="GPU name."),
    model: str = typer.Option("qwen3-8b", help="Built-in model name or path to a config.json."),
    weights: str = typer.Option("bf16", help="bf16 or fp8."),
    kv_cache: str = typer.Option("bf16", "--kv-cache", help="bf16 or fp8."),
    concurrency: str = typer.Option("1,4,8,16,32,64", help="Closed-loop user counts."),
    rate: str | None = typer.Option(
        None, help="Open-loop arrival rates (sessions/s), e.g. 0.5,1,2"),
    arrival: str = typer.Option("poisson", help="poisson or gamma:B (B<1 burstier)."),
    input_len: int = typer.Option(512, help="User message tokens (fixed/uniform)."),
    output_len: int = typer.Option(128, help="Answer tokens (fixed/uniform)."),
    lengths: str = typer.Option("fixed", help="fixed, uniform, sharegpt or file."),
    range_ratio: float = typer.Option(0.0, help="uniform: --random-range-ratio."),
    range_convention: str = typer.Option("sglang", help="uniform: sglang ([r*len, len]) or "
                                         "vllm ([len*(1-r), len*(1+r)])."),
    length_file: Path | None = typer.Option(
        None, help="lengths=file: JSONL of input_len/output_len."),
    system_prompt_tokens: int = typer.Option(2048, help="Shared system prompt tokens."),
    prompt_groups: int = typer.Option(1, help="Distinct shared system prompts."),
    group_draw: str = typer.Option("round-robin", help=GROUP_DRAW_HELP),
    turns: int = typer.Option(1, help="Turns per session."),
    think_time: float = typer.Option(0.0, help="Mean think time between turns, seconds."),
    reasoning_share: float = typer.Option(0.0, help="Share of each answer that is reasoning "
                                          "(0: thinking off)."),
    ramp_up: float = typer.Option(0.0, help="Closed loop: spread user starts over S seconds."),
    max_running_requests: int | None = typer.Option(
        None, help="Engine cap (SGLang's flag; the vLLM model's --max-num-seqs)."),
    schedule_policy: str = typer.Option("fcfs", help="fcfs or lpm."),
    eviction: str = typer.Option("lru", help=f"Radix eviction: {', '.join(EVICTION_POLICIES)}."),
    host_pool_tokens: int = typer.Option(0, help="HiCache host tier size in tokens (0: off)."),
    pool_tokens: int | None = typer.Option(None, help="Override the planned KV pool (what-if)."),
    mem_fraction: float | None = typer.Option(
        None, help="SGLang's --mem-fraction-static (the vLLM model's "
        "--gpu-memory-utilization)."),
    duration: float = typer.Option(300.0, help="Measurement window, virtual seconds."),
    warmup: float = typer.Option(30.0, help="Warm-up before the window, virtual seconds."),
    seed: int = typer.Option(1, help="Base seed; point i uses seed + i."),
    thermal: bool = typer.Option(False, "--thermal", help="Switch the thermal model on."),
    slo_ttft_ms: float = typer.Option(1000.0, help="TTFT target."),
    slo_tpot_ms: float = typer.Option(100.0, help="Per-token target."),
    itl_stat: str = typer.Option("mean", help="Per-request statistic: mean (TPOT), p99, max."),
    attainment: float = typer.Option(0.99, help="Share of requests that must meet the target."),
    cap_margin: int = typer.Option(0, help="Lower the recommended cap by this many grid steps."),
    refine: bool = typer.Option(False, "--refine", help="Bisect each knee bracket with more "
                                "points (closed loop to one user, open loop to 10%% of the "
                                "rate)."),
    profile: Path | None = typer.Option(None, help="A calibration profile from `chatfleet "
                                        "twin calibrate` (replaces the built-in constants)."),
    engine_model: str = typer.Option("sglang", help=ENGINE_MODEL_HELP),
    max_num_batched_tokens: int | None = typer.Option(
        None, help="vLLM model: the token budget per step (default: vLLM's for the card)."),
    long_prefill_token_threshold: int = typer.Option(
        0, help="vLLM model: cap on one request's prefill chunk (0: off)."),
    replicas: int = typer.Option(1, help="Replicas behind the gateway's admission and routing "
                                 "(with --cap): the load is the whole fleet's."),
    cap: int | None = typer.Option(None, help="Gateway cap on requests in flight per replica: "
                                   "runs the fleet (admission, queue, sheds, routing)."),
    queue_depth: int = typer.Option(64, help="Gateway queue depth (with --cap)."),
    affinity: bool = typer.Option(True, "--affinity/--no-affinity", help="Sessions to their "
                                  "replica (rendezvous + spill rule), or least-loaded."),
    prefill_reserve_ms: float = typer.Option(
        0.0, help="Gateway: part of the TTFT budget kept for the prefill (a queued request is "
        "shed at arrival + budget - this)."),
    hop_ms: float = typer.Option(
        MEASURED_HOP_S * 1000, help="Gateway <-> engine delay, one way (a request admitted "
        "from the queue misses the step already started; 2 ms matched the live gateway, "
        "docs/gateway.md)."),
    json_out: Path | None = typer.Option(None, "--json", help="Write the chatfleet.sweep/1 "
                                         "document here (rewritten after every point)."),
    print_doc: bool = typer.Option(False, "--print-json", help="Print the document on stdout."),
) -> None:
    """Sweep load points through the twin and find the knee."""
    with clean_errors():
        spec = EngineSpec(
            gpu=load_gpu(gpu), model=load_model(model), precision=precision(weights, kv_cache),
            mem_fraction=mem_fraction, pool_tokens=pool_tokens,
            max_running_requests=max_running_requests, schedule_policy=schedule_policy,
            eviction_policy=eviction, host_pool_tokens=host_pool_tokens, thermal=thermal,
            calibration=profile_calibration(profile, gpu, engine_model),
            **engine_model_args(engine_model, max_num_batched_tokens,
                                long_prefill_token_threshold),
        )
        spec.kv_pool_tokens()  # a card the model leaves no pool on fails here, in one line
        wcfg = WorkloadConfig(
            system_prompt_tokens=system_prompt_tokens, prompt_groups=prompt_groups,
            group_draw=parse_group_draw(group_draw),
            lengths=build_lengths(lengths, input_len, output_len, range_ratio,
                                  range_convention, length_file),
            turns=turns, think_time_s=think_time, reasoning_share=reasoning_share,
            ramp_up_s=ramp_up,
        )
        slo = SLO(slo_ttft_ms, slo_tpot_ms, itl_stat, attainment)  # type: ignore[arg-type]
        loads = build_loads(concurrency, rate, arrival)
        fleet = None
        if cap is not None or replicas > 1:
            from chatfleet.twin.fleet import FleetConfig

            fleet = FleetConfig(replicas=replicas, cap=cap or spec.kv_pool_tokens(),
                                queue_depth=queue_depth, ttft_budget_s=slo.ttft_ms / 1000,
                                prefill_reserve_s=prefill_reserve_ms / 1000,
                                affinity=affinity, hop_s=hop_ms / 1000)
        sweeper = TwinSweep(spec, wcfg, slo, duration_s=duration, warmup_s=warmup, seed=seed,
                            fleet=fleet, cap_margin=cap_margin)
        title = (f"twin: {spec.model.name} on {spec.gpu.name}, {spec.precision.label}"
                 + (f", {engine_model} model" if engine_model != "sglang" else "")
                 + ("" if is_calibrated(spec) else " (uncalibrated)"))
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=console, transient=True) as bar:
            task = bar.add_task(title, total=len(loads))

            def on_point(partial: SweepDoc) -> None:
                if json_out is not None:
                    write_json_atomic(json_out, partial.to_json())
                if len(partial.points) > len(loads):  # a refinement point
                    bar.update(task, total=len(partial.points))
                bar.advance(task)

            doc = sweeper.run(loads, refine=refine, on_point=on_point)
    if print_doc:
        print_json(doc.to_json())
        return
    out.print(sweep_table(doc, title))
    if not is_calibrated(spec):
        out.print(f"[yellow]{uncalibrated_note(spec.gpu.name)}[/]", highlight=False)
    for line in knee_lines(doc):
        out.print(line)
    if json_out is not None:
        out.print(f"wrote {json_out}")
