"""The interface every engine model offers to the shells that drive it: the twin's event loop
(twin/run.py, twin/fleet.py) and the simserver (simserver/replica.py), in two parts: what
drives it (EngineControls) and what it reports (EngineReadings). Two models implement it on
one lifecycle (base_scheduler.BaseScheduler): SGLang v0.5's prefill-first scheduler
(scheduler.Scheduler) and vLLM 0.26's token-budget scheduler (vllm_scheduler.VLLMScheduler);
build.build_engine picks one from the spec.

A shell's loop, in any clock:

    engine.add_request(req, now)            # or abort(rid) at any time
    step = engine.schedule(now, horizon)    # None: nothing to run now
    ... wait until step.end ...             # truncate_decode_run(t) if a request arrived
    result = engine.complete(step.end)      # first tokens, finished, retracted/preempted
    engine.token_times(req)                 # every output token's time, once it finished
"""

from __future__ import annotations

from array import array
from typing import Protocol

from chatfleet.core.engine.request import EngineRequest
from chatfleet.core.engine.step import Step, StepResult
from chatfleet.core.engine.steplog import StepLog
from chatfleet.core.engine.thermal import ThermalState


class PricesSteps(Protocol):
    """What a shell asks of an engine's step-time model (the gateway prices a spill with it)."""

    def recompute_s(self, tokens: int) -> float: ...


class EngineControls(Protocol):
    """What drives an engine: requests in and out, and the step loop (the twin's events,
    the simserver's replica)."""

    in_flight: Step | None  # the step running now

    def check_request(self, prompt_len: int, max_new_tokens: int) -> str | None: ...

    def max_new_tokens_room(self, prompt_len: int) -> int: ...  # the most check_request takes

    def add_request(self, req: EngineRequest, now: float) -> None: ...

    def abort(self, rid: str) -> EngineRequest | None: ...

    def flush(self) -> bool: ...

    def has_work(self) -> bool: ...

    def schedule(self, now: float, horizon: float | None = None) -> Step | None: ...

    def truncate_decode_run(self, t: float) -> float | None: ...

    # when a waiting request becomes schedulable (vLLM's API-server hand-over); an idle shell
    # whose schedule() gave None calls schedule again then
    def next_ready_time(self) -> float | None: ...

    def advance_idle(self, now: float) -> None: ...

    def complete(self, now: float) -> StepResult: ...


class EngineReadings(Protocol):
    """What an engine reports: who got tokens and when, and its gauges and counters (the
    twin's point blocks, the simserver's /metrics and server info)."""

    engine_name: str  # "sglang" or "vllm"
    thermal: ThermalState | None
    log: StepLog  # one entry per step (a decode run leaves one per step it ran)
    num_prefill_input_tokens: int  # prompt tokens at first admission, since the start
    num_prefill_cached_tokens: int  # of those, found in the prefix cache
    num_retractions: int  # SGLang retractions, vLLM preemptions

    @property
    def step_model(self) -> PricesSteps: ...

    @property
    def capacity_tokens(self) -> int: ...  # the KV pool, as the engine reports it

    @property
    def context_length(self) -> int: ...

    @property
    def num_evicted_tokens(self) -> int: ...

    def num_running(self) -> int: ...

    def num_queued(self) -> int: ...

    def num_used_tokens(self) -> int: ...

    def token_usage(self) -> float: ...

    def prefix_cache_counters(self) -> tuple[int, int]: ...  # (tokens looked up, found)

    def step_tokens(self, result: StepResult) -> list[EngineRequest]: ...

    def decoding_requests(self) -> list[EngineRequest]: ...

    def token_times(self, req: EngineRequest) -> array[float]: ...


class EngineModel(EngineControls, EngineReadings, Protocol):
    """Both: what build_engine returns and a shell holds."""
