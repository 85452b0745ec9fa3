"""Turn the workload's requests into request bodies for a live engine.

- `ChatPayload` (the default): /v1/chat/completions with real text. Each segment of the
  workload becomes text of exactly that many Qwen3 tokens (data.exact_tokens.text_of_exact_tokens,
  seeded by the segment id), so the shared system prompt is byte-identical in every request
  and every session. A session's history carries the answers the engine actually gave (their
  text, as the product would), not the workload's synthetic answers. Chat-template tokens come
  on top of the segment lengths, as they would in production.
- `completions_with_ids` (drive.py): /v1/completions with the twin's exact token ids.

Thinking is off by default (`enable_thinking: false` in chat_template_kwargs, stated in the
results' workload block); `--thinking` turns it on.

When texts are built: with a `TextPool`, never on the event loop. The drive calls `prefetch`
as soon as a request exists (an open-loop arrival before its time comes, a closed-loop user's
next turn before its think time) and awaits `prepare` before it sends; the shared system
prompts are built before the run's clock starts (`prebuild`). The body is then made of texts
already built, so the loop only assembles and sends bytes. Without a pool (or for a request
nobody prepared) a text is built inline, as the same function of (segment id, tokens).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from chatfleet.bench.text_pool import TextPool
from chatfleet.core.workload import RequestSpec
from chatfleet.data.exact_tokens import text_of_exact_tokens
from chatfleet.data.tokenizer import QwenTokenizer

Segment = tuple[int, int]  # (segment id, tokens)


@dataclass
class ChatPayload:
    tok: QwenTokenizer
    model: str
    ignore_eos: bool = True
    thinking: bool = False
    continuous_usage: bool = True
    system_groups: int = 1
    pool: TextPool | None = None  # builds texts off the event loop (None: inline)
    _text: dict[Segment, str] = field(default_factory=dict)
    _pending: dict[Segment, asyncio.Future[str]] = field(default_factory=dict)
    _history: dict[str, list[dict[str, str]]] = field(default_factory=dict)

    def segment_text(self, sid: int, n: int) -> str:
        """Text of exactly n tokens for segment sid: the same bytes every time it is asked."""
        text = self._text.get((sid, n))
        if text is None:
            text = text_of_exact_tokens(self.tok, n, seed=sid)
            self._text[(sid, n)] = text
        return text

    def reset(self) -> None:
        """A new run: sessions start over (the text of shared prompts is kept)."""
        self._history.clear()
        for fut in self._pending.values():
            fut.cancel()
        self._pending.clear()
        shared = {k: v for k, v in self._text.items() if k[0] <= self.system_groups}
        self._text = shared

    def _system_segment(self, spec: RequestSpec) -> Segment | None:
        """The shared system prompt a session's first turn opens with, if any."""
        segs = spec.segments
        if len(segs) > 1 and spec.turn == 0 and segs[0][0] <= self.system_groups:
            return segs[0]
        return None

    def segments_of(self, spec: RequestSpec) -> list[Segment]:
        """The segments whose text the request's body carries (the history's earlier texts
        were carried before)."""
        system = self._system_segment(spec)
        return [spec.segments[-1]] if system is None else [system, spec.segments[-1]]

    def prefetch(self, spec: RequestSpec) -> list[asyncio.Future[str]]:
        """Start building the texts `spec` will need in the pool (nothing without a pool, or
        when they are built or being built); the futures it still waits on."""
        if self.pool is None:
            return []
        return [f for f in (self._future(seg) for seg in self.segments_of(spec))
                if f is not None]

    async def prepare(self, spec: RequestSpec) -> None:
        """Return when every text of `spec` is built (in the pool); a build's error is
        raised. Cancelling the caller leaves a shared build running for the others."""
        for fut in self.prefetch(spec):
            await asyncio.shield(fut)

    async def prebuild(self, segments: Iterable[Segment]) -> None:
        """Build these texts now, in the pool when there is one (the shared system prompts,
        before the run's clock starts)."""
        wanted = list(segments)
        futs = [f for f in (self._future(seg) for seg in wanted) if f is not None]
        if self.pool is None:
            for seg in wanted:
                self.segment_text(*seg)
        await asyncio.gather(*futs)

    def _future(self, seg: Segment) -> asyncio.Future[str] | None:
        if seg in self._text or self.pool is None:
            return None
        fut = self._pending.get(seg)
        if fut is None:
            fut = asyncio.ensure_future(self.pool.text(seg[1], seg[0]))
            self._pending[seg] = fut
            fut.add_done_callback(functools.partial(self._landed, seg))
        return fut

    def _landed(self, seg: Segment, fut: asyncio.Future[str]) -> None:
        if self._pending.get(seg) is fut:
            del self._pending[seg]
        if not fut.cancelled() and fut.exception() is None:
            self._text.setdefault(seg, fut.result())

    def close(self) -> None:
        """Stop the pool's workers (the payload builds inline afterwards)."""
        if self.pool is not None:
            pool, self.pool = self.pool, None
            pool.close()

    def __call__(self, spec: RequestSpec) -> tuple[str, dict[str, Any]]:
        segs = spec.segments
        history = self._history.get(spec.session_id)
        if history is None or spec.turn == 0:
            history = []
            system = self._system_segment(spec)
            if system is not None:
                history.append({"role": "system", "content": self.segment_text(*system)})
            self._history[spec.session_id] = history
        user_sid, user_n = segs[-1]
        messages = [*history, {"role": "user", "content": self.segment_text(user_sid, user_n)}]
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "max_tokens": spec.max_new_tokens,
            "stream": True,
            "temperature": 0.0,
            "chat_template_kwargs": {"enable_thinking": self.thinking},
            "stream_options": {"include_usage": True,
                               "continuous_usage_stats": self.continuous_usage},
        }
        if self.ignore_eos:
            body["ignore_eos"] = True
            body["min_tokens"] = spec.max_new_tokens
        return "/v1/chat/completions", body

    def on_answer(self, spec: RequestSpec, text: str) -> None:
        """The engine's answer joins the session's history (its reasoning does not)."""
        history = self._history.setdefault(spec.session_id, [])
        user_sid, user_n = spec.segments[-1]
        history.append({"role": "user", "content": self.segment_text(user_sid, user_n)})
        history.append({"role": "assistant", "content": text})

    def end_session(self, session_id: str) -> None:
        self._history.pop(session_id, None)
