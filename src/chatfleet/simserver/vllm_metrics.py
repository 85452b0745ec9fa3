"""/metrics in vLLM 0.26's Prometheus names (vllm/v1/metrics/loggers.py), for a simserver
replica running the vLLM engine model: labels `model_name` and `engine` ("0"), gauges set after
every step as vLLM's PrometheusStatLogger sets them from each step's scheduler stats, counters
in tokens. `vllm:prefix_cache_queries` / `_hits` count every cache lookup of a request that was
never preempted, a retried one included (KVCacheManager.get_computed_blocks records one per
call). Times are model seconds.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from chatfleet.core.engine.protocol import EngineReadings
from chatfleet.core.engine.request import EngineRequest
from chatfleet.core.engine.step import Step, StepResult
from chatfleet.simserver.metrics import LATENCY_BUCKETS, TPOT_BUCKETS

ENGINE_INDEX = "0"


class VLLMReplicaMetrics:
    def __init__(self, model_name: str, cache_info: dict[str, str] | None = None) -> None:
        """`cache_info`: the labels of vllm:cache_config_info (block_size, num_gpu_blocks,
        gpu_memory_utilization, cache_dtype)."""
        self.cache_info = dict(cache_info or {})
        r = self.registry = CollectorRegistry()
        lbl = ["model_name", "engine"]
        self.model_name = model_name
        values = (model_name, ENGINE_INDEX)

        def gauge(name: str, doc: str) -> Any:
            return Gauge(f"vllm:{name}", doc, lbl, registry=r).labels(*values)

        def counter(name: str, doc: str) -> Any:
            return Counter(f"vllm:{name}", doc, lbl, registry=r).labels(*values)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Any:
            return Histogram(f"vllm:{name}", doc, lbl, buckets=buckets,
                             registry=r).labels(*values)

        self.num_running = gauge("num_requests_running",
                                 "Number of requests in model execution batches.")
        self.num_waiting = gauge("num_requests_waiting",
                                 "Number of requests waiting to be processed.")
        self.kv_usage = gauge("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.prefix_queries = counter("prefix_cache_queries",
                                      "Prefix cache queries, in terms of number of queried tokens.")
        self.prefix_hits = counter("prefix_cache_hits",
                                   "Prefix cache hits, in terms of number of cached tokens.")
        self.num_preemptions = counter("num_preemptions",
                                       "Cumulative number of preemption from the engine.")
        self.prompt_tokens = counter("prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("generation_tokens",
                                         "Number of generation tokens processed.")
        self._success = Counter("vllm:request_success", "Count of successfully processed "
                                "requests.", [*lbl, "finished_reason"], registry=r)
        self.ttft = histogram("time_to_first_token_seconds",
                              "Histogram of time to first token in seconds.", LATENCY_BUCKETS)
        self.tpot = histogram("request_time_per_output_token_seconds",
                              "Histogram of time_per_output_token_seconds per request.",
                              TPOT_BUCKETS)
        self.e2e = histogram("e2e_request_latency_seconds",
                             "Histogram of e2e request latency in seconds.", LATENCY_BUCKETS)
        self._cache_info = Gauge("vllm:cache_config_info",
                                 "Information of the LLMEngine CacheConfig",
                                 ["block_size", "num_gpu_blocks", "enable_prefix_caching",
                                  "gpu_memory_utilization", "cache_dtype", "engine"],
                                 registry=r)
        self._seen = (0, 0)  # prefix counters already published

    def on_start(self, sched: EngineReadings) -> None:
        info = self.cache_info
        block = int(info.get("block_size", "16"))
        self._cache_info.labels(str(block), info.get("num_gpu_blocks",
                                                     str(sched.capacity_tokens // block)),
                                "True", info.get("gpu_memory_utilization", ""),
                                info.get("cache_dtype", "auto"), ENGINE_INDEX).set(1)

    def on_arrival(self, prompt_tokens: int) -> None:
        pass  # vLLM counts prompt tokens as their prefill completes (on_step)

    def on_token(self) -> None:
        self.generation_tokens.inc()

    def on_abort(self) -> None:
        self._success.labels(self.model_name, ENGINE_INDEX, "abort").inc()

    def on_flush(self, sched: EngineReadings) -> None:
        pass  # the counters keep counting across a reset, as vLLM's do

    def _publish(self, sched: EngineReadings) -> None:
        self.num_running.set(sched.num_running())
        self.num_waiting.set(sched.num_queued())
        self.kv_usage.set(sched.token_usage())
        queries, hits = sched.prefix_cache_counters()
        dq, dh = queries - self._seen[0], hits - self._seen[1]
        if dq > 0:
            self.prefix_queries.inc(dq)
        if dh > 0:
            self.prefix_hits.inc(dh)
        self._seen = (queries, hits)

    def on_idle(self, sched: EngineReadings) -> None:
        self._publish(sched)

    def on_step(self, sched: EngineReadings, step: Step, result: StepResult) -> None:
        self._publish(sched)
        for req in result.first_tokens:
            if req.num_retractions == 0 and len(req.segments) == 1:
                self.prompt_tokens.inc(req.prompt_len)
        if result.retracted:
            self.num_preemptions.inc(len(result.retracted))

    def on_finish(self, h: Any, req: EngineRequest, replica: Any) -> None:
        reason = "length" if getattr(h, "finish_reason", None) == "length" else "stop"
        self._success.labels(self.model_name, ENGINE_INDEX, reason).inc()
        if req.first_token_time is not None and req.finish_time is not None:
            self.ttft.observe(req.first_token_time - req.arrival_time)
            self.e2e.observe(req.finish_time - req.arrival_time)
            if req.output_len > 1:
                self.tpot.observe((req.finish_time - req.first_token_time)
                                  / (req.output_len - 1))

    def render(self) -> bytes:
        return generate_latest(self.registry)
