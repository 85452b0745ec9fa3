"""Multi-turn traces for the cache analysis: turns, synthetic sessions, and the token ids of
traces known only by their lengths.

A trace is a list of turns: session, time, the prompt's token ids and the answer's token ids.
Token ids only need to be consistent: the radix cache compares them.
"""

from __future__ import annotations

import math
import random
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from chatfleet.core.defaults import SYSTEM_PROMPT_TOKENS
from chatfleet.core.engine.step_time import StepTimeModel
from chatfleet.core.workload import LengthSpec, Workload, WorkloadConfig, WorkloadError

UNIQUE_ID_BASE = 1 << 40  # ids of answers no later prompt repeats: outside any vocabulary


@dataclass(frozen=True, slots=True)
class Turn:
    """One request of a trace. `turn` is its 1-based position in its session."""

    session: str
    turn: int
    time: float
    prompt: array[int]
    output: array[int]  # the answer's token ids; the cache keeps all but the last

    @property
    def prompt_len(self) -> int:
        return len(self.prompt)

    @property
    def output_len(self) -> int:
        return len(self.output)


def common_prefix_len(a: array[int], b: array[int]) -> int:
    """Length of the longest common prefix of two token arrays (slice comparisons run in C)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n - 1  # a[:lo] matches, the first mismatch is in [lo, hi]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def sort_trace(turns: Sequence[Turn]) -> list[Turn]:
    """Turns in time order (ties by session and turn)."""
    return sorted(turns, key=lambda t: (t.time, t.session, t.turn))


def sessions_of(turns: Sequence[Turn]) -> dict[str, list[Turn]]:
    out: dict[str, list[Turn]] = {}
    for t in sorted(turns, key=lambda t: (t.session, t.turn)):
        out.setdefault(t.session, []).append(t)
    return out


def check_trace(turns: Sequence[Turn]) -> None:
    if not turns:
        raise WorkloadError("the trace holds no turns")
    for s, ts in sessions_of(turns).items():
        if [t.turn for t in ts] != list(range(1, len(ts) + 1)):
            raise WorkloadError(f"session {s!r}: turns must be numbered 1..n")
        for t in ts:
            if t.prompt_len <= 0 or t.output_len <= 0:
                raise WorkloadError(f"session {s!r} turn {t.turn}: empty prompt or answer")
            if not math.isfinite(t.time) or t.time < 0:
                raise WorkloadError(f"session {s!r} turn {t.turn}: bad time {t.time}")


def _unique_ids(counter: list[int], n: int) -> array[int]:
    start = counter[0]
    counter[0] += n
    return array("q", range(start, start + n))


def answer_ids(prompt: array[int], output_len: int, next_prompt: array[int] | None,
               counter: list[int]) -> array[int]:
    """The answer's ids when only its length is known: the tokens the session's next prompt
    has right after this prompt (when the next prompt starts with this one), else ids no
    prompt repeats (the answer is never reused, as with thinking on or an edited history)."""
    n = len(prompt)
    if next_prompt is not None and len(next_prompt) > n and next_prompt[:n] == prompt:
        reused = next_prompt[n: n + output_len]
        if len(reused) == output_len:
            return array("q", reused)
        return reused + _unique_ids(counter, output_len - len(reused))
    return _unique_ids(counter, output_len)


def count_prompt_ids(session_index: int, n: int, shared_tokens: int) -> array[int]:
    """Deterministic ids for a prompt known only by its length: position j of session i's
    token stream, so every turn of a session extends the previous turn's prompt (its answer
    included, when the answer's length is known); the first `shared_tokens` positions are the
    same for every session (a shared system prompt)."""
    out = array("q")
    shared = min(n, shared_tokens)
    out.extend(1_000_003 + j for j in range(shared))
    base = UNIQUE_ID_BASE // 2 + session_index * 10_000_000
    out.extend(base + j for j in range(shared, n))
    return out


@dataclass(frozen=True, slots=True)
class SyntheticConfig:
    """Synthetic multi-turn chat: sessions start with exponential gaps of mean
    `arrival_gap_s`; each sends `turns` turns; a turn follows the previous one after its
    (estimated) duration and a think time (exponential, mean `think_time_s`); a share of the
    sessions (`return_share`) takes one pause of about `return_after_s` (uniform in 0.5..1.5 x)
    before a random later turn: the user comes back after minutes."""

    sessions: int = 24
    turns: int = 8
    system_prompt_tokens: int = SYSTEM_PROMPT_TOKENS
    user_tokens: int = 128
    answer_tokens: int = 256
    length_spread: float = 0.5  # lengths uniform in [len x (1 - r), len x (1 + r)]
    reasoning_share: float = 0.0
    think_time_s: float = 30.0
    arrival_gap_s: float = 120.0
    return_share: float = 0.25
    return_after_s: float = 180.0

    def __post_init__(self) -> None:
        if self.sessions <= 0 or self.turns <= 0:
            raise WorkloadError("sessions and turns must be at least 1")
        if self.user_tokens <= 0 or self.answer_tokens <= 0:
            raise WorkloadError("user and answer tokens must be positive")
        if self.system_prompt_tokens < 0:
            raise WorkloadError("system prompt tokens must not be negative")
        if not 0.0 <= self.length_spread < 1.0:
            raise WorkloadError("length spread must be in [0, 1)")
        if self.think_time_s < 0 or self.arrival_gap_s < 0 or self.return_after_s < 0:
            raise WorkloadError("think time, arrival gap and return time must not be negative")
        if not 0.0 <= self.return_share <= 1.0:
            raise WorkloadError("return share must be in [0, 1]")

    def workload_config(self) -> WorkloadConfig:
        kind = "uniform" if self.length_spread > 0 else "fixed"
        lengths = LengthSpec(kind, self.user_tokens, self.answer_tokens,  # type: ignore[arg-type]
                             self.length_spread, "vllm")
        return WorkloadConfig(system_prompt_tokens=self.system_prompt_tokens, lengths=lengths,
                              turns=self.turns, think_time_s=self.think_time_s,
                              reasoning_share=self.reasoning_share)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": "synthetic", "sessions": self.sessions, "turns": self.turns,
            "system_prompt_tokens": self.system_prompt_tokens, "user_tokens": self.user_tokens,
            "answer_tokens": self.answer_tokens, "length_spread": self.length_spread,
            "thinking": self.reasoning_share > 0, "reasoning_share": self.reasoning_share,
            "think_time_s": self.think_time_s, "arrival_gap_s": self.arrival_gap_s,
            "return_share": self.return_share, "return_after_s": self.return_after_s,
        }


def synthetic_trace(cfg: SyntheticConfig, rng: random.Random,
                    step_model: StepTimeModel) -> list[Turn]:
    """Sessions made by `core.workload.Workload` (the twin's segments and token ids, with
    Qwen3's dropped reasoning), timed as `SyntheticConfig` says. A turn's duration for the
    timing is `turn_seconds` with the history cached; the replay then delays a turn that this
    estimate sends before its previous turn finished."""
    workload = Workload(cfg.workload_config(), rng)
    turns: list[Turn] = []
    start = 0.0
    for i in range(cfg.sessions):
        if i > 0 and cfg.arrival_gap_s > 0:
            start += rng.expovariate(1.0 / cfg.arrival_gap_s)
        session = workload.new_session(i)
        srng = session.rng or rng
        pause_before = -1
        if cfg.turns > 1 and srng.random() < cfg.return_share:
            pause_before = srng.randrange(2, cfg.turns + 1)
        t = start
        prev_cached = 0
        for k in range(1, cfg.turns + 1):
            spec = workload.next_turn(session, t)
            prompt, output = spec.prompt_ids(), spec.output_ids()
            turns.append(Turn(session.session_id, k, t, prompt, output))
            dur = turn_seconds(step_model, prev_cached, len(prompt), len(output))
            think = workload.think_time(session)
            if k + 1 == pause_before:
                think = cfg.return_after_s * (0.5 + srng.random())
            t += dur + think
            prev_cached = len(prompt)
    return sort_trace(turns)


def turn_seconds(step_model: StepTimeModel, cached: int, prompt_len: int,
                 output_len: int) -> float:
    """A turn alone on the card (batch 1): chunked prefill of the prompt after its cached
    prefix (capped at prompt - 1: the last prompt token is always computed), then
    (output - 1) decode steps at a context of prompt + output / 2. Only the synthetic trace's
    send times use it; the replay's times are the twin's scheduler's."""
    cached = min(cached, prompt_len - 1)
    steps = max(0, output_len - 1)
    return (step_model.recompute_s(prompt_len - cached, cached)
            + steps * step_model.decode_s(1, prompt_len + output_len // 2))
