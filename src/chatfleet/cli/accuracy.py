"""`chatfleet accuracy`: the same questions to every target, intervals and a paired test."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from chatfleet.check.accuracy import (
    AccuracyInputError,
    AnswerLog,
    AnswerRow,
    AskConfig,
    answers_path,
    ask_all,
    build_result,
    load_dataset,
    parse_named_paths,
    parse_targets,
    resolve_dataset,
    sample,
)
from chatfleet.cli.common import (
    check_output_file,
    clean_errors,
    console,
    fail,
    out,
    print_json,
)
from chatfleet.engines import get_adapter
from chatfleet.io import write_json

THINKING_CHOICES = ("off", "on", "server")


def accuracy(
    target: list[str] = typer.Option(
        [], "--target", help="NAME=URL of an OpenAI-compatible server; repeat it. The first is "
        "the reference. Name targets after their precision (bf16, fp8, or W/KV such as "
        "fp8/bf16): `chatfleet plan --accuracy FILE` matches names to precisions."),
    dataset: str = typer.Option(
        "gsm8k", help="gsm8k (the test split shipped with chatfleet; $CHATFLEET_GSM8K names "
        "another copy), or the path of a GSM8K or prompts JSON Lines file "
        "({\"prompt\": ..., \"answer\": ...} per line)."),
    n: int | None = typer.Option(None, "--n", help="Ask a sample of n questions (drawn with "
                                 "--seed); default: all of them."),
    seed: int = typer.Option(0, help="Seed of the question sample."),
    margin: float = typer.Option(0.02, help="Non-inferiority margin, absolute accuracy "
                                 "(0.02 = 2 points): within_margin when the lower end of the "
                                 "difference's interval is >= -margin."),
    concurrency: int = typer.Option(16, help="Requests in flight per target."),
    timeout: float = typer.Option(600.0, help="Per-request timeout in seconds."),
    max_tokens: int = typer.Option(1024, help="max_tokens of every request."),
    thinking: str = typer.Option("off", help="Qwen3 thinking: off or on (sent as "
                                 "chat_template_kwargs.enable_thinking), or server (send "
                                 "nothing: the server's default)."),
    model: str | None = typer.Option(None, help="Model name to send; default: the first id "
                                     "each target's /v1/models lists."),
    engine_log: list[str] = typer.Option(
        [], "--engine-log", help="NAME=PATH of a target's server log, read for the FP8 KV "
        "cache's scale-1.0 fallback warning; repeat it."),
    engine: str = typer.Option("sglang", help="Engine that wrote the --engine-log files: "
                               "sglang or vllm."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    out_file: Path | None = typer.Option(
        None, "--out", help="Write the result JSON here; every answer is appended to "
        "FILE.answers.jsonl beside it as it comes."),
    resume: bool = typer.Option(False, "--resume", help="With --out: reuse the answers "
                                "already in FILE.answers.jsonl (failed ones are asked again)."),
) -> None:
    """Accuracy of each target on GSM8K or your prompts, with intervals and a paired test.

    Wilson 95% intervals per target; against the first target, an exact McNemar test and
    Newcombe's interval on the paired difference, judged against --margin (docs/accuracy.md).
    """
    with clean_errors():
        targets = parse_targets(target)
        if n is not None and n < 1:
            fail("--n must be at least 1")
        if not (math.isfinite(margin) and 0 <= margin < 1):
            fail("--margin must lie in [0, 1)")
        if concurrency < 1:
            fail("--concurrency must be at least 1")
        if not (math.isfinite(timeout) and timeout > 0):
            fail("--timeout must be a positive number of seconds")
        if max_tokens < 1:
            fail("--max-tokens must be at least 1")
        if thinking not in THINKING_CHOICES:
            fail(f"--thinking must be one of {', '.join(THINKING_CHOICES)}")
        if resume and out_file is None:
            fail("--resume needs --out FILE")
        check_output_file(out_file, "--out")
        if engine.strip().lower() not in ("sglang", "vllm"):
            fail("--engine must be sglang or vllm")
        adapter = get_adapter(engine)
        logs = parse_named_paths(engine_log, [t.name for t in targets], "--engine-log")
        engine_logs: dict[str, dict[str, Any] | None] = {}
        for name, path in logs.items():
            if not path.is_file():
                fail(f"--engine-log {name}={path}: no such file")
            engine_logs[name] = adapter.parse_log(path)
        dataset_name, path = resolve_dataset(dataset)
        ds = load_dataset(path)
        items = sample(ds, n, seed)
        cfg = AskConfig(concurrency=concurrency, timeout_s=timeout, max_tokens=max_tokens,
                        thinking=thinking,  # type: ignore[arg-type]
                        model=model)

        log = AnswerLog(answers_path(out_file), resume) if out_file is not None else None
        progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), console=console, transient=True,
                            disable=not console.is_terminal)
        tasks: dict[str, Any] = {}
        reused = log.previous if log is not None else {}

        def started() -> None:
            progress.start()
            for t in targets:
                tasks[t.name] = progress.add_task(t.name, total=len(items))

        def on_row(row: AnswerRow) -> None:
            if log is not None:
                log.write(row)
            progress.advance(tasks[row.target])

        try:
            result = asyncio.run(ask_all(targets, items, cfg, done=reused, on_start=started,
                                         on_row=on_row))
        except AccuracyInputError as exc:
            fail(str(exc))
        finally:
            progress.stop()
            if log is not None:
                log.close()

        doc = build_result(dataset_name=dataset_name, dataset=ds,
                           indices=[it.index for it in items], seed=seed, margin=margin,
                           targets=targets, rows=result.rows, cfg=cfg, engine_logs=engine_logs,
                           models=result.models)
        if out_file is not None:
            write_json(out_file, doc)
    if as_json:
        print_json(doc)
    else:
        show(doc)
    for name, facts in engine_logs.items():
        if facts and facts.get("kv_scale_fallback"):
            console.print(f"[yellow]warning:[/] {name}: the engine log says the FP8 KV cache has "
                          "no scales and falls back to 1.0 (see its engine_log.kv_scale_lines)")
    failed = {name: t["failed"] for name, t in doc["targets"].items() if t["failed"]}
    if failed:
        detail = ", ".join(f"{k} {v}" for k, v in failed.items())
        console.print(f"[bold red]error:[/] failed requests (counted as wrong): {detail}"
                      + (f"; see {answers_path(out_file)}" if out_file is not None else ""))
        raise typer.Exit(1)


def _pct(x: float) -> str:
    return f"{100 * x:.2f}%"


def show(doc: dict[str, Any]) -> None:
    ds = doc["dataset"]
    t = Table(title=f"Accuracy on {ds['name']} ({ds['n']} of {ds['total']} questions"
                    f"{', seed ' + str(ds['seed']) if ds['sampled'] else ''})")
    for col in ("target", "url", "correct", "failed", "accuracy", "95% CI (Wilson)"):
        t.add_column(col, justify="left" if col in ("target", "url") else "right")
    for name, tg in doc["targets"].items():
        lo, hi = tg["ci95"]
        t.add_row(name, tg["url"], f"{tg['correct']}/{tg['n']}", str(tg["failed"]),
                  _pct(tg["accuracy"]), f"{_pct(lo)} to {_pct(hi)}")
    out.print(t)
    if not doc["comparisons"]:
        return
    c = Table(title=f"Paired against {doc['reference']} (McNemar exact; difference "
                    f"interval: Newcombe; margin {100 * doc['margin']:g} points)")
    for col in ("b - a", "both", "a only", "b only", "neither", "McNemar p", "difference",
                "95% CI", "within margin"):
        c.add_column(col, justify="left" if col == "b - a" else "right")
    for p in doc["comparisons"]:
        lo, hi = p["diff_ci95"]
        c.add_row(f"{p['b']} - {p['a']}", str(p["both"]), str(p["a_only"]), str(p["b_only"]),
                  str(p["neither"]), f"{p['mcnemar_p']:.4g}", f"{100 * p['diff']:+.2f} pts",
                  f"{100 * lo:+.2f} to {100 * hi:+.2f}", "yes" if p["within_margin"] else "no")
    out.print(c)
