"""SGLang: /flush_cache (400 while requests run), sglang:* metrics, /get_server_info."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import aiohttp

from chatfleet.core.specs import Precision
from chatfleet.engines.base import (
    EngineAdapter,
    FlushResult,
    LaunchCommand,
    MetricNames,
    as_precision,
    check_launch_args,
    get_json,
    mem_fraction_note,
    optional_flags,
)

SGLANG_METRICS = MetricNames(
    running=("sglang:num_running_reqs",),
    queue=("sglang:num_queue_reqs",),
    token_usage=("sglang:token_usage",),
    cache_hit_rate=("sglang:cache_hit_rate",),
    # the tokenizer manager counts both when a request finishes
    prefix_queries=("sglang:prompt_tokens_total",),
    prefix_hits=("sglang:cached_tokens_total",),
    prompt_tokens=("sglang:prompt_tokens_total",),
    generation_tokens=("sglang:generation_tokens_total",),
    preemptions=("sglang:num_retracted_reqs", "sglang:num_retracted_requests_total"),
    pool_tokens=("sglang:max_total_num_tokens",),
)

# server arguments worth keeping in the results (the `target` block)
FLAG_KEYS = (
    "model_path", "served_model_name", "dtype", "quantization", "kv_cache_dtype",
    "mem_fraction_static", "max_running_requests", "max_total_tokens", "chunked_prefill_size",
    "max_prefill_tokens", "schedule_policy", "schedule_conservativeness",
    "radix_eviction_policy", "page_size", "context_length", "enable_cache_report",
    "enable_metrics", "disable_radix_cache", "enable_hierarchical_cache", "hicache_ratio",
    "hicache_size", "hicache_write_policy", "cuda_graph_max_bs", "disable_cuda_graph",
    "attention_backend", "tp_size", "dp_size", "decode_log_interval", "enable_mixed_chunk",
)

PASSTHROUGH_KEYS = ("time_scale", "gpu", "calibrated", "thermal_model", "hicache_size_tokens")

SGLANG_LOG = {
    "pool_tokens": re.compile(r"max_total_num_tokens=(\d+)"),
    "kv_allocated_tokens": re.compile(r"KV Cache is allocated\. #tokens: (\d+)"),
    "kv_k_size_gb": re.compile(r"KV Cache is allocated\. #tokens: \d+, K size: ([\d.]+) GB"),
    "mem_fraction": re.compile(r"mem_fraction_static=([\d.]+)"),
    "kv_cache_dtype": re.compile(r"kv_cache_dtype='([^']+)'"),
    "quantization": re.compile(r"[(, ]quantization='?(\w+)"),
    "model_path": re.compile(r"model_path='([^']+)'"),
    "chunked_prefill_size": re.compile(r"chunked_prefill_size=(-?\d+)"),
    "max_running_requests": re.compile(r"max_running_requests=(\d+)"),
    "context_len": re.compile(r"context_len=(\d+)"),
    "available_gpu_mem_gb": re.compile(r"available_gpu_mem=([\d.]+) GB"),
    "weights_mem_gb": re.compile(r"Load weight end\..*?mem usage=([\d.]+) GB"),
    "cuda_graph_bs": re.compile(r"Capture cuda graph bs (\[[\d, ]*\])"),
    "ready": re.compile(r"(The server is fired up and ready to roll!)"),
}


def _int(v: str | None) -> int | None:
    return int(v) if v is not None else None


def _float(v: str | None) -> float | None:
    return float(v) if v is not None else None


class SGLangAdapter(EngineAdapter):
    name: ClassVar[str] = "sglang"
    flush_path: ClassVar[str | None] = "/flush_cache"
    flush_needs_verification: ClassVar[bool] = False
    metric_names: ClassVar[MetricNames] = SGLANG_METRICS
    cache_report_flag: ClassVar[str | None] = "--enable-cache-report"
    log_patterns: ClassVar[Mapping[str, re.Pattern[str]]] = SGLANG_LOG
    default_port: ClassVar[int] = 30000

    def flush_answer(self, status: int, body: str) -> FlushResult:
        if status == 200:
            return FlushResult(True, status, body or "Cache flushed.")
        if status == 400:
            return FlushResult(False, status, "the engine refused to flush: requests are "
                               f"running or waiting ({body[:200]})")
        return FlushResult(False, status, body or f"HTTP {status}")

    async def server_info(self, session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
        doc = await get_json(session, url, "/get_server_info")
        if isinstance(doc, dict) and doc.get("status") == 404:
            doc = await get_json(session, url, "/server_info")  # newer name
        info: dict[str, Any] = {"engine": self.name}
        if not isinstance(doc, dict) or "error" in doc:
            info["error"] = doc.get("error") if isinstance(doc, dict) else "not a JSON object"
            return info
        return self.summarize_server_info(doc)

    def summarize_server_info(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        info: dict[str, Any] = {"engine": str(doc.get("engine") or self.name),
                                "version": doc.get("version")}
        flags = {k: doc[k] for k in FLAG_KEYS if k in doc}
        info["flags"] = flags
        pool = doc.get("max_total_num_tokens")
        states = doc.get("internal_states")
        if pool is None and isinstance(states, list) and states and isinstance(states[0], dict):
            mem = states[0].get("memory_usage")
            if isinstance(mem, dict):
                pool = mem.get("token_capacity")
        info["max_total_num_tokens"] = pool
        info["mem_fraction"] = doc.get("mem_fraction_static")
        info["reports_cached_tokens"] = doc.get("enable_cache_report")
        for key in PASSTHROUGH_KEYS:  # the simserver's own facts (time_scale converts times)
            if key in doc:
                info[key] = doc[key]
        return info

    def log_facts(self, raw: Mapping[str, str]) -> dict[str, Any]:
        pool = _int(raw.get("pool_tokens")) or _int(raw.get("kv_allocated_tokens"))
        quant = raw.get("quantization")
        return {
            "pool_tokens": pool,
            "mem_fraction": _float(raw.get("mem_fraction")),
            "mem_fraction_flag": "--mem-fraction-static",
            "kv_cache_dtype": raw.get("kv_cache_dtype"),
            "quantization": None if quant in (None, "None") else quant,
            "model_path": raw.get("model_path"),
            "chunked_prefill_size": _int(raw.get("chunked_prefill_size")),
            "max_running_requests": _int(raw.get("max_running_requests")),
            "context_len": _int(raw.get("context_len")),
            "weights_mem_gb": _float(raw.get("weights_mem_gb")),
            "kv_k_size_gb": _float(raw.get("kv_k_size_gb")),
            "available_gpu_mem_gb": _float(raw.get("available_gpu_mem_gb")),
            "cuda_graph_bs": raw.get("cuda_graph_bs"),
            "ready": raw.get("ready") is not None,
        }

    def launch_command(self, model_path: str, prec: Precision | str | tuple[str, str],
                       mem_fraction: float | None = None,
                       max_running_requests: int | None = None, *,
                       host: str = "127.0.0.1", port: int | None = None,
                       context_length: int | None = None,
                       chunked_prefill_size: int | None = None,
                       served_model_name: str | None = None,
                       extra: Sequence[str] = ()) -> LaunchCommand:
        p = as_precision(prec)
        check_launch_args(mem_fraction, max_running_requests)
        argv = ["python", "-m", "sglang.launch_server", "--model-path", model_path,
                "--host", host, "--port", str(port or self.default_port)]
        notes = [mem_fraction_note("sglang")]
        if p.weights == "fp8" and "fp8" not in model_path.lower():
            argv += ["--quantization", "fp8"]
            notes.append("FP8 weights from a BF16 checkpoint: quantized at load time; an FP8 "
                         "checkpoint (e.g. Qwen/Qwen3-8B-FP8) needs no --quantization")
        if p.kv_cache == "fp8":
            argv += ["--kv-cache-dtype", "fp8_e4m3"]
            notes.append("FP8 KV cache: check the log for the scale-1.0 fallback warning")
        argv += optional_flags(("--mem-fraction-static", mem_fraction),
                               ("--max-running-requests", max_running_requests),
                               ("--context-length", context_length),
                               ("--chunked-prefill-size", chunked_prefill_size),
                               ("--served-model-name", served_model_name))
        argv += ["--enable-metrics", "--enable-cache-report", *extra]
        return LaunchCommand(argv, {}, notes)
