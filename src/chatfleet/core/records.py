"""RequestRecord: what every path (twin, simserver, live client, gateway) yields per request.

Times are seconds on one clock (virtual time in the twin, model time in live runs).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from chatfleet.core.errors import ChatfleetError

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


def record_to_json(r: RequestRecord) -> dict[str, Any]:
    """A record as a run's records.jsonl holds it (one line a request)."""
    return {
        "request_id": r.request_id, "session_id": r.session_id, "turn": r.turn,
        "replica": r.replica, "scheduled_time": r.scheduled_time,
        "send_time": r.send_time, "first_token_time": r.first_token_time,
        "token_times": list(r.token_times), "prompt_tokens": r.prompt_tokens,
        "cached_tokens": r.cached_tokens, "output_tokens": r.output_tokens,
        "outcome": r.outcome, "error": r.error, "response_id": r.response_id,
        "itl_estimated": r.itl_estimated,
    }


def record_from_json(d: Mapping[str, Any]) -> RequestRecord:
    """The record `record_to_json` wrote (ChatfleetError, with what is wrong, otherwise)."""
    try:
        outcome = d.get("outcome", "ok")
        if outcome not in OUTCOMES:
            raise ValueError(f"unknown outcome {outcome!r}")
        first = d.get("first_token_time")
        times = d.get("token_times") or []
        if not isinstance(times, list):
            raise TypeError("token_times must be a list")
        return RequestRecord(
            str(d["request_id"]), str(d.get("session_id", "")), int(d.get("turn", 0)),
            d.get("replica"), float(d.get("scheduled_time", 0.0)),
            float(d.get("send_time", 0.0)), None if first is None else float(first),
            [float(t) for t in times], int(d.get("prompt_tokens", 0)),
            int(d.get("cached_tokens") or 0), int(d.get("output_tokens", 0)), outcome,
            d.get("error"), bool(d.get("itl_estimated", False)), d.get("response_id"))
    except (KeyError, TypeError, ValueError) as exc:
        raise ChatfleetError(f"not a request record: {exc}") from None
