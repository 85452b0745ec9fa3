"""vLLM: /reset_prefix_cache (dev mode only, and its 200 proves nothing), vllm:* metrics."""

from __future__ import annotations

import json
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
from chatfleet.engines.prom import Metrics

VLLM_METRICS = MetricNames(
    running=("vllm:num_requests_running",),
    queue=("vllm:num_requests_waiting",),
    # kv_cache_usage_perc since v0.10; gpu_cache_usage_perc before (both 0..1)
    token_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    cache_hit_rate=(),  # none: the hit rate is hits/queries over a window
    # tokens; the deprecated gpu_* pair counted blocks in early V1 releases
    prefix_queries=("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
    prefix_hits=("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
    prompt_tokens=("vllm:prompt_tokens_total",),
    generation_tokens=("vllm:generation_tokens_total",),
    preemptions=("vllm:num_preemptions_total",),
)

VLLM_LOG = {
    "pool_tokens": re.compile(r"GPU KV cache size: ([\d,]+) tokens"),
    "max_concurrency": re.compile(
        r"Maximum concurrency for [\d,]+ tokens per request: ([\d.]+)x"),
    "gpu_memory_utilization": re.compile(r"'gpu_memory_utilization': ([\d.]+)"),
    "gpu_memory_utilization_cfg": re.compile(r"gpu_memory_utilization=([\d.]+)"),
    "non_default_args": re.compile(r"non-default args: (\{.*)"),
    "kv_cache_memory_gib": re.compile(r"Available KV cache memory: ([\d.]+) GiB"),
    "weights_gib": re.compile(r"Model loading took ([\d.]+) GiB"),
    "version": re.compile(r"vLLM API server version (\S+)"),
    "engine_version": re.compile(r"Initializing a V1 LLM engine \(v([^)\s]+)\)"),
    "kv_cache_dtype_arg": re.compile(r"'kv_cache_dtype': '([^']+)'"),
    "kv_cache_dtype_cfg": re.compile(r"kv_cache_dtype=([\w]+)"),
    "quantization_cfg": re.compile(r"quantization=([\w-]+)"),
    "model": re.compile(r"non-default args: \{.*?'model': '([^']+)'"),
    "max_num_seqs": re.compile(r"'max_num_seqs': (\d+)"),
    "max_model_len": re.compile(r"max_seq_len=(\d+)"),
    "prefix_caching": re.compile(r"enable_prefix_caching=(True|False)"),
}
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9


# the simserver's own facts beside vLLM's /server_info (it converts times by time_scale)
SIMSERVER_KEYS = ("time_scale", "gpu", "calibrated", "thermal_model", "engine_model")


def _success_false(body: str) -> bool:
    try:
        doc = json.loads(body)
    except ValueError:
        return False
    return isinstance(doc, dict) and doc.get("success") is False


def _num(v: str | None) -> float | None:
    return float(v.replace(",", "")) if v is not None else None


class VLLMAdapter(EngineAdapter):
    name: ClassVar[str] = "vllm"
    flush_path: ClassVar[str | None] = "/reset_prefix_cache"
    flush_needs_verification: ClassVar[bool] = True
    metric_names: ClassVar[MetricNames] = VLLM_METRICS
    extra_metric_names: ClassVar[tuple[str, ...]] = ("vllm:cache_config_info",)
    cache_report_flag: ClassVar[str | None] = "--enable-prompt-tokens-details"
    log_patterns: ClassVar[Mapping[str, re.Pattern[str]]] = VLLM_LOG
    default_port: ClassVar[int] = 8000

    def flush_answer(self, status: int, body: str) -> FlushResult:
        if status == 200:
            if _success_false(body):
                # 0.26 answers {"success": false} while requests hold KV blocks
                return FlushResult(False, status, "vLLM refused the reset: requests still hold "
                                   "KV blocks (retry once it is idle)")
            return FlushResult(True, status, "vLLM answered 200, which does not prove the "
                               "reset happened: verify it", needs_verification=True)
        if status in (404, 405):
            return FlushResult(False, status, "POST /reset_prefix_cache is not served: start "
                               "vLLM with VLLM_SERVER_DEV_MODE=1")
        return FlushResult(False, status, body or f"HTTP {status}")

    def read_metrics(self, m: Metrics) -> dict[str, float | None]:
        out = super().read_metrics(m)
        # vllm:cache_config_info is an info gauge whose labels hold the cache configuration
        for s in m.samples("vllm:cache_config_info"):
            try:
                blocks = int(s.labels.get("num_gpu_blocks") or 0)
                size = int(s.labels.get("block_size") or 0)
            except ValueError:
                continue
            if blocks and size:
                out["pool_tokens"] = float(blocks * size)
                break
        return out

    async def server_info(self, session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
        info: dict[str, Any] = await super().server_info(session, url)
        ver = await get_json(session, url, "/version")
        if isinstance(ver, dict) and "error" not in ver:
            info["version"] = ver.get("version")
        # /server_info is served in dev mode only, the mode that also serves the flush
        cfg = await get_json(session, url, "/server_info?config_format=json")
        info["dev_mode"] = isinstance(cfg, dict) and "error" not in cfg
        if info["dev_mode"] and isinstance(cfg, dict):
            info["flags"] = self.flags_from_config(cfg.get("vllm_config"))
            cache = info["flags"]
            info["mem_fraction"] = cache.get("gpu_memory_utilization")
            info["reports_cached_tokens"] = None  # a front-end flag: not in vllm_config
            for key in SIMSERVER_KEYS:
                if key in cfg:
                    info[key] = cfg[key]
        return info

    @staticmethod
    def flags_from_config(cfg: Any) -> dict[str, Any]:
        if not isinstance(cfg, dict):
            return {}
        out: dict[str, Any] = {}
        picks = {
            "cache_config": ("gpu_memory_utilization", "cache_dtype", "block_size",
                             "num_gpu_blocks", "enable_prefix_caching",
                             "prefix_caching_hash_algo", "kv_cache_memory_bytes"),
            "scheduler_config": ("max_num_seqs", "max_num_batched_tokens",
                                 "enable_chunked_prefill", "policy"),
            "model_config": ("model", "max_model_len", "dtype", "quantization",
                             "served_model_name"),
            "parallel_config": ("tensor_parallel_size", "data_parallel_size"),
        }
        for section, keys in picks.items():
            sec = cfg.get(section)
            if isinstance(sec, dict):
                for k in keys:
                    if k in sec:
                        out[k] = sec[k]
        return out

    def log_facts(self, raw: Mapping[str, str]) -> dict[str, Any]:
        mem = _num(raw.get("gpu_memory_utilization")) or _num(
            raw.get("gpu_memory_utilization_cfg"))
        source = "log" if mem is not None else None
        if mem is None and raw.get("non_default_args") is not None:
            mem, source = DEFAULT_GPU_MEMORY_UTILIZATION, "default"  # not among the non-defaults
        pool = _num(raw.get("pool_tokens"))
        seqs = raw.get("max_num_seqs")
        return {
            "pool_tokens": int(pool) if pool is not None else None,
            "mem_fraction": mem,
            "mem_fraction_flag": "--gpu-memory-utilization",
            "mem_fraction_source": source,
            "max_concurrency": _num(raw.get("max_concurrency")),
            "kv_cache_memory_gib": _num(raw.get("kv_cache_memory_gib")),
            "weights_gib": _num(raw.get("weights_gib")),
            "version": raw.get("version") or raw.get("engine_version"),
            "kv_cache_dtype": raw.get("kv_cache_dtype_arg") or raw.get("kv_cache_dtype_cfg"),
            "quantization": (None if raw.get("quantization_cfg") in (None, "None")
                             else raw.get("quantization_cfg")),
            "model": raw.get("model"),
            "max_num_seqs": int(seqs) if seqs is not None else None,
            "max_model_len": int(raw["max_model_len"]) if "max_model_len" in raw else None,
            "prefix_caching": (raw["prefix_caching"] == "True"
                               if "prefix_caching" in raw else None),
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
        argv = ["vllm", "serve", model_path, "--host", host,
                "--port", str(port or self.default_port)]
        notes = [mem_fraction_note("vllm"),
                 "VLLM_SERVER_DEV_MODE=1 serves POST /reset_prefix_cache (and other development "
                 "endpoints: keep the port private)"]
        if p.weights == "fp8" and "fp8" not in model_path.lower():
            argv += ["--quantization", "fp8"]
            notes.append("FP8 weights from a BF16 checkpoint: quantized at load time")
        if p.kv_cache == "fp8":
            argv += ["--kv-cache-dtype", "fp8"]
            notes.append("FP8 KV cache: check the log for 'Using KV cache scaling factor 1.0'")
        argv += optional_flags(("--gpu-memory-utilization", mem_fraction),
                               ("--max-num-seqs", max_running_requests),
                               ("--max-model-len", context_length),
                               ("--max-num-batched-tokens", chunked_prefill_size),
                               ("--served-model-name", served_model_name))
        argv += ["--enable-prefix-caching", "--enable-prompt-tokens-details", *extra]
        return LaunchCommand(argv, {"VLLM_SERVER_DEV_MODE": "1"}, notes)
