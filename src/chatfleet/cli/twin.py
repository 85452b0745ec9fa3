"""`chatfleet twin ...`: the engine model in virtual time."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import typer
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from chatfleet.cli.common import (
    Command,
    check_output_file,
    clean_errors,
    console,
    fail,
    load_gpu,
    load_model,
    out,
    parse_list,
    print_json,
    uncalibrated_note,
)
from chatfleet.cli.options import (
    GROUP_DRAW_HELP,
    HOST_POOL_HELP,
    RATIO_HELP,
    SIZE_HELP,
    WRITE_POLICY_HELP,
    build_lengths,
    build_loads,
    engine_model_args,
    parse_group_draw,
    profile_calibration,
    read_sweep_file,
    with_host_tier,
)
from chatfleet.cli.render import band_lines, knee_lines, sweep_table
from chatfleet.cli.render_fit import print_judgement, print_profile
from chatfleet.core.defaults import DURATION_S, SEED, SYSTEM_PROMPT_TOKENS, WARMUP_S
from chatfleet.core.documents.sweep import SweepDoc
from chatfleet.core.engine.build import EngineSpec, provenance_of, scaled_spec
from chatfleet.core.engine.eviction import EVICTION_POLICIES
from chatfleet.core.engine.host_tier import DEFAULT_WRITE_POLICY
from chatfleet.core.fleet.fleet import FleetSettings
from chatfleet.core.fleet.routing import SPILL_RULES
from chatfleet.core.slo import SLO
from chatfleet.core.specs import precision
from chatfleet.core.workload import LengthSpec, WorkloadConfig
from chatfleet.io import write_json
from chatfleet.twin.calibrate import calibrate
from chatfleet.twin.calibrate_steps import choose_method, fit_profile
from chatfleet.twin.fleet import MEASURED_HOP_S, FleetConfig
from chatfleet.twin.judge import judge
from chatfleet.twin.run import is_calibrated
from chatfleet.twin.sweep import TwinSweep, with_band

twin_app = typer.Typer(help="The engine twin: SGLang or vLLM on a given GPU, in virtual time.",
                       no_args_is_help=True)

ENGINE_MODEL_HELP = ("The engine model: sglang (v0.5, prefill first) or vllm (0.26 V1: token "
                     "budget, mixed batches, block prefix cache); docs/twin.md.")


@twin_app.command("calibrate", cls=Command)
def calibrate_cmd(
    from_: list[Path] = typer.Option(..., "--from", help="A live sweep: DIR or DIR/sweep.json "
                                     "(repeat it to fit several sweeps of one engine)."),
    out_path: Path = typer.Option(..., "--out", help="Where to write the profile (JSON)."),
    gpu: str | None = typer.Option(None, help="The card (default: the sweep's target.gpu)."),
    model: str | None = typer.Option(None, help="Model spec (default: qwen3-8b)."),
    weights: str | None = typer.Option(None, help="Default: the sweep's target.weights."),
    kv_cache: str | None = typer.Option(None, "--kv-cache", help="Default: target.kv_cache."),
    method: str = typer.Option(
        "auto", help="steps: fit the vllm model to every step of every point (needs the "
        "sweep's records: a live sweep's DIR); points: the concurrency-1 point (and for vllm "
        "one more); auto: steps where it can (docs/twin.md#calibrating-the-vllm-model)."),
    hold: str | None = typer.Option(
        None, help="steps: constants held at their prior instead of fitted, comma-separated "
        "(default: bandwidth_eff,gemm_eff where the card's physics were measured; 'none' "
        "frees all)."),
    gemm_eff: float = typer.Option(0.5, help="points: assumed GEMM efficiency of its prefill."),
    as_json: bool = typer.Option(False, "--json", help="Print the profile as JSON."),
    engine_model: str | None = typer.Option(
        None, help="sglang or vllm (default: the sweep's target.engine: vllm for a vLLM "
        "sweep, sglang otherwise)."),
    fit_points: str | None = typer.Option(
        None, help="points: closed-loop user counts to fit, concurrency 1 first (sglang: 1; "
        "vllm: 1 and one more, default the largest tested <= 16)."),
    bandwidth_eff: float | None = typer.Option(
        None, help="points: hold the bandwidth efficiency here and fit the decode fixed cost "
        "instead (the vLLM model's default holds the L4 fit's)."),
    frontend_ms: str = typer.Option(
        "0", help="points, vllm: the API server's time per request before the engine sees "
        "it, taken from the concurrency-1 TTFT (ms), or auto: searched on the second point's "
        "TTFT (fragile with fixed lengths, docs/twin.md)."),
) -> None:
    """Fit the twin's step-time constants to a live sweep and report the fit's error on every
    point. The vLLM model is fitted to every step of every point (each request's token gaps,
    with the batch and prefills they carried); without the sweep's records, and for the SGLang
    model, to its concurrency-1 point (vLLM: and one more)."""
    with clean_errors():
        check_output_file(out_path, "--out")
        for path in from_:
            read_sweep_file(path, "--from")  # a wrong file is one line, before the fit reads it
        if not 0 < gemm_eff <= 1:
            fail(f"--gemm-eff {gemm_eff}: a share of the card's peak FLOPS, in (0, 1]")
        how = choose_method(from_, engine_model, method)
        if how == "steps":
            held = None if hold is None else [] if hold == "none" else [
                name.strip() for name in hold.split(",") if name.strip()]
            if held == [] and hold != "none":
                fail("--hold is empty: names of the constants to hold, or none")
            prof = fit_profile(from_, gpu=gpu, model=model, weights=weights,
                               kv_cache=kv_cache, hold=held)
        else:
            if len(from_) > 1:
                fail("--method points fits one sweep: give one --from")
            points = parse_list(fit_points, int, "--fit-points") if fit_points else None
            frontend: float | str = "auto"
            if frontend_ms != "auto":
                try:
                    frontend = float(frontend_ms) / 1000
                except ValueError:
                    fail(f"--frontend-ms {frontend_ms!r}: a number of milliseconds or auto")
            prof = calibrate(from_[0], gpu=gpu, model=model, weights=weights,
                             kv_cache=kv_cache, gemm_eff=gemm_eff, engine_model=engine_model,
                             fit_points=points, bandwidth_eff=bandwidth_eff,
                             frontend_s=frontend)
        write_json(out_path, prof)
    if as_json:
        print_json(prof)
        return
    print_profile(prof)
    out.print(f"wrote {out_path}")


@twin_app.command("judge", cls=Command)
def judge_cmd(
    profile: Path = typer.Option(..., "--profile", help="A profile `twin calibrate` wrote."),
    against: list[Path] = typer.Option(..., "--against", help="A live sweep (DIR or its "
                                       "sweep.json) to replay; repeat it for several."),
    json_out: Path | None = typer.Option(None, "--json", help="Write the judgement (JSON)."),
    print_doc: bool = typer.Option(False, "--print-json", help="Print it on stdout."),
) -> None:
    """Replay every point of live sweeps through the twin with a fitted profile: twin against
    live, point by point, with the targets a held-out point must meet and the knees."""
    with clean_errors():
        if json_out is not None:
            check_output_file(json_out, "--json")
        for path in against:
            read_sweep_file(path, "--against")
        doc = judge(profile, against)
        if json_out is not None:
            write_json(json_out, doc)
    if print_doc:
        print_json(doc)
        return
    print_judgement(doc)
    if json_out is not None:
        out.print(f"wrote {json_out}")


@twin_app.command("sweep", cls=Command)
def sweep(
    gpu: str = typer.Option("l4", help="GPU name."),
    model: str = typer.Option("qwen3-8b", help="Built-in model name or path to a config.json."),
    weights: str = typer.Option("bf16", help="bf16 or fp8."),
    kv_cache: str = typer.Option("bf16", "--kv-cache", help="bf16 or fp8."),
    concurrency: str = typer.Option("1,4,8,16,32,64", help="Closed-loop user counts."),
    rate: str | None = typer.Option(
        None, help="Open-loop arrival rates (sessions/s), e.g. 0.5,1,2"),
    arrival: str = typer.Option("poisson", help="poisson or gamma:B (B<1 burstier)."),
    input_len: int = typer.Option(
        LengthSpec().input_len, help="User message tokens (fixed/uniform)."),
    output_len: int = typer.Option(LengthSpec().output_len, help="Answer tokens (fixed/uniform)."),
    lengths: str = typer.Option("fixed", help="fixed, uniform, sharegpt or file."),
    range_ratio: float = typer.Option(0.0, help="uniform: --random-range-ratio."),
    range_convention: str = typer.Option("sglang", help="uniform: sglang ([r*len, len]) or "
                                         "vllm ([len*(1-r), len*(1+r)])."),
    length_file: Path | None = typer.Option(
        None, help="lengths=file: JSONL of input_len/output_len."),
    system_prompt_tokens: int = typer.Option(
        SYSTEM_PROMPT_TOKENS, help="Shared system prompt tokens."),
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
    host_pool_tokens: int = typer.Option(0, help=HOST_POOL_HELP),
    hicache_ratio: float | None = typer.Option(None, help=RATIO_HELP),
    hicache_size: float | None = typer.Option(None, help=SIZE_HELP),
    hicache_write_policy: str = typer.Option(DEFAULT_WRITE_POLICY, help=WRITE_POLICY_HELP),
    pool_tokens: int | None = typer.Option(None, help="Override the planned KV pool (what-if)."),
    mem_fraction: float | None = typer.Option(
        None, help="SGLang's --mem-fraction-static (the vLLM model's "
        "--gpu-memory-utilization)."),
    duration: float = typer.Option(DURATION_S, help="Measurement window, virtual seconds."),
    warmup: float = typer.Option(WARMUP_S, help="Warm-up before the window, virtual seconds."),
    seed: int = typer.Option(SEED, help="Base seed; point i uses seed + i."),
    thermal: bool = typer.Option(False, "--thermal", help="Switch the thermal model on."),
    slo_ttft_ms: float = typer.Option(SLO().ttft_ms, help="TTFT target."),
    slo_tpot_ms: float = typer.Option(SLO().tpot_ms, help="Per-token target."),
    itl_stat: str = typer.Option(
        SLO().itl_stat, help="Per-request statistic: mean (TPOT), p99, max."),
    attainment: float = typer.Option(
        SLO().attainment, help="Share of requests that must meet the target."),
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
    queue_depth: int = typer.Option(
        FleetSettings().queue_depth, help="Gateway queue depth (with --cap)."),
    affinity: bool = typer.Option(True, "--affinity/--no-affinity", help="Sessions to their "
                                  "replica (rendezvous + spill rule), or least-loaded."),
    prefill_reserve_ms: float = typer.Option(
        0.0, help="Gateway: part of the TTFT budget kept for the prefill (a queued request is "
        "shed at arrival + budget - reserve): the prior of the learned reserve, or with "
        "--fixed-reserve the reserve."),
    learn_reserve: bool = typer.Option(
        True, "--learn-reserve/--fixed-reserve", help="Gateway: learn each replica's reserve "
        "from admission -> first token (as the gateway does by default), or keep "
        "--prefill-reserve-ms."),
    spill: str = typer.Option("cost", help="Gateway: when a session leaves a hot home: cost "
                              "(waiting costs more than recomputing), full (whenever another "
                              "replica has room) or never (strict stickiness)."),
    hop_ms: float = typer.Option(
        MEASURED_HOP_S * 1000, help="Gateway <-> engine delay, one way (a request admitted "
        "from the queue misses the step already started; 2 ms matched the live gateway, "
        "docs/gateway.md)."),
    json_out: Path | None = typer.Option(None, "--json", help="Write the chatfleet.sweep/1 "
                                         "document here (rewritten after every point)."),
    print_doc: bool = typer.Option(False, "--print-json", help="Print the document on stdout."),
    band: bool = typer.Option(True, "--band/--no-band", help="Also sweep with every step "
                              "slower and faster by the calibration's error band, and give "
                              "the knees at both edges (knee_band in the document)."),
) -> None:
    """Sweep load points through the twin and find the knee, with its range under the
    calibration's error band."""
    with clean_errors():
        check_output_file(json_out, "--json")
        if replicas < 1 or (cap is not None and cap < 1):
            fail("--replicas and --cap must be at least 1 (leave --cap out for no gateway cap)")
        if spill not in SPILL_RULES:
            fail(f"--spill must be one of {', '.join(SPILL_RULES)}, not {spill!r}")
        spec = EngineSpec(
            gpu=load_gpu(gpu), model=load_model(model), precision=precision(weights, kv_cache),
            mem_fraction=mem_fraction, pool_tokens=pool_tokens,
            max_running_requests=max_running_requests, schedule_policy=schedule_policy,
            eviction_policy=eviction, thermal=thermal,
            calibration=profile_calibration(profile, gpu, engine_model),
            **engine_model_args(engine_model, max_num_batched_tokens,
                                long_prefill_token_threshold),
        )
        spec = with_host_tier(spec, host_pool_tokens, hicache_ratio, hicache_size,
                              hicache_write_policy)
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
            fleet = FleetConfig(replicas=replicas, cap=cap or spec.kv_pool_tokens(),
                                queue_depth=queue_depth, ttft_budget_s=slo.ttft_ms / 1000,
                                prefill_reserve_s=prefill_reserve_ms / 1000,
                                affinity=affinity, hop_s=hop_ms / 1000,
                                learn_reserve=learn_reserve,
                                spill=spill)
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
                    write_json(json_out, partial.to_json())
                if len(partial.points) > len(loads):  # a refinement point
                    bar.update(task, total=len(partial.points))
                bar.advance(task)

            doc = sweeper.run(loads, refine=refine, on_point=on_point)
            if band:
                prov = provenance_of(spec)
                edges = []
                for k in (1 + prov.band, 1 - prov.band):
                    edge = bar.add_task(f"the same, every step x{k:g}", total=len(loads))

                    def advance(_: SweepDoc, edge: TaskID = edge) -> None:
                        bar.advance(edge)

                    edges.append(replace(sweeper, spec=scaled_spec(spec, k)).run(
                        loads, refine=refine, on_point=advance))
                doc = with_band(doc, prov, edges[0], edges[1])
                if json_out is not None:
                    write_json(json_out, doc.to_json())
    if print_doc:
        print_json(doc.to_json())
        return
    out.print(sweep_table(doc, title))
    if not is_calibrated(spec) and not band:
        out.print(f"[yellow]{uncalibrated_note(spec.gpu.name)}[/]", highlight=False)
    for line in knee_lines(doc):
        out.print(line)
    for line in band_lines(doc):
        out.print(f"[yellow]{line}[/]", highlight=False)
    if json_out is not None:
        out.print(f"wrote {json_out}")
