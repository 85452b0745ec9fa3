"""RequestRecord: what every path (twin, simserver, live client, gateway) yields per request.

Times are seconds on one clock (virtual time in the twin, model time in live runs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Outcome = Literal["ok", "shed", "error", "timeout", "cancelled"]
OUTCOMES: tuple[Outcome, ...] = ("ok", "shed", "error", "timeout", "cancelled")


@dataclass(slots=True, init=False)
class RequestRecord:
    """One request as the client saw it.

    `token_times` holds the arrival time of every output token, the first included, already
    split per token when a stream chunk carried several (see metrics.expand_chunks). It may be a
    list or a numpy array. `response_id` is the engine's own id for the request (the `id` of
    its OpenAI response or stream chunks: vLLM's request id, the simserver trace's `rid`), so a
    run can be matched to the server's records; None where no response came.
    """

    request_id: str
    session_id: str
    turn: int
    replica: str | None
    scheduled_time: float
    send_time: float
    first_token_time: float | None
    token_times: Sequence[float]
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    outcome: Outcome
    error: str | None
    itl_estimated: bool
    response_id: str | None

    # __init__ written out (init=False): chatfleet/_native.py says why
    def __init__(self, request_id: str, session_id: str = "", turn: int = 0,
                 replica: str | None = None, scheduled_time: float = 0.0,
                 send_time: float = 0.0, first_token_time: float | None = None,
                 token_times: Sequence[float] | None = None, prompt_tokens: int = 0,
                 cached_tokens: int = 0, output_tokens: int = 0, outcome: Outcome = "ok",
                 error: str | None = None, itl_estimated: bool = False,
                 response_id: str | None = None) -> None:
        self.request_id = request_id
        self.session_id = session_id
        self.turn = turn
        self.replica = replica
        self.scheduled_time = scheduled_time
        self.send_time = send_time
        self.first_token_time = first_token_time
        self.token_times = [] if token_times is None else token_times
        self.prompt_tokens = prompt_tokens
        self.cached_tokens = cached_tokens
        self.output_tokens = output_tokens
        self.outcome = outcome
        self.error = error
        self.itl_estimated = itl_estimated
        self.response_id = response_id

    @property
    def last_token_time(self) -> float | None:
        if len(self.token_times) == 0:
            return self.first_token_time
        return float(self.token_times[-1])
