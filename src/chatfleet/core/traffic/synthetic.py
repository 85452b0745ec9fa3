"""A synthetic day of a chat product's traffic, in the trace format: for tests and for the
scale benchmark (benchmarks/plan_trace.py), where no real log can be shipped.

Sessions start through the day with a rate that follows the clock (`DayShape`: lowest at
`peak_hour` + 12 h, `peak_ratio` times that at `peak_hour`, a cosine between); each has a
geometric number of turns (mean `turns`); each turn's user message and answer are uniform
within +-50% of their means; the prompt is the shared system prompt plus the whole history
(the chat template resends it); the next turn is sent after the answer (estimated at
`answer_s_per_token` a token) and an exponential think time.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass

from chatfleet.core.traffic.trace import TraceRow

DAY_S = 86400.0


@dataclass(frozen=True, slots=True)
class DayShape:
    sessions: int = 1000
    span_s: float = DAY_S
    peak_hour: float = 14.0  # hours after the trace's start
    peak_ratio: float = 3.0  # the peak's session rate over the trough's
    turns: float = 4.0  # mean turns per session (geometric)
    think_s: float = 30.0  # mean think time between a turn's answer and the next turn
    user_tokens: int = 128
    answer_tokens: int = 256
    system_tokens: int = 2048
    max_prompt_tokens: int = 16384  # a session ends before its prompt would exceed this
    answer_s_per_token: float = 0.04  # the answer's duration, for the next turn's time
    keys: int = 0  # API keys the sessions are spread over (0: none)

    def rate(self, t: float) -> float:
        """The session rate at `t`, relative to the trough (1 .. peak_ratio)."""
        phase = 2.0 * math.pi * (t / 3600.0 - self.peak_hour) / 24.0
        return 1.0 + (self.peak_ratio - 1.0) * (0.5 + 0.5 * math.cos(phase))


def _spread(rng: random.Random, mean: int) -> int:
    return max(1, rng.randint(math.floor(mean * 0.5), math.ceil(mean * 1.5)))


def day_trace(shape: DayShape, rng: random.Random) -> Iterator[TraceRow]:
    """The day's lines, session by session (a trace need not be in time order)."""
    starts: list[float] = []
    while len(starts) < shape.sessions:  # thinning: uniform times kept at rate / peak
        t = rng.random() * shape.span_s
        if rng.random() * shape.peak_ratio <= shape.rate(t):
            starts.append(t)
    starts.sort()
    stop = 1.0 / max(1.0, shape.turns)
    for i, start in enumerate(starts):
        t = start
        history = shape.system_tokens
        key = f"key-{i % shape.keys}" if shape.keys else None
        turn = 0
        while True:
            user, answer = _spread(rng, shape.user_tokens), _spread(rng, shape.answer_tokens)
            prompt = history + user
            if prompt + answer > shape.max_prompt_tokens and turn > 0:
                break
            yield TraceRow(f"s{i}", turn, round(t, 3), prompt, None, answer, key)
            history = prompt + answer
            turn += 1
            if rng.random() < stop:
                break
            t += answer * shape.answer_s_per_token + rng.expovariate(1.0 / shape.think_s)
            if t >= shape.span_s:
                break
