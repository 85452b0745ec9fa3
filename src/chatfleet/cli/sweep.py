"""`chatfleet sweep`: the pre-launch measurement against real engines (or the simserver)."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from chatfleet.bench.sweep import LiveSweep, request_stop
from chatfleet.bench.sweep_config import LiveSweepConfig
from chatfleet.bench.telemetry import parse_telemetry_spec
from chatfleet.cli.common import check_output_dir, clean_errors, console, fail, out
from chatfleet.cli.options import GROUP_DRAW_HELP, build_lengths, build_loads, parse_group_draw
from chatfleet.cli.render import knee_lines, load_label, sweep_table
from chatfleet.core.defaults import (
    COOLDOWN_MAX_S,
    DRAIN_S,
    DURATION_S,
    SEED,
    SYSTEM_PROMPT_TOKENS,
    WARMUP_S,
)
from chatfleet.core.documents.sweep import SweepDoc, SweepPoint
from chatfleet.core.slo import SLO
from chatfleet.core.workload import LengthSpec, WorkloadConfig
from chatfleet.engines import get_adapter

ENGINES = ("sglang", "vllm", "simserver", "openai")


def sweep(
    target: list[str] = typer.Option(..., "--target", help="Engine base URL (repeat for "
                                     "several replicas; users are spread over them)."),
    engine: str = typer.Option(..., help="sglang, vllm, simserver or openai."),
    model: str = typer.Option(..., help="Model name the engine serves."),
    concurrency: str = typer.Option("1,2,4,8,16,32", help="Closed-loop user counts."),
    rate: str | None = typer.Option(None, help="Open-loop session rates per second."),
    arrival: str = typer.Option("poisson", help="poisson or gamma:B."),
    input_len: int = typer.Option(
        LengthSpec().input_len, help="User message tokens (fixed/uniform)."),
    output_len: int = typer.Option(LengthSpec().output_len, help="Answer tokens (fixed/uniform)."),
    lengths: str = typer.Option("sharegpt", help="fixed, uniform, sharegpt or file (the real "
                                "length mix is the default)."),
    range_ratio: float = typer.Option(0.0, help="uniform: range ratio."),
    range_convention: str = typer.Option("sglang", help="uniform: sglang or vllm."),
    length_file: Path | None = typer.Option(None, help="lengths=file: JSONL of lengths."),
    system_prompt_tokens: int = typer.Option(
        SYSTEM_PROMPT_TOKENS, help="Shared system prompt tokens."),
    prompt_groups: int = typer.Option(1, help="Distinct shared system prompts."),
    group_draw: str = typer.Option("round-robin", help=GROUP_DRAW_HELP),
    turns: int = typer.Option(1, help="Turns per session."),
    think_time: float = typer.Option(0.0, help="Mean think time between turns, seconds."),
    ramp_up: float = typer.Option(0.0, help="Closed loop: spread user starts over S s."),
    duration: float = typer.Option(DURATION_S, help="Measurement window per run, seconds."),
    warmup: float = typer.Option(WARMUP_S, help="Warm-up before the window, seconds."),
    drain: float = typer.Option(DRAIN_S, help="Longest wait for the window's requests after it."),
    flush: bool = typer.Option(True, "--flush/--no-flush", help="Flush the prefix cache "
                               "before every run (and check that it took)."),
    seed: int = typer.Option(SEED, help="Base seed; run i uses seed + i."),
    telemetry: str = typer.Option("none", help="nvml[:INDEX], dcgm:URL, simserver, agent:URL "
                                  "or none."),
    cooldown_temp: float | None = typer.Option(None, help="Before each run, wait until the "
                                               "GPU is under this temperature (C)."),
    cooldown_max: float = typer.Option(COOLDOWN_MAX_S, help="Longest cool-down wait, seconds."),
    clock_floor: float | None = typer.Option(None, help="Runs whose median SM clock is under "
                                             "this (MHz) are invalid."),
    slo_ttft_ms: float = typer.Option(SLO().ttft_ms, help="TTFT target."),
    slo_tpot_ms: float = typer.Option(SLO().tpot_ms, help="Per-token target."),
    itl_stat: str = typer.Option(SLO().itl_stat, help="Per-request statistic: mean, p99 or max."),
    attainment: float = typer.Option(SLO().attainment, help="Share of requests that must meet it."),
    cap_margin: int = typer.Option(0, help="Lower the recommended cap by N grid steps."),
    refine: bool = typer.Option(False, "--refine", help="Close an open knee bracket (double "
                                "the top while it meets, halve the lowest rate while it "
                                "fails), then bisect it until it is one user (or 10% of the "
                                "rate) wide: the twin's policy."),
    refine_max_users: int = typer.Option(1024, help="--refine never doubles the closed loop "
                                         "beyond this many users."),
    refine_budget: float | None = typer.Option(None, help="--refine starts no run after this "
                                               "many seconds of refinement."),
    api: str = typer.Option("chat", help="chat (text, the product's path) or completions-ids "
                            "(the twin's exact token ids)."),
    thinking: bool = typer.Option(False, "--thinking", help="Qwen3 thinking on (off by "
                                  "default, stated in the results)."),
    api_key: str | None = typer.Option(None, envvar="CHATFLEET_API_KEY", help="Bearer key."),
    gpu: str | None = typer.Option(None, help="Label: the GPU the engine runs on."),
    weights: str | None = typer.Option(None, help="Label: weight precision."),
    kv_cache: str | None = typer.Option(None, "--kv-cache", help="Label: KV precision."),
    engine_log: Path | None = typer.Option(None, help="The engine's startup log: pool size, "
                                           "mem fraction, KV-scale warnings go into target."),
    out_dir: Path = typer.Option(..., "--out", help="Results directory."),
    resume: bool = typer.Option(False, "--resume", help="Continue an interrupted sweep in "
                                "--out, skipping finished runs."),
    max_send_lag_ms: float = typer.Option(50.0, help="Client send-lag p99 bound (validity)."),
    max_loop_lag_ms: float = typer.Option(10.0, help="Client loop-lag p99 bound (validity)."),
) -> None:
    """Measure the knee against live engines, with the method automated."""
    with clean_errors():
        if engine not in ENGINES:
            fail(f"unknown --engine {engine!r}; choose one of {', '.join(ENGINES)}")
        if api not in ("chat", "completions-ids"):
            fail("--api must be chat or completions-ids")
        for url in target:
            if not url.startswith(("http://", "https://")):
                fail(f"--target {url!r} is not an http(s) URL")
        if duration <= 0 or warmup < 0 or drain < 0:
            fail("--duration must be positive, --warmup and --drain not negative")
        if refine_max_users < 1 or (refine_budget is not None and refine_budget <= 0):
            fail("--refine-max-users and --refine-budget must be positive")
        check_output_dir(out_dir, "--out")
        wcfg = WorkloadConfig(
            system_prompt_tokens=system_prompt_tokens, prompt_groups=prompt_groups,
            group_draw=parse_group_draw(group_draw),
            lengths=build_lengths(lengths, input_len, output_len, range_ratio,
                                  range_convention, length_file),
            turns=turns, think_time_s=think_time, ramp_up_s=ramp_up,
            reasoning_share=0.0,
        )
        slo = SLO(slo_ttft_ms, slo_tpot_ms, itl_stat, attainment)  # type: ignore[arg-type]
        loads = build_loads(concurrency, rate, arrival)
        parse_telemetry_spec(telemetry, target=target[0])  # before anything is sent
        labels: dict[str, Any] = {k: v for k, v in (("gpu", gpu), ("weights", weights),
                                                     ("kv_cache", kv_cache)) if v}
        if engine_log is not None:
            labels["engine_log"] = get_adapter(engine).parse_log(engine_log)
        cfg = LiveSweepConfig(
            targets=[t.rstrip("/") for t in target], engine=engine, model=model, loads=loads,
            wcfg=wcfg, out=out_dir, slo=slo, duration_s=duration, warmup_s=warmup,
            drain_s=drain, flush=flush, seed=seed, telemetry=telemetry,
            cooldown_temp_c=cooldown_temp, cooldown_max_s=cooldown_max,
            clock_floor_mhz=clock_floor, resume=resume, refine=refine, cap_margin=cap_margin,
            refine_max_users=refine_max_users, refine_budget_s=refine_budget,
            api=api, thinking=thinking, api_key=api_key, labels=labels,
            max_send_lag_ms=max_send_lag_ms, max_loop_lag_ms=max_loop_lag_ms,
        )
        progress = Progress(TextColumn("{task.description}"), BarColumn(),
                            MofNCompleteColumn(), TimeElapsedColumn(), console=console)
        task = progress.add_task(f"sweep {engine} ({len(loads)} runs)", total=len(loads))

        def on_event(kind: str, info: Mapping[str, Any]) -> None:
            if kind == "run":
                progress.update(task, description=f"run {info['index']}: "
                                f"{load_label(info['load'])}, seed {info['seed']}")
            elif kind in ("point", "skip"):
                progress.advance(task)
                point: SweepPoint | None = info.get("point")
                if point is not None and not point.valid:
                    console.print(f"[yellow]run {point.run_index} invalid:[/] "
                                  f"{point.invalid_reason}")
            elif kind == "refine":
                progress.update(task, total=(progress.tasks[0].total or 0) + 1)
            elif kind == "refine_budget":
                console.print(f"[yellow]refinement stopped:[/] its {info['budget_s']:g} s "
                              f"budget is spent (next would have been "
                              f"{load_label(info['load'])})")
            elif kind == "cooldown":
                progress.update(task, description=f"run {info['index']}: cooling down")
            elif kind == "texts":  # the run's prompt texts, built before its clock starts
                done, total = info["done"], info["total"]
                if done == total or done % max(1, total // 100) == 0:
                    progress.update(task, description=f"run {info['index']}: prompt texts "
                                    f"{done}/{total}")

        sweep_run = LiveSweep(cfg, on_event)

        async def main() -> SweepDoc:
            loop = asyncio.get_running_loop()
            loop.add_signal_handler(signal.SIGINT, request_stop, sweep_run)
            try:
                return await sweep_run.run()
            finally:
                loop.remove_signal_handler(signal.SIGINT)

        with progress:
            doc = asyncio.run(main())
    out.print(sweep_table(doc, f"sweep: {engine} {model} ({', '.join(cfg.targets)})"))
    for line in knee_lines(doc):
        out.print(line)
    if sweep_run.stop.is_set():
        console.print("stopped by Ctrl-C after recording the run in progress; "
                      "--resume continues")
    out.print(f"wrote {out_dir / 'sweep.json'} and {out_dir / 'runs.jsonl'}")
