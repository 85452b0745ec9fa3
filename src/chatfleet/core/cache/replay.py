"""What a cache replay records beside the engine model, and what it returns.

The replay (`twin/cache_replay.py`) runs a trace through the twin's own scheduler
(`core/engine/scheduler.py`) in virtual time: admission, host-tier load-back, chunked prefill,
prefill-first batching, decode, retraction and `cache_finished_req` are the scheduler's, with
its constants. `ReplayLedger` is told what the scheduler did at the points of a request's life
(arrival, first admission, each prefill step's computed tokens, finish, or refusal) and keeps
what the engine does not:

- the unbounded pool (the ceiling): a second `RadixCache` that never evicts sees the same
  inserts as the scheduler's tree (each prefill step's computed part, each finished request's
  prompt + answer minus its last token); its match at a turn's first admission is what a pool
  without eviction would have hit there, and the difference is the "evicted then returned"
  tokens;
- the working set: at each first admission, the distinct tokens of every live session's cached
  prefix that its next prompt reuses (the shared prompt once), the requests in flight counted
  whole;
- a session's next turn: never sent before its previous turn finished (a user answers an
  answer); a trace time earlier than that is delayed.
"""

from __future__ import annotations

import dataclasses
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from chatfleet.core.cache.trace import Turn, check_trace, common_prefix_len, sessions_of, sort_trace
from chatfleet.core.engine.build import EngineSpec
from chatfleet.core.engine.eviction import EVICTION_POLICIES
from chatfleet.core.engine.host_tier import DEFAULT_WRITE_POLICY, check_host_tier
from chatfleet.core.engine.radix import RadixCache
from chatfleet.core.errors import ChatfleetError

DEFAULT_POLICY = "lru"


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """One configuration of the sweep: the GPU pool, the eviction policy, the host tier."""

    pool_tokens: int
    policy: str = DEFAULT_POLICY
    host_pool_tokens: int = 0
    write_policy: str = DEFAULT_WRITE_POLICY  # the host tier's (SGLang's --hicache-write-policy)

    def __post_init__(self) -> None:
        if self.pool_tokens <= 0:
            raise ChatfleetError(f"pool tokens must be positive, got {self.pool_tokens}")
        if self.policy not in EVICTION_POLICIES:
            raise ChatfleetError(f"unknown eviction policy {self.policy!r}; one of "
                                 f"{', '.join(EVICTION_POLICIES)}")
        check_host_tier(self.pool_tokens, self.host_pool_tokens, self.write_policy)

    def engine_spec(self, base: EngineSpec) -> EngineSpec:
        """`base` (GPU, model, precision, calibration) with this pool, policy and host tier;
        the thermal model off (the cache question is about tokens, not clocks)."""
        return dataclasses.replace(base, pool_tokens=self.pool_tokens,
                                   eviction_policy=self.policy,
                                   host_pool_tokens=self.host_pool_tokens,
                                   hicache_write_policy=self.write_policy, thermal=False)


@dataclass(slots=True)
class TurnOutcome:
    session: str
    turn: int
    prompt_tokens: int
    hit_tokens: int  # not recomputed: the scheduler's num_cached_tokens (host load-back in it)
    host_hit_tokens: int
    ceiling_tokens: int  # what a pool that never evicts would have hit
    wait_s: float  # arrival to first admission
    ttft_s: float  # arrival to first token, from the scheduler's step times
    admitted: bool = True

    @property
    def returned_tokens(self) -> int:
        """Prefix tokens that were cached, were evicted, and came back in this prompt."""
        return max(0, self.ceiling_tokens - self.hit_tokens)


@dataclass(slots=True)
class ReplayResult:
    config: CacheConfig
    outcomes: list[TurnOutcome]
    evicted_tokens: int
    loaded_back_tokens: int
    working_set_peak: int
    working_set_mean: float
    in_flight_peak: int
    waited: int  # turns left in the queue when the scheduler chose a decode step instead
    not_admitted: int
    retractions: int = 0
    span_s: float = 0.0  # from the first turn sent to the last


def union_size(seqs: Sequence[array[int]]) -> int:
    """Distinct tokens of a set of sequences in a trie: sum of lengths minus the common
    prefix of each with its predecessor in sorted order."""
    ordered = sorted(s for s in seqs if len(s))
    total, prev = 0, array("q")
    for s in ordered:
        total += len(s) - common_prefix_len(prev, s)
        prev = s
    return total


def unbounded_pool(trace: Sequence[Turn]) -> int:
    """A pool no trace can fill: every token of every turn, plus one."""
    return sum(t.prompt_len + t.output_len for t in trace) + 1


class ReplayLedger:
    """One trace's bookkeeping for one configuration. Turns are named by their index in
    `self.trace` (time order)."""

    def __init__(self, trace: Sequence[Turn], cfg: CacheConfig) -> None:
        check_trace(trace)
        self.trace = sort_trace(trace)
        self.cfg = cfg
        self.shadow = RadixCache("lru")  # never evicts: the unbounded pool
        by_session = sessions_of(self.trace)
        self.index = {(t.session, t.turn): i for i, t in enumerate(self.trace)}
        self.first_turns = sorted(self.index[(ts[0].session, 1)] for ts in by_session.values())
        # what each turn leaves in the cache that the session's next prompt starts with
        self.keep: dict[int, int] = {}
        for ts in by_session.values():
            for a, b in zip(ts, [*ts[1:], None], strict=True):
                kept = 0
                if b is not None:
                    kept = common_prefix_len(a.prompt + a.output[:-1], b.prompt)
                self.keep[self.index[(a.session, a.turn)]] = kept
        self.outcomes: list[TurnOutcome | None] = [None] * len(self.trace)
        self.arrived_at: dict[int, float] = {}
        self.session_state: dict[str, array[int]] = {}  # for the working set
        self.ws_samples: list[int] = []
        self.num_in_flight = 0
        self.in_flight_peak = 0
        self.waited_ids: set[int] = set()

    # --- the points of a request's life ----------------------------------------------
    def arrive(self, i: int, now: float) -> None:
        self.arrived_at[i] = now

    def is_admitted(self, i: int) -> bool:
        return self.outcomes[i] is not None

    def admitted(self, i: int, now: float, num_cached_tokens: int,
                 num_loaded_back_tokens: int) -> None:
        """The scheduler took turn i into a prefill batch for the first time."""
        t = self.trace[i]
        n = t.prompt_len
        ceiling = min(self.shadow.match_prefix(t.prompt, now).device_len, n - 1)
        self.outcomes[i] = TurnOutcome(t.session, t.turn, n, num_cached_tokens,
                                       num_loaded_back_tokens, ceiling,
                                       now - self.arrived_at[i], float("nan"))
        self.num_in_flight += 1
        self.in_flight_peak = max(self.in_flight_peak, self.num_in_flight)
        self.session_state[t.session] = t.prompt + t.output[:-1]
        self.ws_samples.append(union_size(list(self.session_state.values())))

    def waited(self, i: int) -> None:
        """Turn i was in the queue when the scheduler chose a decode step: no room for it."""
        self.waited_ids.add(i)

    def computed(self, tokens: array[int], now: float) -> None:
        """A prefill step made these tokens' KV (a request's `fill` up to its computed
        length): the scheduler's tree inserts them, and so does the unbounded pool."""
        self.shadow.insert(tokens, now)

    def finished(self, i: int, now: float, first_token_time: float) -> tuple[int, float] | None:
        """Turn i finished; returns the session's next turn and when it is sent, or None."""
        t = self.trace[i]
        self.shadow.insert(t.prompt + t.output[:-1], now)
        outcome = self.outcomes[i]
        if outcome is None:
            raise RuntimeError(f"turn {i} finished without being admitted")
        outcome.ttft_s = first_token_time - self.arrived_at[i]
        self.num_in_flight -= 1
        return self._release_session(i, now)

    def refused(self, i: int, now: float) -> tuple[int, float] | None:
        """The engine can never run turn i (longer than the pool or the context)."""
        t = self.trace[i]
        self.outcomes[i] = TurnOutcome(t.session, t.turn, t.prompt_len, 0, 0, 0, 0.0,
                                       float("inf"), admitted=False)
        return self._release_session(i, now)

    def _release_session(self, i: int, now: float) -> tuple[int, float] | None:
        t = self.trace[i]
        nxt = self.index.get((t.session, t.turn + 1))
        if nxt is None:
            self.session_state.pop(t.session, None)
            return None
        self.session_state[t.session] = (t.prompt + t.output[:-1])[: self.keep[i]]
        return nxt, max(now, self.trace[nxt].time)

    # --- the result --------------------------------------------------------------------
    def result(self, evicted_tokens: int, loaded_back_tokens: int,
               retractions: int) -> ReplayResult:
        outcomes = [o for o in self.outcomes if o is not None]
        if len(outcomes) != len(self.trace) or self.num_in_flight:
            raise RuntimeError("the replay stopped with turns not finished")
        samples = self.ws_samples or [0]
        return ReplayResult(
            self.cfg, outcomes, evicted_tokens, loaded_back_tokens, max(samples),
            sum(samples) / len(samples), self.in_flight_peak, len(self.waited_ids),
            sum(1 for o in outcomes if not o.admitted), retractions,
            max(self.arrived_at.values()) - min(self.arrived_at.values()))
