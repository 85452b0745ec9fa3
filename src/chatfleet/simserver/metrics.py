"""/metrics in SGLang's Prometheus names (sglang:*), one registry per replica (vllm_metrics.py
has vLLM's; both offer the same methods to the replica).

Gauges are refreshed at every step (SGLang refreshes its own every 40 decode steps, so a live
SGLang reading can lag behind what this one shows). Times are model seconds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from chatfleet.core.engine.protocol import EngineReadings
from chatfleet.core.engine.step import Step, StepResult

if TYPE_CHECKING:
    from chatfleet.core.engine.request import EngineRequest

LATENCY_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 20.0, 60.0)
TPOT_BUCKETS = (0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.08, 0.1, 0.125, 0.15, 0.2, 0.3, 0.5, 1.0)


class ReplicaMetrics:
    def __init__(self, model_name: str) -> None:
        r = self.registry = CollectorRegistry()
        lbl = ["model_name"]
        self.model_name = model_name

        def gauge(name: str, doc: str) -> Any:
            return Gauge(f"sglang:{name}", doc, lbl, registry=r).labels(model_name)

        def counter(name: str, doc: str) -> Any:
            return Counter(f"sglang:{name}", doc, lbl, registry=r).labels(model_name)

        self.num_running = gauge("num_running_reqs", "Requests in the running batch")
        self.num_queue = gauge("num_queue_reqs", "Requests waiting")
        self.token_usage = gauge("token_usage", "KV pool usage (used - evictable) / pool")
        self.num_used_tokens = gauge("num_used_tokens", "KV slots in use")
        self.max_total_num_tokens = gauge("max_total_num_tokens", "KV pool size in tokens")
        self.cache_hit_rate = gauge("cache_hit_rate", "Prefix cache hit rate since the flush")
        self.gen_throughput = gauge("gen_throughput", "Generation throughput, tokens/s")
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens")
        self.generation_tokens = counter("generation_tokens", "Generated tokens")
        self.cached_tokens = counter("cached_tokens", "Prompt tokens found in the cache")
        self.num_requests = counter("num_requests", "Finished requests")
        self.num_aborted = counter("num_aborted_requests", "Aborted requests")
        self.num_retractions = counter("num_retracted_requests", "Retractions")
        self.ttft = Histogram("sglang:time_to_first_token_seconds", "TTFT", lbl,
                              buckets=LATENCY_BUCKETS, registry=r).labels(model_name)
        self.tpot = Histogram("sglang:time_per_output_token_seconds", "TPOT", lbl,
                              buckets=TPOT_BUCKETS, registry=r).labels(model_name)
        self.e2e = Histogram("sglang:e2e_request_latency_seconds", "End to end", lbl,
                             buckets=LATENCY_BUCKETS, registry=r).labels(model_name)
        self._window: list[tuple[float, int]] = []  # (time, decode tokens) of recent steps
        self._base = (0, 0)  # cached and prompt tokens at the last flush

    def on_start(self, sched: EngineReadings) -> None:
        self.max_total_num_tokens.set(sched.capacity_tokens)

    def on_arrival(self, prompt_tokens: int) -> None:
        self.prompt_tokens.inc(prompt_tokens)

    def on_token(self) -> None:
        self.generation_tokens.inc()

    def on_abort(self) -> None:
        self.num_aborted.inc()

    def on_flush(self, sched: EngineReadings) -> None:
        """The hit rate restarts at a flush: later readings count from here."""
        self._base = (sched.num_prefill_cached_tokens, sched.num_prefill_input_tokens)
        self.cache_hit_rate.set(0.0)

    def on_idle(self, sched: EngineReadings) -> None:
        """Nothing is stepping (idle, or after an abort): the gauges show the engine as is."""
        self.num_running.set(sched.num_running())
        self.num_queue.set(sched.num_queued())
        self.num_used_tokens.set(sched.num_used_tokens())

    def on_step(self, sched: EngineReadings, step: Step, result: StepResult) -> None:
        row = sched.log[-1]
        if step.kind == "decode":
            # read at decode steps, as SGLang's decode log: the batch, and the queue that
            # prefill-first could not admit
            self.num_running.set(row.batch)
            self.num_queue.set(row.queue)
        self.token_usage.set(row.token_usage)
        self.num_used_tokens.set(sched.num_used_tokens())
        if result.retracted:
            self.num_retractions.inc(len(result.retracted))
        cached = sched.num_prefill_cached_tokens - self._base[0]
        prompt = sched.num_prefill_input_tokens - self._base[1]
        if prompt > 0:
            self.cache_hit_rate.set(cached / prompt)
        if step.kind == "decode":
            self._window.append((step.end, step.num_decode))
            if len(self._window) > 40:
                del self._window[0]
            span = self._window[-1][0] - self._window[0][0]
            if span > 0:
                self.gen_throughput.set(sum(n for _, n in self._window[1:]) / span)

    def on_finish(self, h: Any, req: EngineRequest, replica: Any) -> None:
        self.num_requests.inc()
        self.cached_tokens.inc(req.num_cached_tokens)
        if req.first_token_time is not None and req.finish_time is not None:
            ttft = req.first_token_time - req.arrival_time
            self.ttft.observe(ttft)
            self.e2e.observe(req.finish_time - req.arrival_time)
            if req.output_len > 1:
                self.tpot.observe((req.finish_time - req.first_token_time)
                                  / (req.output_len - 1))

    def render(self) -> bytes:
        return generate_latest(self.registry)
