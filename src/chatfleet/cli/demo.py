"""`chatfleet demo`: the README's main job. Answers how many users fit on an L4 with Qwen3-8B,
which precision, which caps and how to launch, through the twin; then proves the serving path
live (simserver replicas behind the gateway, past the knee) and writes the HTML report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from chatfleet.cli.common import (
    check_output_dir,
    clean_errors,
    console,
    fail,
    out,
    print_json,
    progress_bars,
)
from chatfleet.cli.options import MAX_PLAN_USERS
from chatfleet.cli.render import fmt, pool_table, print_answer
from chatfleet.core.defaults import SEED
from chatfleet.core.memory import plan_pool
from chatfleet.core.specs import builtin_model, get_gpu
from chatfleet.jobs.demo import DemoConfig, run_demo
from chatfleet.jobs.workers import WorkerError


def demo(
    out_dir: Path = typer.Option(Path("out/demo"), "--out", help="Where the plan, the sweeps, "
                                 "the live run and the report go."),
    users: int = typer.Option(200, help="Concurrent users to plan for."),
    live_seconds: float = typer.Option(60.0, help="Measurement window of the live run."),
    overload: float = typer.Option(2.0, help="Live load in multiples of the fleet's cap."),
    cap_margin: int = typer.Option(0, help="Gateway cap this many grid steps below the knee."),
    live: bool = typer.Option(True, "--live/--no-live", help="Run the live part."),
    seed: int = typer.Option(SEED, help="Base seed."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Answer the question for Qwen3-8B on L4 with the twin (no GPU needed), prove it live on
    simserver replicas behind the gateway, and write the HTML report."""
    with clean_errors():
        if users < 1 or live_seconds <= 0 or overload <= 0 or cap_margin < 0:
            fail("--users, --live-seconds and --overload must be positive, --cap-margin >= 0")
        check_output_dir(out_dir, "--out")
        if users > MAX_PLAN_USERS:
            fail(f"--users {users}: at most {MAX_PLAN_USERS:,} (the plan lists every replica)")
        cfg = DemoConfig(out=out_dir, users=users, live_s=live_seconds, overload=overload,
                         cap_margin=cap_margin, seed=seed, live=live)
        if not as_json:
            for w in ("bf16", "fp8"):
                out.print(pool_table(plan_pool(get_gpu("l4"), builtin_model("qwen3-8b"), w, w)))
        with progress_bars() as progress:
            def stage(text: str) -> None:
                console.print(f"[bold]demo:[/] {text}")

            try:
                result = run_demo(cfg, progress, stage)
            except WorkerError as exc:  # the plan's worker died: one line, as `plan` says it
                fail(str(exc), code=1)
    if as_json:
        print_json({k: v for k, v in result.items() if k != "plan_doc"})
        return
    print_answer(result["plan_doc"])
    if "live" in result:
        print_live(result["live"])
    out.print(f"\nreport: {result['report']}\nplan: {result['plan']}", highlight=False)


def print_live(live: dict[str, Any]) -> None:
    t = Table(title=f"live: {live['users']} users on {live['replicas']} simserver replicas "
              f"behind the gateway, cap {live['cap']} each (twin: the same run predicted)")
    for col in ("", "attempts", "completed", "shed (429)", "failed", "admitted attain",
                "attainment", "TTFT p99 ms", "TPOT p99 ms"):
        t.add_column(col, justify="right")
    for side in ("live", "twin"):
        s = live[side]
        t.add_row(side, str(s["attempts"]), str(s["completed"]), str(s["shed"]), str(s["failed"]),
                  fmt(s["admitted_attainment"], ".3f"), fmt(s["attainment"], ".3f"),
                  fmt(s["ttft_p99_ms"], ".0f"), fmt(s["tpot_p99_ms"], ".0f"))
    out.print(t)
    seen = ", ".join(f"{k}: {v}" for k, v in sorted(live["max_in_flight_seen_by_replicas"].items()))
    out.print(f"most requests in each engine at once (its own trace): {seen} (cap {live['cap']})")
