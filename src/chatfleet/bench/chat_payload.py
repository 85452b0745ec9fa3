"""The chat payload: /v1/chat/completions with real text, built off the event loop and ahead
of need (the default of `chatfleet sweep`; bench/payload.py states the contract it keeps).

Each prompt text is text of exactly the segment's number of Qwen3 tokens
(data.exact_tokens.text_of_exact_tokens, a function of (seed, tokens)). The shared system prompt
of group g is seeded by its segment id (g + 1), so it is byte-identical in every request and
every session; a user message is seeded by (the run's seed, its session id, its turn)
(`user_text_seed`), which the workload knows before the run starts, where its segment id
depends on the order in which users finish. A session's history carries the answers the engine
actually gave (their text, as the product would), not the workload's synthetic answers.
Chat-template tokens come on top of the segment lengths, as they would in production.

Thinking is off by default (`enable_thinking: false` in chat_template_kwargs, stated in the
results' workload block); `--thinking` turns it on.

When texts are built: with a `TextPool`, never on the event loop, and ahead of need. Before a
run's clock starts, `build_ahead` builds the shared system prompts and the first turns of
every stream of the run's `TurnsAhead` (closed loop: as many turns per user as the run is
expected to send; open loop: every session that arrives in the window); then, as each request
is sent, `prefetch` starts the builds of the next `lookahead` turns of its stream, so a text
the estimate left out is built turns before it is needed. The drive calls `prefetch` as soon
as a request exists and awaits `prepare` at its send time; a request whose texts were not built
by then waits for them (counted in `late`, with its scheduled time). The body is made of texts
already built, so the loop only assembles and sends bytes. Without a pool a text is built
inline, as the same function of (seed, tokens).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from chatfleet.bench.payload import AheadStats, Progress, TextKey
from chatfleet.bench.text_pool import TextPool
from chatfleet.core.workload import RequestSpec
from chatfleet.core.workload.ahead import Turn, TurnsAhead
from chatfleet.data.exact_tokens import text_of_exact_tokens
from chatfleet.data.tokenizer import QwenTokenizer

# During a run each send starts the builds of its stream's next turns, this many of them.
LOOKAHEAD_TURNS = 3
# At most this many texts are built before a run's clock starts (about 60 MB of 512-token
# messages, two minutes on two workers here); the lookahead builds the rest during the run.
MAX_TEXTS_AHEAD = 20_000
# user-message seeds are 65-bit (1 << 64 set), apart from the system prompts' 1..G
_USER_SEED_BIT = 1 << 64


def user_text_seed(run_seed: int, session_id: str, turn: int) -> int:
    """The seed of a user message's text: a function of the run's seed, the session and the
    turn only, so it is known before the run starts (a segment id is not: the workload
    allocates them as users finish)."""
    digest = hashlib.blake2b(f"{run_seed}/{session_id}/{turn}".encode(), digest_size=8)
    return _USER_SEED_BIT | int.from_bytes(digest.digest(), "big")


@dataclass
class ChatPayload:
    """The chat payload (the module docstring); a `bench.payload.Payload`."""

    tok: QwenTokenizer
    model: str
    ignore_eos: bool = True
    thinking: bool = False
    continuous_usage: bool = True
    system_groups: int = 1
    pool: TextPool | None = None  # builds texts off the event loop (None: inline)
    lookahead: int = LOOKAHEAD_TURNS
    max_ahead: int = MAX_TEXTS_AHEAD
    stats: AheadStats = field(default_factory=AheadStats)
    _run_seed: int = 0
    _ahead: TurnsAhead | None = None
    _text: dict[TextKey, str] = field(default_factory=dict)
    _pending: dict[TextKey, asyncio.Future[str]] = field(default_factory=dict)
    _history: dict[str, list[dict[str, str]]] = field(default_factory=dict)

    def ahead_stats(self) -> AheadStats:
        """What this run's texts cost so far (`reset` starts them over)."""
        return self.stats

    def segment_text(self, seed: int, n: int) -> str:
        """Text of exactly n tokens for `seed`: the same bytes every time it is asked (built
        inline when it was not built ahead)."""
        text = self._text.get((seed, n))
        if text is None:
            text = text_of_exact_tokens(self.tok, n, seed=seed)
            self._text[(seed, n)] = text
        return text

    def reset(self, seed: int = 0) -> None:
        """A new run with this seed: sessions start over, the user messages' texts are new
        (the shared system prompts' are kept)."""
        self._history.clear()
        for fut in self._pending.values():
            fut.cancel()
        self._pending.clear()
        self._text = {k: v for k, v in self._text.items() if k[0] <= self.system_groups}
        self._run_seed = seed
        self._ahead = None
        self.stats = AheadStats()

    def _system_key(self, spec: RequestSpec) -> TextKey | None:
        """The shared system prompt a session's first turn opens with, if any."""
        segs = spec.segments
        if len(segs) > 1 and spec.turn == 0 and segs[0][0] <= self.system_groups:
            return segs[0]
        return None

    def _user_key(self, session_id: str, turn: int, tokens: int) -> TextKey:
        return (user_text_seed(self._run_seed, session_id, turn), tokens)

    def keys_of(self, spec: RequestSpec) -> list[TextKey]:
        """The texts the request's body carries (the history's earlier texts were carried
        before): its system prompt on a first turn, and its user message."""
        user = self._user_key(spec.session_id, spec.turn, spec.segments[-1][1])
        system = self._system_key(spec)
        return [user] if system is None else [system, user]

    def _turn_key(self, turn: Turn) -> TextKey:
        return self._user_key(turn.session_id, turn.turn, turn.user_tokens)

    def prefetch(self, spec: RequestSpec) -> None:
        """Start building the texts `spec` will need, and those of its stream's next
        `lookahead` turns, in the pool (nothing without a pool, or for texts built or being
        built)."""
        self._start(spec)

    def _start(self, spec: RequestSpec) -> list[asyncio.Future[str]]:
        """`prefetch`, and the futures `spec` still waits on."""
        if self.pool is None:
            return []
        started = len(self._pending)
        waits = [f for f in (self._future(k) for k in self.keys_of(spec)) if f is not None]
        if self._ahead is not None:
            for turn in self._ahead.following(spec, self.lookahead):
                self._future(self._turn_key(turn))
        self.stats.built_in_run += len(self._pending) - started
        return waits

    async def prepare(self, spec: RequestSpec) -> None:
        """Return when every text of `spec` is built (in the pool), counting the request as
        late when one was not; a build's error is raised. Cancelling the caller leaves a shared
        build running for the others."""
        waits = self._start(spec)
        if waits:
            self.stats.late.append(spec.scheduled_time)
        for fut in waits:
            await asyncio.shield(fut)

    async def prebuild(self, keys: Iterable[TextKey],
                       progress: Progress | None = None) -> int:
        """Build these texts now (in the pool when there is one); how many were built."""
        wanted = [k for k in dict.fromkeys(keys) if k not in self._text]
        if self.pool is None:
            for k in wanted:
                self.segment_text(*k)
            return len(wanted)
        futs = [f for f in (self._future(k) for k in wanted) if f is not None]
        for done, fut in enumerate(asyncio.as_completed(futs), start=1):
            await fut
            if progress is not None:
                progress(done, len(futs))
        return len(wanted)

    async def build_ahead(self, ahead: TurnsAhead, per_stream: int | None,
                          system: Iterable[TextKey] = (),
                          progress: Progress | None = None) -> None:
        """Before the run's clock starts: the shared system prompts and the first `per_stream`
        turns of every stream of `ahead` (None: all of an open loop's), at most `max_ahead`
        texts in all; `ahead` then guides the lookahead during the run."""
        self._ahead = ahead
        per = None if per_stream is None else max(per_stream, self.lookahead + 1)
        turns = ahead.first(per)[: self.max_ahead]
        t0 = time.monotonic()
        built = await self.prebuild([*system, *(self._turn_key(t) for t in turns)], progress)
        self.stats.built_ahead += built
        self.stats.ahead_s += time.monotonic() - t0

    def _future(self, key: TextKey) -> asyncio.Future[str] | None:
        if key in self._text or self.pool is None:
            return None
        fut = self._pending.get(key)
        if fut is None:
            fut = asyncio.ensure_future(self.pool.text(key[1], key[0]))
            self._pending[key] = fut
            fut.add_done_callback(functools.partial(self._landed, key))
        return fut

    def _landed(self, key: TextKey, fut: asyncio.Future[str]) -> None:
        if self._pending.get(key) is fut:
            del self._pending[key]
        if not fut.cancelled() and fut.exception() is None:
            self._text.setdefault(key, fut.result())

    def close(self) -> None:
        """Stop the pool's workers (the payload builds inline afterwards)."""
        if self.pool is not None:
            pool, self.pool = self.pool, None
            pool.close()

    def __call__(self, spec: RequestSpec) -> tuple[str, dict[str, Any]]:
        history = self._history.get(spec.session_id)
        if history is None or spec.turn == 0:
            history = []
            system = self._system_key(spec)
            if system is not None:
                history.append({"role": "system", "content": self.segment_text(*system)})
            self._history[spec.session_id] = history
        user = self.segment_text(*self.keys_of(spec)[-1])
        messages = [*history, {"role": "user", "content": user}]
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
        user = self.segment_text(*self.keys_of(spec)[-1])
        history.append({"role": "user", "content": user})
        history.append({"role": "assistant", "content": text})

    def end_session(self, session_id: str) -> None:
        self._history.pop(session_id, None)
