"""What the commands share to read their options: arrivals, lengths, prompt groups, load
points, the engine model and calibration profiles, the host tier (HiCache), each flag's value
checked and turned into the core's types (a bad one is a one-line error)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from chatfleet.cli.common import console, fail, parse_list
from chatfleet.core.calibration import Calibration
from chatfleet.core.documents.sweep import ClosedLoad, Load, OpenLoad
from chatfleet.core.engine.build import ENGINE_MODELS, EngineSpec
from chatfleet.core.engine.host_tier import WRITE_POLICIES
from chatfleet.core.memory import HICACHE_DEFAULT_RATIO, hicache_host_tokens
from chatfleet.core.specs import get_gpu
from chatfleet.core.workload import GROUP_DRAWS, GroupDraw, LengthSpec
from chatfleet.data.lengths import load_length_file
from chatfleet.data.sharegpt import cached_sharegpt_length_pairs
from chatfleet.report.load import check_document, number, read_json
from chatfleet.twin.calibrate import load_profile

# `chatfleet plan` (and the demo) write a gateway config that lists every replica: past this
# many users the fleet's list alone takes gigabytes (10^8 users took 20 GB and two minutes)
MAX_PLAN_USERS = 1_000_000


def parse_arrival(text: str) -> float:
    """'poisson' -> burstiness 1; 'gamma:B' -> B."""
    if text == "poisson":
        return 1.0
    if text.startswith("gamma:"):
        try:
            b = float(text.split(":", 1)[1])
        except ValueError:
            fail(f"bad arrival {text!r}: use poisson or gamma:B with B a number")
        if not (math.isfinite(b) and b > 0):
            fail(f"bad arrival {text!r}: the gamma burstiness must be a positive number")
        return b
    fail(f"bad arrival {text!r}: use poisson or gamma:B")


def build_lengths(kind: str, input_len: int, output_len: int, range_ratio: float,
                  convention: str, length_file: Path | None) -> LengthSpec:
    if kind in ("fixed", "uniform"):
        return LengthSpec(kind, input_len, output_len, range_ratio,  # type: ignore[arg-type]
                          convention)  # type: ignore[arg-type]
    if kind == "sharegpt":
        with console.status("loading ShareGPT length pairs (cached after the first run)"):
            pairs = cached_sharegpt_length_pairs()
        return LengthSpec("sharegpt", pairs=tuple(pairs))
    if kind == "file":
        if length_file is None:
            fail("--lengths file needs --length-file PATH")
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


def engine_model_args(engine_model: str, max_num_batched_tokens: int | None,
                      long_prefill_token_threshold: int) -> dict[str, Any]:
    """The EngineSpec fields of --engine-model and its vLLM-only flags, checked."""
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
    cal, doc = load_profile(profile)
    if get_gpu(gpu).name != cal.gpu:
        console.print(f"[yellow]note:[/] profile {profile} was fitted on {cal.gpu}, used for "
                      f"{gpu}: the results are marked uncalibrated")
    fitted_for = doc.get("engine_model", "sglang")
    if fitted_for != engine_model:
        console.print(f"[yellow]note:[/] profile {profile} was fitted for the {fitted_for} "
                      f"engine model, used with the {engine_model} one")
    return cal


def read_sweep_file(path: Path, flag: str) -> dict[str, Any]:
    """The chatfleet.sweep/1 document given to `flag` (a file, or a live sweep's DIR with its
    sweep.json), checked for what every reader of one takes for granted: the schema; points with
    a load; target, workload and slo objects; and at every valid point, the figures (goodput,
    throughput, TTFT and TPOT percentiles). A wrong file is one line, never a KeyError."""
    file = path / "sweep.json" if path.is_dir() else path
    where = f"{flag} {file}"
    if not file.is_file():
        fail(f"{where}: no such file (give a `chatfleet twin sweep --json` file or a "
             "`chatfleet sweep --out` DIR)")
    try:
        doc = check_document(read_json(file, "sweep document"), where)
    except UnicodeDecodeError:
        fail(f"{where}: not UTF-8 text, so not a sweep document")
    for i, point in enumerate(doc["points"]):
        if not point.get("valid", True):
            continue
        figures = [point.get("goodput_rps"), point.get("output_tok_s")]
        for key in ("ttft_ms", "tpot_ms"):
            stats = point.get(key)
            figures += ([stats.get("p50"), stats.get("p99")] if isinstance(stats, dict)
                        else [None])
        if any(number(v) is None for v in figures):
            fail(f"{where}, point {i}: goodput_rps, output_tok_s, ttft_ms and tpot_ms (p50, "
                 "p99) must be numbers")
    return doc


# --------------------------------------------------------------------------------------------
# The host tier (HiCache) of the SGLang model: `--host-pool-tokens` (tokens), or SGLang's own
# `--hicache-ratio` / `--hicache-size`, and `--hicache-write-policy` (core/engine/host_tier.py
# says what each policy does, core/memory.py how the pool is sized)
# --------------------------------------------------------------------------------------------

HOST_POOL_HELP = "HiCache host tier size in tokens (0: off); larger than the KV pool."
RATIO_HELP = ("SGLang's --hicache-ratio: a host tier of this many times the KV pool (> 1; "
              "instead of --host-pool-tokens).")
SIZE_HELP = ("SGLang's --hicache-size: a host tier of this many GB (10^9 bytes) of KV "
             "(instead of --host-pool-tokens).")
WRITE_POLICY_HELP = (f"SGLang's --hicache-write-policy: {', '.join(WRITE_POLICIES)} "
                     "(docs/twin.md#the-host-tier-hicache).")


def host_pool_tokens_of(spec: EngineSpec, host_pool_tokens: int, hicache_ratio: float | None,
                        hicache_size: float | None) -> int:
    """The host pool in tokens from whichever of the three flags was given (one at most);
    SGLang's sizing for the ratio and the size, on `spec`'s pool and KV dtype."""
    given = [flag for flag, value in (("--host-pool-tokens", host_pool_tokens or None),
                                      ("--hicache-ratio", hicache_ratio),
                                      ("--hicache-size", hicache_size)) if value is not None]
    if len(given) > 1:
        fail(f"give the host tier's size once: {' and '.join(given)} were both given")
    if host_pool_tokens < 0:
        fail(f"--host-pool-tokens: host pool tokens must not be negative, got "
             f"{host_pool_tokens}")
    if hicache_size is not None and not hicache_size > 0:
        fail(f"--hicache-size must be a positive number of GB, got {hicache_size}")
    if hicache_ratio is None and hicache_size is None:
        return host_pool_tokens
    return hicache_host_tokens(spec.kv_pool_tokens(),
                               spec.model.kv_bytes_per_token(spec.precision.kv_cache),
                               HICACHE_DEFAULT_RATIO if hicache_ratio is None else hicache_ratio,
                               hicache_size or 0.0)


def with_host_tier(spec: EngineSpec, host_pool_tokens: int, hicache_ratio: float | None,
                   hicache_size: float | None, write_policy: str) -> EngineSpec:
    """`spec` with the host tier the flags ask for (EngineSpec checks it as SGLang would)."""
    host = host_pool_tokens_of(spec, host_pool_tokens, hicache_ratio, hicache_size)
    return dataclasses.replace(spec, host_pool_tokens=host, hicache_write_policy=write_policy)
