"""FleetRequest: what the fleet logic knows about a request (admission.py, which re-exports it,
decides on it; waiting.py queues it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class FleetRequest:
    """What the fleet logic knows about a request: no HTTP, no prompt text.

    prompt_tokens / cached_tokens: the session's previous turn's usage (`prompt_tokens` and
    `prompt_tokens_details.cached_tokens`), when known; None on a first turn or without usage.
    key: the API key's name the request came under (its concurrency limit, `key_limits`), or
    None.
    """

    request_id: str
    session_key: str | None
    arrival: float
    returning: bool = False
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    key: str | None = None
