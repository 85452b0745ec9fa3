"""How a request reaches vLLM's engine core: its API server, then its scheduling loop.

- **The API server** prepares a request (chat template, tokenization) one after another:
  `frontend_s` of its time per request, serial, then `frontend_delay_s` of latency that
  requests do not queue for (the hop to the engine core and the first token's way back). A
  request is *ready* at the end of both (`ready_time`).
- **Async scheduling** (vLLM 0.26's default; "Asynchronous scheduling is enabled" in its log):
  the engine core schedules step k+1 once its host has done its part of step k (scheduling,
  input preparation, the kernel launches: MixedStepModel.host_s), while the GPU may still run
  it. A request ready after that joins step k+2 at the earliest (`cutoff`). When the host's
  part is the whole step (eager mode at small batches) nothing changes; when the GPU's outlasts
  it, an arrival can wait up to that much longer. An idle engine schedules an arrival at once.
  A request that finishes in step k still holds a slot in step k+1 there: left out.
"""

from __future__ import annotations


class HandOver:
    def __init__(self, frontend_s: float, frontend_delay_s: float,
                 async_scheduling: bool) -> None:
        self.frontend_s = frontend_s
        self.frontend_delay_s = frontend_delay_s
        self.async_scheduling = async_scheduling
        self._frontend_free = 0.0  # when the API server is done with what it was given
        self._host_done = 0.0  # when the host was done with the step that ended last
        self._last_step_end = -1.0

    def ready_time(self, now: float) -> float:
        """A request arriving at `now` reaches the engine core at the returned time."""
        served = max(now, self._frontend_free) + self.frontend_s
        self._frontend_free = served
        return served + self.frontend_delay_s

    def step_done(self, host_done: float, end: float) -> None:
        """A step ended at `end`; its host's part was done at `host_done`."""
        self._host_done = host_done
        self._last_step_end = end

    def cutoff(self, now: float) -> float:
        """The latest ready time a step scheduled at `now` may admit: back to back with the
        step before, with async scheduling, it was scheduled when that step's host was done."""
        if self.async_scheduling and now == self._last_step_end:
            return min(now, self._host_done)
        return now
