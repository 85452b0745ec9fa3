"""What the harness needs to know about an engine, behind one small base class.

An adapter knows, for one engine: how to flush its prefix cache and what the answer proves,
how to read its Prometheus metrics, where its responses carry cached tokens and which server
flag makes them appear, which request fields it accepts, what its server reports about itself,
which facts its startup log holds, and how to launch it. Adapters hold no state: one instance
serves any number of servers.

Verifying a flush (see docs/telemetry-and-engines.md):

- from the first requests of a run (`verify_flush_from_cached`): right after a flush, the
  request that reaches the engine first finds nothing cached, so among a run's first requests
  at least one reports `cached_tokens == 0`. If every one of them found tokens cached (the shared
  system prompt of the previous run), the flush did not take. This needs the engine to report
  cached tokens (SGLang `--enable-cache-report`, vLLM `--enable-prompt-tokens-details`) and the
  caller to pass None where the field was absent (absent is not zero).
- from the prefix-cache counters (`flush_and_verify`): send a probe prompt that shares no
  block with any workload prompt (it is cached now), read the counters, flush, send the probe
  again, and read them once more. A flushed cache answers the re-sent probe with no hit: the
  hits counter does not move while the queries counter grows by the probe's length. A cache
  that was not flushed hits on every full block of the probe. vLLM needs this because its
  /reset_prefix_cache answers 200 whether or not the reset happened.
"""

from __future__ import annotations

import asyncio
import re
import shlex
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import astuple, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import aiohttp

from chatfleet.core.errors import ChatfleetError
from chatfleet.core.specs import Precision, precision
from chatfleet.engines.prom import Metrics, MetricsUnavailable, fetch_metrics

HTTP_TIMEOUT_S = 10.0
CACHED_TOKENS_PATH = ("usage", "prompt_tokens_details", "cached_tokens")
# fields the OpenAI API itself defines for /v1/chat/completions and /v1/completions
OPENAI_FIELDS = frozenset({
    "model", "messages", "prompt", "suffix", "echo", "best_of", "max_tokens",
    "max_completion_tokens", "temperature", "top_p", "n", "stream", "stream_options", "stop",
    "seed", "presence_penalty", "frequency_penalty", "logit_bias", "logprobs", "top_logprobs",
    "user", "tools", "tool_choice", "parallel_tool_calls", "response_format", "metadata",
    "modalities", "reasoning_effort", "service_tier", "store", "prediction", "audio",
    "web_search_options",
})
OPENAI_STREAM_OPTIONS = frozenset({"include_usage", "include_obfuscation"})


@dataclass(frozen=True, slots=True)
class FlushResult:
    """What a flush request returned. `ok` says the engine accepted it; `needs_verification`
    says that acceptance proves nothing (vLLM) and the cache must be checked."""

    ok: bool
    status: int | None
    detail: str
    needs_verification: bool = False


@dataclass(frozen=True, slots=True)
class FlushVerdict:
    """Whether a flush is shown to have emptied the cache: True, False, or None (cannot tell)."""

    verified: bool | None
    method: str
    detail: str
    figures: Mapping[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"verified": self.verified, "method": self.method, "detail": self.detail,
                **dict(self.figures)}


@dataclass(frozen=True, slots=True)
class MetricNames:
    """An engine's Prometheus names for what the harness records; each field lists the current
    name first and older names after it."""

    running: tuple[str, ...] = ()
    queue: tuple[str, ...] = ()
    token_usage: tuple[str, ...] = ()
    cache_hit_rate: tuple[str, ...] = ()  # a gauge, where the engine publishes one
    prefix_queries: tuple[str, ...] = ()  # counter: prompt tokens looked up in the cache
    prefix_hits: tuple[str, ...] = ()  # counter: of those, tokens found
    prompt_tokens: tuple[str, ...] = ()
    generation_tokens: tuple[str, ...] = ()
    preemptions: tuple[str, ...] = ()
    pool_tokens: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class LaunchCommand:
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def shell(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        cmd = shlex.join(self.argv)
        return f"{env} {cmd}" if env else cmd


def cached_tokens(response: Mapping[str, Any]) -> int | None:
    """`usage.prompt_tokens_details.cached_tokens` of a response or stream chunk, or None when
    the engine did not report it (None is not 0: an engine without the flag reports nothing)."""
    cur: Any = response
    for key in CACHED_TOKENS_PATH:
        if not isinstance(cur, Mapping) or cur.get(key) is None:
            return None
        cur = cur[key]
    try:
        return int(cur)
    except (TypeError, ValueError):
        return None


def verify_flush_from_cached(first_cached: Sequence[int | None]) -> FlushVerdict:
    """Judge a flush from the cached tokens of a run's first requests (in send order, the first
    wave: the users that started together, or the first few arrivals). Right after a flush the
    request the engine admits first finds nothing cached, so one of them reports 0."""
    known = [int(c) for c in first_cached if c is not None]
    n = len(first_cached)
    if not known:
        return FlushVerdict(None, "cached_tokens",
                            "no first request reported cached tokens: start the engine with "
                            "its cache report on (SGLang --enable-cache-report, vLLM "
                            "--enable-prompt-tokens-details)", {"requests": n})
    low = min(known)
    figures = {"requests": n, "reported": len(known), "min_cached_tokens": low}
    if low == 0:
        return FlushVerdict(True, "cached_tokens",
                            f"a first request found nothing cached ({len(known)} of {n} "
                            "reported)", figures)
    return FlushVerdict(False, "cached_tokens",
                        f"every first request found tokens cached (at least {low}): the cache "
                        "was not flushed", figures)


def _read_counters(names: MetricNames, m: Metrics) -> tuple[float | None, float | None]:
    return m.first_of(names.prefix_queries), m.first_of(names.prefix_hits)


def verify_flush_counters(names: MetricNames, before: Metrics, after: Metrics, *,
                          probe_tokens: int | None = None) -> FlushVerdict:
    """Judge a flush from the prefix-cache counters read just before the re-sent probe and
    just after it (nothing else running): a flushed cache gives the probe no hit."""
    q0, h0 = _read_counters(names, before)
    q1, h1 = _read_counters(names, after)
    if None in (q0, h0, q1, h1):
        return FlushVerdict(None, "prefix_counters",
                            "the engine exports no prefix-cache counters "
                            f"({names.prefix_queries[:1]}, {names.prefix_hits[:1]})")
    assert q0 is not None and h0 is not None and q1 is not None and h1 is not None
    dq, dh = q1 - q0, h1 - h0
    figures = {"queries_delta": dq, "hits_delta": dh, "probe_tokens": probe_tokens}
    if dq < 0 or dh < 0:
        return FlushVerdict(None, "prefix_counters",
                            "the counters went backwards: the engine restarted", figures)
    if dq == 0:
        return FlushVerdict(None, "prefix_counters",
                            "the probe did not move the queries counter (prefix caching off, "
                            "or the metrics lag)", figures)
    if dh == 0:
        return FlushVerdict(True, "prefix_counters",
                            f"the re-sent probe found nothing cached ({dq:.0f} tokens queried, "
                            "0 hits)", figures)
    return FlushVerdict(False, "prefix_counters",
                        f"the re-sent probe found {dh:.0f} of {dq:.0f} tokens cached: the flush "
                        "did not take", figures)


# --- log parsing -----------------------------------------------------------------------------

# FP8 KV cache with no scales in the checkpoint: the engine falls back to 1.0
KV_SCALE_FALLBACK_PATTERNS = (
    # SGLang model_runner (and vLLM V0's model runner)
    re.compile(r"Using FP8 KV cache but no scaling factors provided\. Defaulting to scaling "
               r"factors of 1\.0[^\n]*"),
    # vLLM's BaseKVCacheMethod.process_weights_after_loading (older SGLang copies too)
    re.compile(r"Using KV cache scaling factor 1\.0 for fp8_e4m3[^\n]*"),
)
Q_SCALE_FALLBACK_PATTERNS = (
    re.compile(r"Checkpoint does not provide a q scaling factor[^\n]*"),
    re.compile(r"Using uncalibrated q_scale 1\.0 and/or prob_scale 1\.0[^\n]*"),
)
MAX_LOG_BYTES = 512 * 1024 * 1024


def _num(text: str) -> float:
    return float(text.replace(",", ""))


def scan_log_lines(path: Path, patterns: Mapping[str, re.Pattern[str]]) -> dict[str, Any]:
    """The first match of each pattern in a log file (its first group, or the whole match),
    plus the KV-scale fallback lines. Reads line by line, up to MAX_LOG_BYTES."""
    found: dict[str, Any] = {}
    kv_lines: list[str] = []
    q_lines: list[str] = []
    read = 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            read += len(line)
            if read > MAX_LOG_BYTES:
                found["truncated"] = True
                break
            for key, pat in patterns.items():
                if key in found:
                    continue
                m = pat.search(line)
                if m:
                    found[key] = m.group(1) if m.groups() else m.group(0)
            if len(kv_lines) < 4:
                for pat in KV_SCALE_FALLBACK_PATTERNS:
                    m = pat.search(line)
                    if m and m.group(0).strip() not in kv_lines:
                        kv_lines.append(m.group(0).strip())
            if len(q_lines) < 4:
                for pat in Q_SCALE_FALLBACK_PATTERNS:
                    m = pat.search(line)
                    if m and m.group(0).strip() not in q_lines:
                        q_lines.append(m.group(0).strip())
    found["_kv_lines"] = kv_lines
    found["_q_lines"] = q_lines
    return found


# --- the base class --------------------------------------------------------------------------

class EngineAdapter:
    """One engine's behaviour. Subclasses set the class attributes and override what differs."""

    name: ClassVar[str] = "base"
    flush_path: ClassVar[str | None] = None
    flush_method: ClassVar[str] = "POST"
    flush_needs_verification: ClassVar[bool] = False
    metric_names: ClassVar[MetricNames] = MetricNames()
    extra_metric_names: ClassVar[tuple[str, ...]] = ()  # others read_metrics reads
    has_metrics: ClassVar[bool] = True  # serves Prometheus /metrics
    cache_report_flag: ClassVar[str | None] = None  # the flag that makes cached_tokens appear
    accepts_ignore_eos: ClassVar[bool] = True  # ignore_eos and min_tokens
    accepts_continuous_usage: ClassVar[bool] = True  # stream_options.continuous_usage_stats

    # --- flush ------------------------------------------------------------------------------
    async def flush(self, session: aiohttp.ClientSession, url: str) -> FlushResult:
        if self.flush_path is None:
            return FlushResult(False, None, f"{self.name}: this engine has no cache-flush "
                               "endpoint; restart it to start from an empty cache")
        target = url.rstrip("/") + self.flush_path
        try:
            async with session.request(self.flush_method, target,
                                       timeout=aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S)
                                       ) as resp:
                body = (await resp.read())[:500].decode("utf-8", "replace").strip()
                return self.flush_answer(resp.status, body)
        except (TimeoutError, aiohttp.ClientError, ConnectionError) as exc:
            return FlushResult(False, None, f"{self.flush_method} {target}: "
                               f"{type(exc).__name__}: {exc}")

    def flush_answer(self, status: int, body: str) -> FlushResult:
        if status == 200:
            return FlushResult(True, status, body or "flushed", self.flush_needs_verification)
        return FlushResult(False, status, body or f"HTTP {status}")

    def verify_flush(self, before: Metrics, after: Metrics, *,
                     probe_tokens: int | None = None) -> FlushVerdict:
        """Judge a flush from this engine's prefix-cache counters around a re-sent probe."""
        return verify_flush_counters(self.metric_names, before, after,
                                     probe_tokens=probe_tokens)

    # --- metrics ----------------------------------------------------------------------------
    def scraped_metric_names(self) -> frozenset[str]:
        """Every metric `read_metrics` reads: the scraper parses only these lines."""
        names = {n for field_names in astuple(self.metric_names)
                 for n in field_names}
        return frozenset(names | set(self.extra_metric_names))

    def read_metrics(self, m: Metrics) -> dict[str, float | None]:
        """The harness's figures from one scrape: running, queue, token_usage, cache_hit_rate
        (None where the engine has no gauge: the scraper derives it from counter deltas) and the
        raw counters."""
        n = self.metric_names
        return {
            "running": m.first_of(n.running, agg="sum"),
            "queue": m.first_of(n.queue, agg="sum"),
            "token_usage": m.first_of(n.token_usage, agg="max"),
            "cache_hit_rate": m.first_of(n.cache_hit_rate, agg="mean"),
            "prefix_cache_queries": m.first_of(n.prefix_queries),
            "prefix_cache_hits": m.first_of(n.prefix_hits),
            "prompt_tokens": m.first_of(n.prompt_tokens),
            "generation_tokens": m.first_of(n.generation_tokens),
            "preemptions": m.first_of(n.preemptions),
            "pool_tokens": m.first_of(n.pool_tokens, agg="max"),
        }

    # --- requests ---------------------------------------------------------------------------
    def shape_payload(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        """The request body this engine accepts (a copy; the input is not changed)."""
        return dict(payload)

    def stripped_fields(self, payload: Mapping[str, Any]) -> list[str]:
        """The fields `shape_payload` removes (to say so in the results)."""
        shaped = self.shape_payload(payload)
        out = [k for k in payload if k not in shaped]
        so, sso = payload.get("stream_options"), shaped.get("stream_options")
        if isinstance(so, Mapping):
            kept = sso if isinstance(sso, Mapping) else {}
            out += [f"stream_options.{k}" for k in so if k not in kept]
        return out

    # --- server -----------------------------------------------------------------------------
    async def server_info(self, session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
        info: dict[str, Any] = {"engine": self.name}
        models = await get_json(session, url, "/v1/models")
        if isinstance(models, dict) and "error" not in models:
            data = models.get("data") or []
            if data and isinstance(data[0], dict):
                info["model"] = data[0].get("id")
                if data[0].get("max_model_len") is not None:
                    info["max_model_len"] = data[0]["max_model_len"]
        elif isinstance(models, dict):
            info["error"] = models["error"]
        return info

    # --- logs -------------------------------------------------------------------------------
    log_patterns: ClassVar[Mapping[str, re.Pattern[str]]] = {}

    def parse_log(self, path: str | Path) -> dict[str, Any]:
        """Startup facts from a server log (`--engine-log`): pool size, memory fraction, KV
        dtype, and whether an FP8 KV cache fell back to a scale of 1.0."""
        p = Path(path)
        raw = scan_log_lines(p, self.log_patterns)
        kv_lines: list[str] = raw.pop("_kv_lines")
        q_lines: list[str] = raw.pop("_q_lines")
        facts: dict[str, Any] = {"engine": self.name, "path": str(p)}
        facts.update(self.log_facts(raw))
        facts["kv_scale_fallback"] = bool(kv_lines)
        facts["kv_scale_lines"] = kv_lines
        facts["q_scale_fallback"] = bool(q_lines)
        facts["q_scale_lines"] = q_lines
        if raw.get("truncated"):
            facts["truncated"] = True
        return facts

    def log_facts(self, raw: Mapping[str, str]) -> dict[str, Any]:
        return {"pool_tokens": None, "mem_fraction": None, "mem_fraction_flag": None}

    # --- launch -----------------------------------------------------------------------------
    def launch_command(self, model_path: str, prec: Precision | str | tuple[str, str],
                       mem_fraction: float | None = None,
                       max_running_requests: int | None = None, *,
                       host: str = "127.0.0.1", port: int | None = None,
                       context_length: int | None = None,
                       chunked_prefill_size: int | None = None,
                       served_model_name: str | None = None,
                       extra: Sequence[str] = ()) -> LaunchCommand:
        raise NotImplementedError(f"{self.name}: no launch command")


def optional_flags(*pairs: tuple[str, str | int | float | None]) -> list[str]:
    """`--flag value` for each pair whose value is set (floats written with %g)."""
    out: list[str] = []
    for flag, value in pairs:
        if value is not None:
            out += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    return out


def as_precision(prec: Precision | str | tuple[str, str]) -> Precision:
    """A Precision, "fp8/fp8", "bf16" (both), or ("fp8", "bf16")."""
    if isinstance(prec, Precision):
        return prec
    if isinstance(prec, tuple):
        return precision(*prec)
    parts = prec.split("/")
    if len(parts) == 1:
        return precision(parts[0], parts[0])
    if len(parts) == 2:
        return precision(parts[0], parts[1])
    raise ChatfleetError(f"precision must look like 'fp8/fp8' (weights/KV cache), not {prec!r}")


def check_launch_args(mem_fraction: float | None, max_running_requests: int | None) -> None:
    if mem_fraction is not None and not 0 < mem_fraction < 1:
        raise ChatfleetError(f"the memory fraction must be between 0 and 1, not {mem_fraction}")
    if max_running_requests is not None and max_running_requests < 1:
        raise ChatfleetError("max_running_requests must be at least 1")


async def get_json(session: aiohttp.ClientSession, url: str, path: str,
                   timeout_s: float = HTTP_TIMEOUT_S) -> Any:
    """GET url+path as JSON; {"error": ...} instead of raising."""
    target = url.rstrip("/") + path
    try:
        async with session.get(target, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            if resp.status != 200:
                body = (await resp.read())[:200].decode("utf-8", "replace")
                return {"error": f"GET {path}: HTTP {resp.status}: {body}", "status": resp.status}
            return await resp.json(content_type=None)
    except (TimeoutError, aiohttp.ClientError, ConnectionError, ValueError) as exc:
        return {"error": f"GET {path}: {type(exc).__name__}: {exc}"}


# --- the counter-verified flush --------------------------------------------------------------

PROBE_WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india",
               "juliett", "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo",
               "sierra", "tango", "uniform", "victor", "whiskey", "xray", "yankee", "zulu")


def probe_prompt(words: int = 160) -> str:
    """A prompt that shares no cache block with any workload prompt: it opens with a fresh
    nonce, so even its first block hashes differently from everything the engine has seen."""
    nonce = uuid.uuid4().hex
    body = " ".join(PROBE_WORDS[(i * 7) % len(PROBE_WORDS)] for i in range(words))
    return f"chatfleet flush probe {nonce}. {body}"


async def _send_probe(session: aiohttp.ClientSession, url: str, model: str,
                      prompt: str) -> int | None:
    body = {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0.0,
            "stream": False}
    async with session.post(url.rstrip("/") + "/v1/completions", json=body,
                            timeout=aiohttp.ClientTimeout(total=60)) as resp:
        if resp.status != 200:
            text = (await resp.read())[:300].decode("utf-8", "replace")
            raise MetricsUnavailable(f"the probe request failed: HTTP {resp.status}: {text}")
        doc = await resp.json(content_type=None)
    usage = doc.get("usage") if isinstance(doc, dict) else None
    if isinstance(usage, dict) and usage.get("prompt_tokens") is not None:
        return int(usage["prompt_tokens"])
    return None


async def _model_name(session: aiohttp.ClientSession, url: str) -> str | None:
    doc = await get_json(session, url, "/v1/models")
    if isinstance(doc, dict):
        data = doc.get("data") or []
        if data and isinstance(data[0], dict) and data[0].get("id"):
            return str(data[0]["id"])
    return None


async def flush_and_verify(adapter: EngineAdapter, session: aiohttp.ClientSession, url: str,
                           model: str | None = None, *, settle_s: float = 5.0,
                           poll_s: float = 0.05) -> tuple[FlushResult, FlushVerdict]:
    """Flush, proving it with the prefix-cache counters around a re-sent probe (the engine
    must be idle). The probe stays cached afterwards, which is harmless: it shares no block with
    any workload prompt. Returns the flush answer and the verdict."""
    if adapter.flush_path is None:
        res = await adapter.flush(session, url)
        return res, FlushVerdict(False, "prefix_counters", res.detail)
    name = model or await _model_name(session, url)
    if name is None:
        res = await adapter.flush(session, url)
        return res, FlushVerdict(None, "prefix_counters",
                                 "no model name (GET /v1/models failed): no probe sent")
    prompt = probe_prompt()
    try:
        start = await fetch_metrics(session, url)
        tokens = await _send_probe(session, url, name, prompt)
        before = await _settled_metrics(adapter, session, url, start, settle_s, poll_s)
        res = await adapter.flush(session, url)
        if not res.ok:
            return res, FlushVerdict(False, "prefix_counters", f"the flush failed: {res.detail}")
        await _send_probe(session, url, name, prompt)
        after = await _settled_metrics(adapter, session, url, before, settle_s, poll_s)
    except (MetricsUnavailable, TimeoutError, aiohttp.ClientError, ConnectionError) as exc:
        return (FlushResult(False, None, f"{type(exc).__name__}: {exc}"),
                FlushVerdict(None, "prefix_counters", f"{type(exc).__name__}: {exc}"))
    return res, adapter.verify_flush(before, after, probe_tokens=tokens)


async def _settled_metrics(adapter: EngineAdapter, session: aiohttp.ClientSession, url: str,
                           before: Metrics, settle_s: float, poll_s: float) -> Metrics:
    """Read /metrics until the queries counter has moved past `before` (engines publish their
    stats a little after the response), at most `settle_s`."""
    loop = asyncio.get_running_loop()
    end = loop.time() + settle_s
    while True:
        m = await fetch_metrics(session, url)
        q0, _ = _read_counters(adapter.metric_names, before)
        q1, _ = _read_counters(adapter.metric_names, m)
        if q0 is None or q1 is None or q1 > q0 or loop.time() >= end:
            return m
        await asyncio.sleep(poll_s)


def mem_fraction_note(engine: str) -> str:
    if engine == "vllm":
        return ("--gpu-memory-utilization is the share of the whole card vLLM may use (weights, "
                "activations, CUDA graphs and KV cache)")
    return ("--mem-fraction-static is the share of the card for weights and KV pool; SGLang "
            "keeps the rest for activations and CUDA graphs")
