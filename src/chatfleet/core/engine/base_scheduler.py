"""The lifecycle both engine models share (as Vidur's BaseReplicaScheduler is its schedulers'):
a request's way in, the step in flight, the token clock, first tokens, finishes, re-queueing
after a retraction, the thermal state between and along steps, and each request's token times.

What an engine decides is left to it (scheduler.py: SGLang v0.5, prefill first, retraction by
output so far, the radix tree; vllm_scheduler.py: vLLM 0.26, a token budget, preemption of the
newest, the block prefix cache), through these methods:

- `_next_step(now, horizon)`: what the next step takes (None: nothing to run now);
- `_apply(step, now, result, thermal)`: the step's effects at its end;
- `_enqueue(req, now)`: where a new request waits;
- `_pool_refusal(prompt_len, max_new_tokens)`: why a request can never fit its KV;
- `_prefill_share(step)`: what the thermal model is told of a step's mix;
- `_step_ended(step, now)`: anything else a step's end tells it (vLLM's hand-over);
- and the containers and gauges of protocol.EngineReadings.

The token clock: `num_steps` counts the steps at whose end every decoding request gets a token
(SGLang's decode steps; every vLLM step), `step_end_times` holds their end times. A decoding
request's tokens are the clock's ticks from the step it joined (`EngineRequest.join_step`), so
decodes cost O(1) per step; the finish heap says at which tick each one samples its last.
"""

from __future__ import annotations

import bisect
import heapq
from array import array

from chatfleet.core.engine.decode_run import advance_thermal
from chatfleet.core.engine.request import EngineRequest, Segment, as_tokens
from chatfleet.core.engine.step import Step, StepResult
from chatfleet.core.engine.steplog import NO_THERMAL, StepLog, ThermalFigures
from chatfleet.core.engine.thermal import ThermalState

# A finish heap entry, built in `_start_decoding` alone (a plain tuple: chatfleet/_native.py
# says why): (the step whose end gives its last token, a tie-breaking sequence number, the
# step it joined at, the request). An entry whose request left decoding since is stale.
FinishEntry = tuple[int, int, int, EngineRequest]


class BaseScheduler:
    engine_name = "base"
    context_name = "context length"  # what the engine calls its context limit in messages

    def __init__(self, thermal: ThermalState | None) -> None:
        self.thermal = thermal
        self.in_flight: Step | None = None
        self.log = StepLog()
        self.num_steps = 0  # steps completed on the token clock (the module docstring)
        self.step_end_times = array("d")  # their end times
        self.num_prefill_input_tokens = 0  # prompt tokens at first admission
        self.num_prefill_cached_tokens = 0  # of those, found in the prefix cache
        self.num_retractions = 0  # SGLang retractions, vLLM preemptions
        self._finish_heap: list[FinishEntry] = []
        self._finish_seq = 0
        self._retracted: list[EngineRequest] = []  # re-queued since the last step's end
        self._busy_until = 0.0  # the thermal state has moved up to here

    # --- what each engine decides ---------------------------------------------------------
    def _next_step(self, now: float, horizon: float | None) -> Step | None:
        raise NotImplementedError

    def _apply(self, step: Step, now: float, result: StepResult,
               thermal: list[ThermalFigures]) -> None:
        raise NotImplementedError

    def _enqueue(self, req: EngineRequest, now: float) -> None:
        raise NotImplementedError

    def _pool_refusal(self, prompt_len: int, max_new_tokens: int) -> str | None:
        raise NotImplementedError

    def _prefill_share(self, step: Step) -> float | None:
        return None

    def _step_ended(self, step: Step, now: float) -> None:
        return None

    def is_running(self, rid: str) -> bool:
        raise NotImplementedError

    @property
    def context_length(self) -> int:
        raise NotImplementedError

    # --- requests in ----------------------------------------------------------------------
    def check_request(self, prompt_len: int, max_new_tokens: int) -> str | None:
        """Why this request can never run here, or None."""
        if prompt_len <= 0:
            return "the prompt is empty"
        if max_new_tokens <= 0:
            return "max_new_tokens must be positive"
        if prompt_len + max_new_tokens > self.context_length:
            return (f"prompt ({prompt_len}) plus max_new_tokens ({max_new_tokens}) exceeds the "
                    f"{self.context_name} ({self.context_length})")
        return self._pool_refusal(prompt_len, max_new_tokens)

    def add_request(self, req: EngineRequest, now: float) -> None:
        why = self.check_request(req.prompt_len, req.max_new_tokens)
        if why is not None:
            raise ValueError(why)
        if req.output_len < 1 or req.output_len > req.max_new_tokens:
            raise ValueError("output_ids must hold between 1 and max_new_tokens tokens")
        if self.is_running(req.rid):
            raise ValueError(f"request id {req.rid!r} is already running")
        req.arrival_time = now
        req.state = "waiting"
        req.prompt = as_tokens(req.prompt)
        req.output_ids = as_tokens(req.output_ids)
        req.fill = req.prompt
        self._enqueue(req, now)

    # --- the step in flight -----------------------------------------------------------------
    def schedule(self, now: float, horizon: float | None = None) -> Step | None:
        """Choose the next step, reserve its KV, and return it with its modelled duration.

        With a `horizon` (a virtual-time loop's stop time), a decode step may be extended into
        a run of consecutive decode steps, up to the first request that finishes or the last
        step that ends by the horizon, while nothing inside the engine can change between
        them; when something arrives from outside, the loop calls `truncate_decode_run`, so
        the run gives what single steps give (decode_run.py). Without a horizon (a live
        server) every step is its own."""
        if self.in_flight is not None:
            raise RuntimeError("a step is already running")
        self.advance_idle(now)
        step = self._next_step(now, horizon)
        if step is not None:
            self.in_flight = step
        return step

    def truncate_decode_run(self, t: float) -> float | None:
        """Something arrived at `t` during a decode run: cut the run after the step running at
        `t`, as single steps would have let the scheduler look again there. Returns the run's
        new end, or None when nothing changed."""
        step = self.in_flight
        if step is None or len(step.decode_ends) <= 1:
            return None
        ends = step.decode_ends
        keep = bisect.bisect_left(ends, t) + 1
        if keep >= len(ends):
            return None
        del ends[keep:]
        step.duration = ends[-1] - step.start
        step.end = ends[-1]  # to the bit, as single steps end (start + duration may miss it)
        return ends[-1]

    def advance_idle(self, now: float) -> None:
        """Let an idle card cool until `now` (the thermal model moves only with steps)."""
        if self.thermal is not None and self.in_flight is None and now > self._busy_until:
            self.thermal.advance(now - self._busy_until, 0.0)
            self._busy_until = now

    def next_ready_time(self) -> float | None:
        """When a waiting request the engine does not see yet becomes schedulable (an idle
        shell whose schedule() gave None calls it again then); None: no wake-up is needed."""
        return None

    def complete(self, now: float) -> StepResult:
        """Apply the in-flight step's effects at its end time `now`."""
        step = self.in_flight
        if step is None:
            raise RuntimeError("no step is running")
        self.in_flight = None
        self._step_ended(step, now)
        if self.thermal is not None:
            thermal = advance_thermal(self.thermal, step, now, self._prefill_share(step))
            self._busy_until = now
        else:
            thermal = [NO_THERMAL] * max(1, len(step.decode_ends))
        result = StepResult(step)
        self._apply(step, now, result, thermal)
        result.retracted = self._retracted
        self._retracted = []
        return result

    def _clock_factors(self) -> tuple[float, float]:
        """The thermal state's slowdowns of compute and memory (1.0 without it)."""
        if self.thermal is None:
            return 1.0, 1.0
        return self.thermal.sm_factor, self.thermal.mem_factor

    # --- the token clock, first tokens and finishes ------------------------------------------
    def _count_steps(self, step: Step) -> None:
        """The step's ticks join the token clock (a prefill-only SGLang step has none)."""
        self.num_steps += len(step.decode_ends)
        self.step_end_times.extend(step.decode_ends)

    def _first_token(self, req: EngineRequest, now: float, result: StepResult) -> None:
        """Its prefill completed at `now` and sampled a token: a new segment of its tokens."""
        req.segments.append(Segment(now, self.num_steps))
        if req.first_token_time is None:
            req.first_token_time = now
        result.first_tokens.append(req)

    def _start_decoding(self, req: EngineRequest) -> None:
        """It decodes from the next tick on; `req.gen_base` tokens are sampled already."""
        req.state = "running"
        req.join_step = self.num_steps
        self._finish_seq += 1
        heapq.heappush(self._finish_heap, (req.join_step + req.output_len - req.gen_base - 1,
                                           self._finish_seq, req.join_step, req))

    def _next_finish_step(self) -> int:
        """The tick of the first finish in the heap (stale entries included: a run ends there
        at the latest); the heap holds an entry while anything decodes."""
        return self._finish_heap[0][0]

    def _has_finish_ahead(self) -> bool:
        return bool(self._finish_heap)

    def _pop_finished(self) -> EngineRequest | None:
        """The next decoding request whose last token came at the last tick (None: no more);
        the engine finishes it before asking for the next."""
        last = self.num_steps - 1
        heap = self._finish_heap
        while heap and heap[0][0] <= last:
            _, _, join, req = heapq.heappop(heap)
            if req.state == "running" and req.join_step == join:
                return req
            # else stale: retracted, preempted or aborted since
        return None

    def _finished(self, req: EngineRequest, now: float, result: StepResult) -> None:
        req.state = "finished"
        req.finish_time = now
        result.finished.append(req)

    def _requeue(self, req: EngineRequest, generated: int) -> None:
        """Retracted (SGLang) or preempted (vLLM) with `generated` tokens sampled: it waits to
        be prefilled again with its outputs so far and loses nothing else (the engine puts it
        in its queue; the step's result reports it)."""
        req.close_segment(self.num_steps)
        req.state = "waiting"
        req.fill = as_tokens(req.prompt) + as_tokens(req.output_ids)[:generated]
        req.gen_base = generated
        req.num_computed = 0
        req.num_retractions += 1
        self.num_retractions += 1
        self._retracted.append(req)

    def _hit_rate(self) -> float:
        """Prompt tokens found in the prefix cache at first admission, since the start."""
        return (self.num_prefill_cached_tokens / self.num_prefill_input_tokens
                if self.num_prefill_input_tokens else 0.0)

    # --- results ---------------------------------------------------------------------------
    def token_times(self, req: EngineRequest) -> array[float]:
        """Every output token's emission time (first included), from the token clock."""
        return req.token_times(self.step_end_times, self.num_steps)

