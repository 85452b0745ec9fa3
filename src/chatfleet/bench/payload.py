"""What a request's body is made of: the `Payload` contract, the token-id payload, and a payload
cut to what the engine accepts.

A payload turns each of the workload's requests into (URL path, JSON body). Around that, the
drive (bench/drive.py) and a sweep's run (bench/live_run.py) call its hooks, each at one moment:

| hook | called by | when |
|---|---|---|
| `reset(seed)` | the run | first: a new run with this seed, sessions start over |
| `await build_ahead(ahead, per_stream, system, progress)` | the run | before its clock starts |
| `prefetch(spec)` | the drive | as soon as a request exists (an arrival drawn, a next turn) |
| `await prepare(spec)` | the drive | at the request's time, before its body is asked for |
| `payload(spec)` | the drive | at the send: (path, body) |
| `on_answer(spec, text)` | the drive | an ok answer came back: its text |
| `end_session(session_id)` | the drive | the session has no next turn |
| `ahead_stats()` | the run | after the drive: what its texts cost (None: it builds none) |
| `close()` | the sweep | once, at its end |

`IdsPayload` (/v1/completions with the twin's exact token ids) builds nothing and keeps no
history: every hook of a `PlainPayload` does nothing. `ChatPayload` (bench/chat_payload.py)
builds its texts ahead in a pool and keeps each session's history. `Shaped` cuts any payload's
bodies to the fields the engine accepts and passes every hook on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from chatfleet.core.workload import RequestSpec
from chatfleet.core.workload.ahead import TurnsAhead
from chatfleet.engines import EngineAdapter

TextKey = tuple[int, int]  # a text of exactly `tokens` tokens for a seed: (seed, tokens)
Progress = Callable[[int, int], None]  # (texts built, texts to build)
Body = tuple[str, dict[str, Any]]  # (URL path, JSON body)


@dataclass
class AheadStats:
    """What a run's texts cost: built before its clock started (and the seconds it took),
    built during the run by the lookahead, and the requests that waited for theirs (their
    scheduled times)."""

    built_ahead: int = 0
    ahead_s: float = 0.0
    built_in_run: int = 0
    late: list[float] = field(default_factory=list)


class Payload(Protocol):
    """A request's body and the hooks around it (the module docstring says who calls each,
    and when)."""

    def __call__(self, spec: RequestSpec) -> Body: ...

    def reset(self, seed: int) -> None: ...

    async def build_ahead(self, ahead: TurnsAhead, per_stream: int | None,
                          system: Iterable[TextKey] = (),
                          progress: Progress | None = None) -> None: ...

    def prefetch(self, spec: RequestSpec) -> None: ...

    async def prepare(self, spec: RequestSpec) -> None: ...

    def on_answer(self, spec: RequestSpec, text: str) -> None: ...

    def end_session(self, session_id: str) -> None: ...

    def ahead_stats(self) -> AheadStats | None: ...

    def close(self) -> None: ...


class PlainPayload:
    """The hooks of a payload whose body is made at the send from the request alone: none of
    them does anything. A subclass defines `__call__` (and overrides the hooks it needs)."""

    def reset(self, seed: int) -> None:
        return None

    async def build_ahead(self, ahead: TurnsAhead, per_stream: int | None,
                          system: Iterable[TextKey] = (),
                          progress: Progress | None = None) -> None:
        return None

    def prefetch(self, spec: RequestSpec) -> None:
        return None

    async def prepare(self, spec: RequestSpec) -> None:
        return None

    def on_answer(self, spec: RequestSpec, text: str) -> None:
        return None

    def end_session(self, session_id: str) -> None:
        return None

    def ahead_stats(self) -> AheadStats | None:
        return None

    def close(self) -> None:
        return None


@dataclass(frozen=True)
class IdsPayload(PlainPayload):
    """/v1/completions with the prompt as token ids: the twin's exact token sequence (SGLang,
    vLLM and the simserver accept token-id prompts). `send_rid` passes the request id as
    SGLang's `rid` (the simserver's trace then names it)."""

    model: str
    ignore_eos: bool = True
    send_rid: bool = False

    def __call__(self, spec: RequestSpec) -> Body:
        extra = {"rid": spec.request_id} if self.send_rid else {}
        return "/v1/completions", {**extra,
            "model": self.model, "prompt": spec.prompt_ids().tolist(),
            "max_tokens": spec.max_new_tokens, "ignore_eos": self.ignore_eos,
            "min_tokens": spec.max_new_tokens if self.ignore_eos else 0,
            "stream": True, "temperature": 0.0,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }


class Shaped:
    """A payload whose bodies are cut to what the engine accepts (a strict OpenAI server
    answers 422 to any other field); every hook is the inner payload's."""

    def __init__(self, inner: Payload, adapter: EngineAdapter) -> None:
        self.inner = inner
        self.adapter = adapter

    def __call__(self, spec: RequestSpec) -> Body:
        path, body = self.inner(spec)
        return path, self.adapter.shape_payload(body)

    def reset(self, seed: int) -> None:
        self.inner.reset(seed)

    async def build_ahead(self, ahead: TurnsAhead, per_stream: int | None,
                          system: Iterable[TextKey] = (),
                          progress: Progress | None = None) -> None:
        await self.inner.build_ahead(ahead, per_stream, system, progress)

    def prefetch(self, spec: RequestSpec) -> None:
        self.inner.prefetch(spec)

    async def prepare(self, spec: RequestSpec) -> None:
        await self.inner.prepare(spec)

    def on_answer(self, spec: RequestSpec, text: str) -> None:
        self.inner.on_answer(spec, text)

    def end_session(self, session_id: str) -> None:
        self.inner.end_session(session_id)

    def ahead_stats(self) -> AheadStats | None:
        return self.inner.ahead_stats()

    def close(self) -> None:
        self.inner.close()
