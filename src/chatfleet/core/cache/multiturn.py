"""The shape of SGLang's `benchmark/hicache/bench_multiturn.py`, the benchmark SGLang's own
HiCache hit rates per round are published with (`chatfleet cache --shape bench-multiturn`).

What the benchmark does (docs/facts.md#sglangs-multi-turn-benchmark says which version):

- `--num-clients` clients, each a conversation of `--num-rounds` rounds. Round 1 is a random
  prompt of `--request-length` tokens; each later round's prompt is the whole history (every
  earlier prompt and answer) plus a new random question of `--request-length` tokens
  (`--sub-question-input-length` when set). Answers are `--output-length` tokens (ignore_eos).
  Nothing is shared between clients: no system prompt.
- One request loop sends: it looks at the ready queue, sends one request when fewer than
  `--max-parallel` are in flight (popped at random, or first in first out with
  `--ready-queue-policy fifo`), then sleeps a Poisson gap of mean 1 / `--request-rate`; while
  `--max-parallel` are in flight it looks again every 50 ms instead.
- A client's next round joins the ready queue when its answer arrives; with
  `--enable-round-barrier`, only when every client has finished the round (the next round's
  requests all join together). Clients thus come back once per round, in a cycle.
- It reports, overall and per round, the hit rate (cached prompt tokens over prompt tokens,
  SGLang's `cached_tokens`) and the TTFT.

`MultiturnConfig` holds those settings (their defaults are the benchmark's, the round barrier
on: the per-round figures need it), `multiturn_trace` the requests' tokens, `MultiturnSender`
the request loop in virtual time (the replay, twin/cache_replay.py, asks it when to send what).
Answers here are exactly the tokens the next prompt repeats (the benchmark appends the answer's
text, which usually tokenizes back to the same tokens).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

from chatfleet.core.cache.trace import UNIQUE_ID_BASE, Turn, answer_ids, count_prompt_ids
from chatfleet.core.errors import ChatfleetError

READY_QUEUE_POLICIES = ("random", "fifo")
POLL_S = 0.05  # the request loop's look while --max-parallel requests are in flight


@dataclass(frozen=True, slots=True)
class MultiturnConfig:
    clients: int = 256  # --num-clients
    rounds: int = 5  # --num-rounds
    request_tokens: int = 512  # --request-length (and each later round's new question)
    answer_tokens: int = 64  # --output-length
    max_parallel: int = 128  # --max-parallel
    request_rate: float = 1.0  # --request-rate, sends per second (Poisson); inf: no pause
    ready_queue: str = "random"  # --ready-queue-policy
    round_barrier: bool = True  # --enable-round-barrier

    def __post_init__(self) -> None:
        for name, value in (("clients", self.clients), ("rounds", self.rounds),
                            ("request tokens", self.request_tokens),
                            ("answer tokens", self.answer_tokens),
                            ("max parallel", self.max_parallel)):
            if value < 1:
                raise ChatfleetError(f"bench-multiturn: {name} must be at least 1, got {value}")
        if math.isnan(self.request_rate) or self.request_rate <= 0:
            raise ChatfleetError(f"bench-multiturn: the request rate must be positive (inf: "
                                 f"no pause), got {self.request_rate}")
        if self.ready_queue not in READY_QUEUE_POLICIES:
            raise ChatfleetError(f"bench-multiturn: unknown ready queue policy "
                                 f"{self.ready_queue!r}: {' or '.join(READY_QUEUE_POLICIES)}")

    def prompt_tokens(self, round_: int) -> int:
        """Round `round_` (1-based)'s prompt: the history and a new question."""
        return round_ * self.request_tokens + (round_ - 1) * self.answer_tokens

    def to_json(self) -> dict[str, Any]:
        return {"kind": "bench-multiturn", "clients": self.clients, "rounds": self.rounds,
                "request_tokens": self.request_tokens, "answer_tokens": self.answer_tokens,
                "max_parallel": self.max_parallel,
                "request_rate": self.request_rate if math.isfinite(self.request_rate)
                else "inf",
                "ready_queue": self.ready_queue, "round_barrier": self.round_barrier,
                "shared_prompt_tokens": 0}


def multiturn_trace(cfg: MultiturnConfig) -> list[Turn]:
    """Every client's every round (session `c<i>`, turn = round), times 0: the request loop
    (`MultiturnSender`) decides when each is sent. Client i's tokens are its own stream
    (`count_prompt_ids` with nothing shared), so round r + 1 extends round r's prompt and
    answer."""
    counter = [UNIQUE_ID_BASE]
    turns: list[Turn] = []
    for c in range(cfg.clients):
        prompts = [count_prompt_ids(c, cfg.prompt_tokens(r), 0)
                   for r in range(1, cfg.rounds + 1)]
        for r, p in enumerate(prompts):
            nxt = prompts[r + 1] if r + 1 < len(prompts) else None
            turns.append(Turn(f"c{c}", r + 1, 0.0, p,
                              answer_ids(p, cfg.answer_tokens, nxt, counter)))
    return turns


class MultiturnSender:
    """The benchmark's request loop, for a replay in virtual time. The replay tells it what
    happened (`done`: a request finished or was refused; `release`: a client's next round is
    ready) and asks it when it next looks at the queue (`next_look`) and what it sends then
    (`look`).

    The loop's sleeps: a Poisson gap after each send; while the queue is empty the loop keeps
    sleeping such gaps, and since they are memoryless it is woken a fresh gap after the queue
    gets a request; while `max_parallel` are in flight it looks every 50 ms from the look that
    found no room, so the first of those looks after a request finishes sends."""

    def __init__(self, cfg: MultiturnConfig, first_round: list[int], rng: random.Random) -> None:
        self.cfg = cfg
        self.rng = rng
        self.ready = list(first_round)  # the requests ready to send, by trace index
        self.held: list[int] = []  # next-round requests waiting at the round barrier
        self.in_flight = 0
        self._next_look: float | None = 0.0
        self._polling_since: float | None = None  # the look that found max_parallel in flight
        self._idle = False  # the last look found the queue empty

    def next_look(self) -> float | None:
        return self._next_look

    def look(self, now: float) -> list[int]:
        """The loop looks at `now`: the request it sends, if any."""
        self._next_look = None
        if self.in_flight >= self.cfg.max_parallel:
            self._polling_since = now
            return []
        if not self.ready:
            self._idle = True
            return []
        index = (self.ready.pop(self.rng.randrange(len(self.ready)))
                 if self.cfg.ready_queue == "random" else self.ready.pop(0))
        self.in_flight += 1
        self._next_look = now + self._gap()
        return [index]

    def done(self, now: float) -> None:
        """A request sent by the loop finished (or was refused): room for another."""
        self.in_flight -= 1
        if self._polling_since is not None:
            polls = max(1, math.ceil((now - self._polling_since) / POLL_S))
            self._next_look = max(now, self._polling_since + polls * POLL_S)
            self._polling_since = None

    def release(self, index: int, now: float) -> None:
        """A client's next round is ready (its previous answer arrived)."""
        if self.cfg.round_barrier:
            self.held.append(index)
            if len(self.held) < self.cfg.clients:
                return
            self.ready.extend(self.held)
            self.held = []
        else:
            self.ready.append(index)
        if self._idle:
            self._idle = False
            self._next_look = now + self._gap()

    def _gap(self) -> float:
        rate = self.cfg.request_rate
        return 0.0 if math.isinf(rate) else self.rng.expovariate(rate)
