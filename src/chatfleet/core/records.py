"""RequestRecord: what every path (twin, simserver, live client, gateway) yields per request.

Times are seconds on one clock (virtual time in the twin, model time in live runs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

Outcome = Literal["ok", "shed", "error", "timeout", "cancelled"]
OUTCOMES: tuple[Outcome, ...] = ("ok", "shed", "error", "timeout", "cancelled")


@dataclass(slots=True)
class RequestRecord:
    """One request as the client saw it.

    `token_times` holds the arrival time of every output token, the first included, already
    split per token when a stream chunk carried several (see metrics.expand_chunks). It may be a
    list or a numpy array. `response_id` is the engine's own id for the request (the `id` of
    its OpenAI response or stream chunks: vLLM's request id, the simserver trace's `rid`), so a
    run can be matched to the server's records; None where no response came.
    """

    request_id: str
    session_id: str = ""
    turn: int = 0
    replica: str | None = None
    scheduled_time: float = 0.0
    send_time: float = 0.0
    first_token_time: float | None = None
    token_times: Sequence[float] = field(default_factory=list)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    outcome: Outcome = "ok"
    error: str | None = None
    itl_estimated: bool = False
    response_id: str | None = None

    @property
    def last_token_time(self) -> float | None:
        if len(self.token_times) == 0:
            return self.first_token_time
        return float(self.token_times[-1])
