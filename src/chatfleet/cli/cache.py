"""`chatfleet cache`: working-set analysis of the prefix cache on multi-turn traces."""

from __future__ import annotations

import math
import random
from array import array
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from chatfleet.cli.common import (
    check_output_file,
    clean_errors,
    console,
    fail,
    load_gpu,
    load_model,
    out,
    print_json,
    uncalibrated_note,
)
from chatfleet.core.cache.multiturn import MultiturnConfig, multiturn_trace
from chatfleet.core.cache.recommend import cache_document, summarize
from chatfleet.core.cache.replay import CacheConfig, unbounded_pool
from chatfleet.core.cache.trace import (
    UNIQUE_ID_BASE,
    SyntheticConfig,
    Turn,
    answer_ids,
    check_trace,
    count_prompt_ids,
    sort_trace,
    synthetic_trace,
)
from chatfleet.core.documents.cache import CacheDoc, CacheResult
from chatfleet.core.engine.build import EngineSpec, step_time_model
from chatfleet.core.engine.eviction import EVICTION_POLICIES
from chatfleet.core.engine.host_tier import DEFAULT_WRITE_POLICY, WRITE_POLICIES
from chatfleet.core.memory import hicache_host_tokens
from chatfleet.core.specs import precision
from chatfleet.data.traffic import read_trace
from chatfleet.io import write_json
from chatfleet.twin.cache_replay import replay


def parse_sizes(text: str, what: str, allow_zero: bool = False) -> list[int]:
    """Comma-separated token counts: positive (or >= 0 with allow_zero), no duplicates."""
    values: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            v = int(part.replace("_", ""))
        except ValueError:
            fail(f"{what} must be a comma-separated list of whole token counts, not {text!r}")
        if v < 0 or (v == 0 and not allow_zero):
            fail(f"every {what} must be {'>= 0' if allow_zero else 'positive'}, got {v}")
        if v not in values:
            values.append(v)
    if not values:
        fail(f"{what} is empty")
    return values


def parse_policies(text: str) -> list[str]:
    names = [p.strip().lower() for p in text.split(",") if p.strip()]
    if not names:
        fail("--policy is empty")
    for p in names:
        if p not in EVICTION_POLICIES:
            fail(f"unknown eviction policy {p!r}: one of {', '.join(EVICTION_POLICIES)}")
    return list(dict.fromkeys(names))


# --------------------------------------------------------------------------------------------
# Trace files
# --------------------------------------------------------------------------------------------


def load_trace_file(path: Path, shared_prefix_tokens: int, default_answer_tokens: int,
                    context_tokens: int | None = None) -> list[Turn]:
    """The traffic trace format (core/traffic/trace.py, docs/traffic.md), read by
    chatfleet.data.traffic: session, turn, time (s), prompt_tokens (ids, or a count) or text,
    optional output_tokens. See docs/cache.md for how counts become token ids. A count above
    `context_tokens` (the model's context) is refused: no engine serves it, and its ids would
    have to be made. A client's retry of a turn (`attempt` > 0) is the same turn: the cache
    sees each turn once."""
    trace = read_trace(path, context_tokens, keep_ids=True)
    assert trace.ids is not None
    by_session: dict[int, list[tuple[int, float, Any, int]]] = {}
    for i in range(trace.num_lines):
        if trace.attempt[i]:
            continue
        prompt = trace.ids[i] if trace.ids[i] is not None else int(trace.prompt[i])
        by_session.setdefault(int(trace.session[i]), []).append(
            (int(trace.rank[i]), float(trace.time[i]) + trace.origin, prompt,
             int(trace.output[i])))
    counter = [UNIQUE_ID_BASE]
    turns: list[Turn] = []
    for si, (index, rs) in enumerate(by_session.items()):
        rs.sort(key=lambda r: r[0])
        prompts = [p if isinstance(p, array) else count_prompt_ids(si, p, shared_prefix_tokens)
                   for _, _, p, _ in rs]
        for k, (_, t, _, o) in enumerate(rs):
            nxt = prompts[k + 1] if k + 1 < len(prompts) else None
            output = answer_ids(prompts[k], o or default_answer_tokens, nxt, counter)
            turns.append(Turn(trace.sessions[index], k + 1, t, prompts[k], output))
    check_trace(turns)
    return sort_trace(turns)


# --------------------------------------------------------------------------------------------
# The command
# --------------------------------------------------------------------------------------------


def _by_turn(values: Sequence[float]) -> str:
    return " ".join(f"{v:.2f}" for v in values)


# the table's short names of the host tier's write policies
WRITE_LABELS = {"write_through": "through", "write_through_selective": "selective",
                "write_back": "back"}


def results_table(doc: CacheDoc, rounds: bool = False) -> Table:
    """One row per configuration; `rounds`: the trace is bench_multiturn's (turns are its
    rounds, and its mean TTFT per round is shown, as the benchmark prints it)."""
    per = "round" if rounds else "turn"
    writes = any(r.hicache_write_policy for r in doc.results)
    t = Table(title=f"prefix cache: hit rate per {per} ({per} 1 first) against an unbounded "
                    "pool",
              caption=f"holds: every {per} within {doc.hold_tolerance:.2f} of the unbounded "
                      f"pool; thrash: later {per}s {doc.thrash_gap:.2f} or more below it; "
                      f"TTFT from the twin's scheduler (ms"
                      + ("; by round: the mean, s)" if rounds else ")")
                      + ("; write: the host tier's policy (write_through, ..._selective, "
                         "write_back)" if writes else ""))
    for col, just in (("pool", "right"), ("policy", "left"), ("host", "right"),
                      *([("write", "left")] if writes else []),
                      ("hit rate", "right"), (f"by {per}", "left"),
                      *([("TTFT by round", "left")] if rounds else []),
                      ("evicted+returned", "right"),
                      ("TTFT p50", "right"), ("TTFT p99", "right"), ("verdict", "left")):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    for r in doc.results:
        verdict = "holds" if r.holds else ("thrashes" if r.thrashes else
                                           f"short at {list(r.short_turns)}")
        by_round = [_by_turn([ms / 1000 for ms in r.ttft_ms_mean_by_turn or ()])]
        t.add_row(str(r.pool_tokens), r.policy, str(r.host_pool_tokens),
                  *([WRITE_LABELS.get(r.hicache_write_policy or "", "-")] if writes else []),
                  f"{r.hit_rate:.3f}", _by_turn(r.hit_rate_by_turn),
                  *(by_round if rounds else []),
                  str(r.evicted_then_returned), f"{r.ttft_ms.p50:.0f}",
                  f"{r.ttft_ms.p99:.0f}", verdict)
    return t


def parse_ratios(text: str) -> list[float]:
    """--hicache-ratio's list: 0 (no host tier) or ratios above 1."""
    values: list[float] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            v = float(part)
        except ValueError:
            fail(f"--hicache-ratio must be a comma-separated list of numbers, not {text!r}")
        if not math.isfinite(v) or v < 0:
            fail(f"every --hicache-ratio must be 0 (off) or a ratio above 1, got {part}")
        if v not in values:
            values.append(v)
    if not values:
        fail("--hicache-ratio is empty")
    return values


def parse_write_policies(text: str) -> list[str]:
    names = list(dict.fromkeys(p.strip().lower() for p in text.split(",") if p.strip()))
    if not names:
        fail("--hicache-write-policy is empty")
    for name in names:
        if name not in WRITE_POLICIES:
            fail(f"unknown --hicache-write-policy {name!r}: one of {', '.join(WRITE_POLICIES)}")
    return names


def parse_rate(text: str) -> float:
    """--request-rate: requests per second, or inf (no pause between sends)."""
    try:
        rate = float(text)
    except ValueError:
        fail(f"--request-rate must be a number of requests per second or inf, not {text!r}")
    if math.isnan(rate) or rate <= 0:
        fail(f"--request-rate must be positive (inf: no pause), got {text}")
    return rate


def cache_grid(pools: list[int], policies: list[str], hosts: list[int] | None,
               ratios: list[float] | None, writes: list[str],
               kv_bytes_per_token: int) -> list[CacheConfig]:
    """Every pool x policy x host tier (x write policy, for a host tier), checked before any
    replay runs: a host tier SGLang would refuse is a one-line error here."""
    grid: list[CacheConfig] = []
    for p in pools:
        sizes = (hosts if ratios is None else
                 [0 if r == 0 else hicache_host_tokens(p, kv_bytes_per_token, r)
                  for r in ratios])
        for pol in policies:
            for h in sizes or [0]:
                for w in (writes if h else [DEFAULT_WRITE_POLICY]):
                    grid.append(CacheConfig(p, pol, h, w))
    return grid


# the synthetic traces' defaults: one place each (core/cache/), the CLI shows them
SYNTH = SyntheticConfig()
MT = MultiturnConfig()
SHAPES = ("chat", "bench-multiturn")
CHAT_ONLY = ("sessions", "turns", "think_time", "arrival_gap", "return_share", "return_after",
             "user_tokens", "length_spread", "reasoning_share")
BENCH_ONLY = ("clients", "rounds", "request_tokens", "max_parallel", "request_rate",
              "ready_queue", "round_barrier")


def cache(
    ctx: typer.Context,
    trace: Path | None = typer.Option(None, "--trace", help="A JSON Lines trace (docs/cache.md)"
                                      "; without it a synthetic trace is made."),
    shape: str = typer.Option(
        "chat", help="The synthetic trace: chat (sessions of a chat product, with a shared "
        "system prompt) or bench-multiturn (SGLang's benchmark/hicache/bench_multiturn.py: "
        "clients in rounds, nothing shared)."),
    sessions: int = typer.Option(SYNTH.sessions, help="chat: sessions."),
    turns: int = typer.Option(SYNTH.turns, help="chat: turns per session."),
    think_time: float = typer.Option(
        SYNTH.think_time_s, help="chat: mean think time between turns, s (exponential)."),
    arrival_gap: float = typer.Option(
        SYNTH.arrival_gap_s, help="chat: mean gap between session starts, s (Poisson "
        "arrivals)."),
    return_share: float = typer.Option(
        SYNTH.return_share, help="chat: share of sessions that pause once and return "
        "after minutes."),
    return_after: float = typer.Option(
        SYNTH.return_after_s, help="chat: their pause, s (uniform in 0.5..1.5 x)."),
    system_prompt_tokens: int = typer.Option(
        SYNTH.system_prompt_tokens, help="The shared system prompt (chat; with a trace "
        "of counts, the shared first tokens)."),
    user_tokens: int = typer.Option(SYNTH.user_tokens, help="chat: mean user message tokens."),
    answer_tokens: int | None = typer.Option(
        None, help=f"Answer tokens (chat: the mean, reasoning included, {SYNTH.answer_tokens}; "
        f"bench-multiturn: --output-length, {MT.answer_tokens}); a trace line without "
        f"output_tokens gets this many ({SYNTH.answer_tokens})."),
    length_spread: float = typer.Option(
        SYNTH.length_spread, help="chat: lengths uniform in [len x (1 - r), len x "
        "(1 + r)]."),
    reasoning_share: float = typer.Option(
        SYNTH.reasoning_share, help="chat: share of each answer that is reasoning, "
        "dropped from later prompts (0: thinking off)."),
    clients: int = typer.Option(MT.clients, help="bench-multiturn: --num-clients."),
    rounds: int = typer.Option(MT.rounds, help="bench-multiturn: --num-rounds."),
    request_tokens: int = typer.Option(
        MT.request_tokens, help="bench-multiturn: --request-length, the first prompt and "
        "each later round's new question."),
    max_parallel: int = typer.Option(MT.max_parallel, help="bench-multiturn: --max-parallel."),
    request_rate: str = typer.Option(
        str(MT.request_rate), help="bench-multiturn: --request-rate, sends per second "
        "(Poisson gaps; inf: none)."),
    ready_queue: str = typer.Option(
        MT.ready_queue, help="bench-multiturn: --ready-queue-policy, random or fifo."),
    round_barrier: bool = typer.Option(
        MT.round_barrier, "--round-barrier/--no-round-barrier",
        help="bench-multiturn: --enable-round-barrier (a round starts when every client "
        "finished the last one)."),
    pool: str = typer.Option("8192,16384", help="GPU KV pool sizes to sweep, tokens."),
    policy: str = typer.Option("lru,lfu,fifo,slru", help="Eviction policies to sweep."),
    host_pool_tokens: str = typer.Option(
        "0", help="Host-tier sizes to sweep, tokens (0: off; else larger than the pool)."),
    hicache_ratio: str | None = typer.Option(
        None, help="Host tiers as SGLang's --hicache-ratio, times each pool (0: off; else "
        "above 1), instead of --host-pool-tokens."),
    hicache_write_policy: str = typer.Option(
        DEFAULT_WRITE_POLICY, help=f"The host tier's write policies to sweep: "
        f"{', '.join(WRITE_POLICIES)}."),
    seed: int = typer.Option(1, help="Seed of the synthetic trace (bench-multiturn: of the "
                             "request loop's gaps and queue)."),
    gpu: str = typer.Option("l4", help="GPU of the step-time model."),
    model: str = typer.Option("qwen3-8b", help="Built-in model name or path to a config.json."),
    weights: str = typer.Option("bf16", help="bf16 or fp8."),
    kv_cache: str = typer.Option("bf16", "--kv-cache", help="bf16 or fp8."),
    as_json: bool = typer.Option(False, "--json", help="Print the chatfleet.cache/1 document."),
    out_path: Path | None = typer.Option(None, "--out", help="Write the document here."),
) -> None:
    """Replay a multi-turn trace through the radix prefix cache for each pool size, eviction
    policy and host-tier size: hit rate per turn, evictions of prefixes that come back, TTFT."""
    if shape not in SHAPES:
        fail(f"unknown --shape {shape!r}: {' or '.join(SHAPES)}")
    given = {name for name in (*CHAT_ONLY, *BENCH_ONLY)
             if getattr(ctx.get_parameter_source(name), "name", "DEFAULT") != "DEFAULT"}
    other = sorted(given & set(CHAT_ONLY if trace is not None or shape != "chat" else ())
                   | given & set(BENCH_ONLY if trace is not None or shape != "bench-multiturn"
                                 else ()))
    if other:
        flags = ", ".join("--" + n.replace("_", "-") for n in other)
        mode = "--trace" if trace is not None else "--shape " + shape
        fail(f"{flags} {'does' if len(other) == 1 else 'do'} not apply to {mode}")
    pools = parse_sizes(pool, "--pool")
    policies = parse_policies(policy)
    if hicache_ratio is not None and host_pool_tokens != "0":
        fail("give the host tiers once: --host-pool-tokens or --hicache-ratio")
    hosts = (None if hicache_ratio is not None else
             parse_sizes(host_pool_tokens, "--host-pool-tokens", allow_zero=True))
    ratios = None if hicache_ratio is None else parse_ratios(hicache_ratio)
    writes = parse_write_policies(hicache_write_policy)
    multiturn: MultiturnConfig | None = None
    with clean_errors():
        check_output_file(out_path, "--out")
        spec = EngineSpec(gpu=load_gpu(gpu), model=load_model(model),
                          precision=precision(weights, kv_cache))
        step_model = step_time_model(spec)
        card_pool = spec.pool_plan().kv_pool_tokens
        context = spec.model.max_position_embeddings
        grid = cache_grid(pools, policies, hosts, ratios, writes,
                          spec.model.kv_bytes_per_token(kv_cache))
        answers = answer_tokens if answer_tokens is not None else (
            MT.answer_tokens if shape == "bench-multiturn" and trace is None
            else SYNTH.answer_tokens)
        for flag, tokens in (("--system-prompt-tokens", system_prompt_tokens),
                             ("--user-tokens", user_tokens), ("--answer-tokens", answers)):
            if tokens > context:  # no engine serves it, and its token ids would be made
                fail(f"{flag} {tokens} is more than {spec.model.name}'s context of {context} "
                     "tokens")
        if trace is not None:
            if system_prompt_tokens < 0 or answers <= 0:
                fail("--system-prompt-tokens must be >= 0 and --answer-tokens positive")
            turns_list = load_trace_file(trace, system_prompt_tokens, answers, context)
            trace_info: dict[str, Any] = {"kind": "file", "path": str(trace),
                                          "shared_prefix_tokens_of_counts": system_prompt_tokens,
                                          "default_answer_tokens": answers}
        elif shape == "bench-multiturn":
            multiturn = MultiturnConfig(
                clients=clients, rounds=rounds, request_tokens=request_tokens,
                answer_tokens=answers, max_parallel=max_parallel,
                request_rate=parse_rate(request_rate), ready_queue=ready_queue,
                round_barrier=round_barrier)
            if multiturn.prompt_tokens(rounds) + answers > context:
                fail(f"the last round's prompt ({multiturn.prompt_tokens(rounds)} tokens) and "
                     f"answer exceed {spec.model.name}'s context of {context} tokens")
            turns_list = multiturn_trace(multiturn)
            trace_info = {**multiturn.to_json(), "seed": seed}
        else:
            scfg = SyntheticConfig(
                sessions=sessions, turns=turns, system_prompt_tokens=system_prompt_tokens,
                user_tokens=user_tokens, answer_tokens=answers,
                length_spread=length_spread, reasoning_share=reasoning_share,
                think_time_s=think_time, arrival_gap_s=arrival_gap, return_share=return_share,
                return_after_s=return_after)
            scfg.workload_config()  # validates the reasoning share
            turns_list = synthetic_trace(scfg, random.Random(seed), step_model)
            trace_info = {**scfg.to_json(), "seed": seed}
        trace_info.update(
            sessions=len({t.session for t in turns_list}),
            turns=max(t.turn for t in turns_list),
            requests=len(turns_list),
            prompt_tokens=sum(t.prompt_len for t in turns_list),
            span_s=round(max(t.time for t in turns_list) - min(t.time for t in turns_list), 1),
        )
        target = {"gpu": spec.gpu.name, "calibrated": spec.is_calibrated,
                  "model": spec.model.name, "weights": weights,
                  "kv_cache": kv_cache, "card_pool_tokens": card_pool,
                  "ttft_model": "the twin's scheduler (SGLang v0.5 model) in virtual time: "
                                "queueing for pool room and behind other prefills, chunked "
                                "prefill-first batches, host load-back over PCIe"}
        results: list[CacheResult] = []
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=console, transient=True) as bar:
            task = bar.add_task("replaying the trace", total=len(grid) + 1)
            reference = replay(turns_list, CacheConfig(unbounded_pool(turns_list)), spec,
                               multiturn, seed)
            bar.advance(task)
            for cfg in grid:
                bar.update(task, description=f"pool {cfg.pool_tokens}, {cfg.policy}, host "
                                             f"{cfg.host_pool_tokens}")
                results.append(summarize(replay(turns_list, cfg, spec, multiturn, seed)))
                bar.advance(task)
        if multiturn is not None:  # the span is the replay's: the loop decided the send times
            trace_info["span_s"] = round(reference.span_s, 1)
        doc = cache_document(trace_info, target, reference, results, card_pool)
        if out_path is not None:
            write_json(out_path, doc.to_json())
    if as_json:
        print_json(doc.to_json())
        return
    print_document(doc, spec, rounds=multiturn is not None)
    if out_path is not None:
        out.print(f"wrote {out_path}")


def print_document(doc: CacheDoc, spec: EngineSpec, rounds: bool) -> None:
    ws = doc.working_set_tokens
    per = "round" if rounds else "turn"
    out.print(f"trace: {doc.trace.sessions} {'clients' if rounds else 'sessions'}, "
              f"{doc.trace.requests} requests over {doc.trace.span_s / 60:.1f} min; working "
              f"set peak {ws.peak} tokens, mean {ws.mean:.0f}; unbounded pool hit rate "
              f"{doc.unbounded.hit_rate:.3f} by {per} "
              f"({_by_turn(doc.unbounded.hit_rate_by_turn)})")
    out.print(results_table(doc, rounds))
    if not spec.is_calibrated:
        out.print(f"[yellow]{uncalibrated_note(spec.gpu.name)}[/]", highlight=False)
    rec = doc.recommendation
    host = (f"{rec.host_pool_tokens} ({rec.hicache_write_policy})" if rec.host_pool_tokens
            else "off")
    out.print(f"recommendation: pool {rec.pool_tokens} tokens, {rec.policy}, host tier "
              f"{host}: {rec.reason}")
