"""Working-set analysis of the prefix cache on multi-turn traces (`chatfleet cache`).

A trace is a list of turns: session, time, the prompt's token ids and the answer's token ids.
`replay` drives the engine model's own `RadixCache` (and `KVPool`) the way the twin's scheduler
does (`core/engine/scheduler.py`), turn by turn in time order:

- admission: `match_prefix` of the prompt; the cached prefix is capped at prompt - 1 (SGLang
  always computes the last prompt token); a host-only match longer than the load-back threshold
  is loaded back (`load_back`) after the matched node is locked; the request then holds its
  uncached prompt tokens and its answer's KV (output - 1 tokens, the last token has none) as
  request slots, evicting (`evict`) what the pool needs. The answer's KV is counted in full from
  admission on: an upper bound on what a decoding request holds.
- prefill done (after the modelled prefill time): the prompt joins the tree below the locked
  prefix (`insert_below`), the new node is locked and the old one unlocked.
- finish (after the modelled decode time): prompt + answer minus its last token join the tree
  (SGLang's cache_finished_req) and the request's lock is released.

A request that cannot get room even after evicting everything unlocked waits (FCFS) until
running requests finish. A session's next turn never starts before its previous turn finished
(a user answers an answer); a trace time earlier than that is delayed.

Hit tokens are the prompt tokens not recomputed: the device match plus what the host tier
loaded back (counted separately too). A second `RadixCache` that never evicts (the shadow) sees
the same inserts at the same times: its match is what an unbounded pool would have hit (the
ceiling), and the difference is the "evicted then returned" tokens: prefixes that were in the
cache, were evicted, and came back in a later prompt.

Times come from the step-time model when one is passed: TTFT = wait for room + chunked prefill
of the uncached tokens after the cached prefix (batch 1, no other prefill in the way) + the
host tier's PCIe load-back; decode = (output - 1) steps at the batch of requests in flight at
admission. Without a step-time model, prefill and decode take `fallback` seconds per token.
What is not modelled: queueing behind other prefills, decode stalls, retraction, chunk
interleaving; for those run the twin (`chatfleet twin sweep`) with the chosen pool and policy.
"""

from __future__ import annotations

import heapq
import math
import random
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from chatfleet.core.defaults import SYSTEM_PROMPT_TOKENS
from chatfleet.core.engine.kv_pool import KVPool
from chatfleet.core.engine.radix import EVICTION_POLICIES, MatchResult, RadixCache
from chatfleet.core.engine.step_time import StepTimeModel, attention_pairs
from chatfleet.core.errors import ChatfleetError
from chatfleet.core.metrics import percentiles
from chatfleet.core.workload import LengthSpec, Workload, WorkloadConfig, WorkloadError

SCHEMA = "chatfleet.cache/1"
LOAD_BACK_THRESHOLD = 10  # HiCache loads a host prefix back only above this many tokens
HOLD_TOLERANCE = 0.05  # a turn holds when its hit rate is within this of the unbounded pool's
THRASH_GAP = 0.10  # thrashing: the later turns' hit rate is this far below the unbounded pool's
DEFAULT_POLICY = "lru"
UNIQUE_ID_BASE = 1 << 40  # ids of answers no later prompt repeats: outside any vocabulary


# --------------------------------------------------------------------------------------------
# Trace
# --------------------------------------------------------------------------------------------


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
                    step_model: StepTimeModel | None = None) -> list[Turn]:
    """Sessions made by `core.workload.Workload` (the twin's segments and token ids, with
    Qwen3's dropped reasoning), timed as `SyntheticConfig` says. A turn's duration for the
    timing is the step-time model's estimate with the history cached (batch 1)."""
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
            dur = turn_seconds(step_model, prev_cached, len(prompt), len(output), batch=1)
            think = workload.think_time(session)
            if k + 1 == pause_before:
                think = cfg.return_after_s * (0.5 + srng.random())
            t += dur + think
            prev_cached = len(prompt)
    return sort_trace(turns)


# --------------------------------------------------------------------------------------------
# Times
# --------------------------------------------------------------------------------------------

FALLBACK_PREFILL_S_PER_TOKEN = 0.0003
FALLBACK_DECODE_S_PER_TOKEN = 0.05


def prefill_seconds(step_model: StepTimeModel | None, cached: int, new: int,
                    load_back: int = 0) -> float:
    """Chunked prefill of `new` tokens after `cached` ones, alone in its batches, plus the
    host tier's load-back over PCIe (step_time.prefill_s)."""
    if step_model is None:
        return new * FALLBACK_PREFILL_S_PER_TOKEN
    chunk = step_model.chunked_prefill_size
    total, done, left = 0.0, cached, new
    first = True
    while left > 0:
        n = min(chunk, left)
        total += step_model.prefill_s(n, attention_pairs(done, n), done,
                                      1 if n == left else 0, load_back if first else 0)
        first = False
        done += n
        left -= n
    return total


def decode_seconds(step_model: StepTimeModel | None, prompt_len: int, output_len: int,
                   batch: int) -> float:
    """(output - 1) decode steps at `batch` requests whose contexts average prompt + output/2."""
    steps = max(0, output_len - 1)
    if step_model is None:
        return steps * FALLBACK_DECODE_S_PER_TOKEN
    kv = batch * (prompt_len + output_len // 2)
    return steps * step_model.decode_s(batch, kv)


def turn_seconds(step_model: StepTimeModel | None, cached: int, prompt_len: int,
                 output_len: int, batch: int = 1) -> float:
    cached = min(cached, prompt_len - 1)
    return (prefill_seconds(step_model, cached, prompt_len - cached)
            + decode_seconds(step_model, prompt_len, output_len, batch))


# --------------------------------------------------------------------------------------------
# Replay
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CacheConfig:
    pool_tokens: int
    policy: str = DEFAULT_POLICY
    host_pool_tokens: int = 0
    load_back_threshold: int = LOAD_BACK_THRESHOLD

    def __post_init__(self) -> None:
        if self.pool_tokens <= 0:
            raise ChatfleetError(f"pool tokens must be positive, got {self.pool_tokens}")
        if self.host_pool_tokens < 0:
            raise ChatfleetError(f"host pool tokens must not be negative, got "
                                 f"{self.host_pool_tokens}")
        if self.policy not in EVICTION_POLICIES:
            raise ChatfleetError(f"unknown eviction policy {self.policy!r}; one of "
                                 f"{', '.join(EVICTION_POLICIES)}")


@dataclass(slots=True)
class TurnOutcome:
    session: str
    turn: int
    prompt_tokens: int
    hit_tokens: int  # not recomputed: device match + host load-back
    host_hit_tokens: int
    ceiling_tokens: int  # what a pool that never evicts would have hit
    wait_s: float
    ttft_s: float
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
    waited: int
    not_admitted: int


@dataclass(slots=True)
class _Live:
    turn: Turn
    outcome: TurnOutcome
    node: Any = None
    prefix_len: int = 0
    start: int = 0  # first prompt token computed
    own: int = 0  # request slots held outside the tree
    decode_batch: int = 1


@dataclass(order=True, slots=True)
class _Event:
    time: float
    seq: int
    kind: int = field(compare=False)  # 0 arrive, 1 prefill done, 2 finish
    index: int = field(compare=False)


def _union_size(seqs: Sequence[array[int]]) -> int:
    """Distinct tokens of a set of sequences in a trie: sum of lengths minus the common
    prefix of each with its predecessor in sorted order."""
    ordered = sorted(s for s in seqs if len(s))
    total, prev = 0, array("q")
    for s in ordered:
        total += len(s) - common_prefix_len(prev, s)
        prev = s
    return total


class Replay:
    """One trace through one cache configuration. Use `run`."""

    def __init__(self, trace: Sequence[Turn], cfg: CacheConfig,
                 step_model: StepTimeModel | None = None) -> None:
        check_trace(trace)
        self.trace = sort_trace(trace)
        self.cfg = cfg
        self.step_model = step_model
        self.pool = KVPool(cfg.pool_tokens)
        self.tree = RadixCache(cfg.policy, cfg.host_pool_tokens)
        self.shadow = RadixCache("lru", 0)  # never evicts: the unbounded pool
        self.by_session = sessions_of(self.trace)
        self.index = {(t.session, t.turn): i for i, t in enumerate(self.trace)}
        # what each turn leaves in the cache that the session's next prompt starts with
        self.keep: dict[int, int] = {}
        for ts in self.by_session.values():
            for a, b in zip(ts, [*ts[1:], None], strict=True):
                kept = 0
                if b is not None:
                    kept = common_prefix_len(a.prompt + a.output[:-1], b.prompt)
                self.keep[self.index[(a.session, a.turn)]] = kept
        self.live: dict[int, _Live] = {}
        self.waiting: list[int] = []
        self.outcomes: list[TurnOutcome | None] = [None] * len(self.trace)
        self.arrived_at: dict[int, float] = {}
        self.session_state: dict[str, array[int]] = {}  # for the working set
        self.ws_samples: list[int] = []
        self.in_flight_peak = 0
        self.waited_ids: set[int] = set()
        self.events: list[_Event] = []
        self._seq = 0

    def _push(self, time: float, kind: int, index: int) -> None:
        self._seq += 1
        heapq.heappush(self.events, _Event(time, self._seq, kind, index))

    def free_tokens(self) -> int:
        return self.pool.capacity_tokens - self.tree.total_size() - self.pool.num_request_tokens

    def _ensure_free(self, tokens: int, now: float) -> None:
        short = tokens - self.free_tokens()
        if short > 0:
            self.tree.evict(short, now)
        if self.free_tokens() < tokens:
            raise RuntimeError("KV pool exhausted: admission let in more than fits")

    def run(self) -> ReplayResult:
        for ts in self.by_session.values():
            first = ts[0]
            self._push(first.time, 0, self.index[(first.session, first.turn)])
        while self.events:
            ev = heapq.heappop(self.events)
            if ev.kind == 0:
                self.arrived_at[ev.index] = ev.time
                self.waiting.append(ev.index)
                self._admit_waiting(ev.time)
            elif ev.kind == 1:
                self._prefill_done(ev.index, ev.time)
            else:
                self._finish(ev.index, ev.time)
                self._admit_waiting(ev.time)
        outcomes = [o for o in self.outcomes if o is not None]
        not_admitted = sum(1 for o in outcomes if not o.admitted)
        samples = self.ws_samples or [0]
        return ReplayResult(
            self.cfg, outcomes, self.tree.num_evicted_tokens, self.tree.num_loaded_back_tokens,
            max(samples), sum(samples) / len(samples), self.in_flight_peak, len(self.waited_ids),
            not_admitted)

    def _admit_waiting(self, now: float) -> None:
        while self.waiting:
            i = self.waiting[0]
            if not self._try_admit(i, now):
                if not self.live:  # nothing will free room: it can never run here
                    self.waiting.pop(0)
                    t = self.trace[i]
                    self.outcomes[i] = TurnOutcome(t.session, t.turn, t.prompt_len, 0, 0, 0,
                                                   0.0, math.inf, admitted=False)
                    self._release_session(t, now)
                    continue
                self.waited_ids.add(i)
                break
            self.waiting.pop(0)

    def _try_admit(self, i: int, now: float) -> bool:
        t = self.trace[i]
        n = t.prompt_len
        m: MatchResult = self.tree.match_prefix(t.prompt, now)
        device_hit = min(m.device_len, n - 1)
        loaded = m.host_len if m.host_len > self.cfg.load_back_threshold else 0
        extend = n - device_hit - loaded
        need = extend + loaded + (t.output_len - 1)
        self.tree.inc_lock_ref(m.node)  # the budget shrinks once the prefix is locked
        if need > self.free_tokens() + self.tree.evictable_size():
            self.tree.dec_lock_ref(m.node)
            return False
        if loaded:
            old = m.node
            self._ensure_free(loaded, now)
            self.tree.load_back(m, now)
            m = self.tree.match_prefix(t.prompt, now)
            self.tree.inc_lock_ref(m.node)
            self.tree.dec_lock_ref(old)
        hit = min(m.device_len, n - 1)
        own = (n - hit) + (t.output_len - 1)
        self._ensure_free(own, now)
        self.pool.allocate(own)
        ceiling = min(self.shadow.match_prefix(t.prompt, now).device_len, n - 1)
        wait = now - self.arrived_at[i]
        prefill = prefill_seconds(self.step_model, hit, n - hit, loaded)
        outcome = TurnOutcome(t.session, t.turn, n, hit, hit - device_hit, ceiling, wait,
                              wait + prefill)
        batch = len(self.live) + 1
        self.live[i] = _Live(t, outcome, m.node, m.device_len, hit, own, batch)
        self.outcomes[i] = outcome
        self.in_flight_peak = max(self.in_flight_peak, len(self.live))
        self.session_state[t.session] = t.prompt + t.output[:-1]
        self.ws_samples.append(_union_size(list(self.session_state.values())))
        self._push(now + prefill, 1, i)
        return True

    def _prefill_done(self, i: int, now: float) -> None:
        r = self.live[i]
        t = r.turn
        new = t.prompt[r.start:]
        if r.prefix_len == r.start:
            _, node = self.tree.insert_below(r.node, new, now)
        else:
            _, node = self.tree.insert_node(t.prompt, now)
        self.shadow.insert(t.prompt, now)
        computed = t.prompt_len - r.start
        self.pool.free(computed)
        r.own -= computed
        self.tree.inc_lock_ref(node)
        self.tree.dec_lock_ref(r.node)
        r.node, r.prefix_len = node, t.prompt_len
        self._push(now + decode_seconds(self.step_model, t.prompt_len, t.output_len,
                                        r.decode_batch), 2, i)

    def _finish(self, i: int, now: float) -> None:
        r = self.live.pop(i)
        t = r.turn
        rest = t.output[:-1]
        self.tree.insert_below(r.node, rest, now)
        self.shadow.insert(t.prompt + rest, now)
        self.tree.dec_lock_ref(r.node)
        self.pool.free(r.own)
        self._release_session(t, now)

    def _release_session(self, t: Turn, now: float) -> None:
        """The session's next turn, or its end."""
        i = self.index[(t.session, t.turn)]
        kept = self.keep[i]
        nxt = self.index.get((t.session, t.turn + 1))
        if nxt is None:
            self.session_state.pop(t.session, None)
            return
        self.session_state[t.session] = (t.prompt + t.output[:-1])[:kept]
        self._push(max(now, self.trace[nxt].time), 0, nxt)


def replay(trace: Sequence[Turn], cfg: CacheConfig,
           step_model: StepTimeModel | None = None) -> ReplayResult:
    return Replay(trace, cfg, step_model).run()


# --------------------------------------------------------------------------------------------
# Summaries and the recommendation
# --------------------------------------------------------------------------------------------


def _rate(num: int, den: int) -> float:
    return num / den if den else 0.0


def summarize(res: ReplayResult, tolerance: float = HOLD_TOLERANCE) -> dict[str, Any]:
    """One entry of the results: hit rates overall and per turn, next to the unbounded pool's
    (ceiling); evictions that returned; TTFT estimates; whether the configuration holds."""
    outs = [o for o in res.outcomes if o.admitted]
    max_turn = max((o.turn for o in res.outcomes), default=0)
    prompt = [0] * max_turn
    hit = [0] * max_turn
    ceil = [0] * max_turn
    returned = [0] * max_turn
    for o in outs:
        k = o.turn - 1
        prompt[k] += o.prompt_tokens
        hit[k] += o.hit_tokens
        ceil[k] += o.ceiling_tokens
        returned[k] += 1 if o.returned_tokens > 0 else 0
    by_turn = [round(_rate(h, p), 4) for h, p in zip(hit, prompt, strict=True)]
    ceil_by_turn = [round(_rate(c, p), 4) for c, p in zip(ceil, prompt, strict=True)]
    short = [k + 1 for k in range(max_turn)
             if prompt[k] and hit[k] / prompt[k] < ceil[k] / prompt[k] - tolerance]
    total_prompt = sum(prompt)
    late = range(max_turn // 2, max_turn)  # the second half of the turns
    late_prompt = sum(prompt[k] for k in late)
    late_gap = _rate(sum(ceil[k] - hit[k] for k in late), late_prompt)
    ttft = percentiles([o.ttft_s for o in outs], (50.0, 90.0, 99.0), scale=1000.0)
    holds = not short and res.not_admitted == 0
    return {
        "pool_tokens": res.config.pool_tokens,
        "policy": res.config.policy,
        "host_pool_tokens": res.config.host_pool_tokens,
        "hit_rate": round(_rate(sum(hit), total_prompt), 4),
        "hit_rate_by_turn": by_turn,
        "ceiling_hit_rate": round(_rate(sum(ceil), total_prompt), 4),
        "ceiling_hit_rate_by_turn": ceil_by_turn,
        "host_hit_rate": round(_rate(sum(o.host_hit_tokens for o in outs), total_prompt), 4),
        "evicted_then_returned": sum(returned),
        "evicted_then_returned_by_turn": returned,
        "evicted_then_returned_tokens": sum(o.returned_tokens for o in outs),
        "evicted_tokens": res.evicted_tokens,
        "loaded_back_tokens": res.loaded_back_tokens,
        "requests": len(res.outcomes),
        "prompt_tokens": total_prompt,
        "waited_for_room": res.waited,
        "not_admitted": res.not_admitted,
        "ttft_ms": {k: round(v, 1) if k != "n" else v for k, v in ttft.items()},
        "late_turn_gap": round(late_gap, 4),
        "holds": holds,
        "thrashes": late_gap > THRASH_GAP and sum(returned) > 0,
        "short_turns": short,
    }


def working_set_block(res: ReplayResult) -> dict[str, Any]:
    return {
        "peak": res.working_set_peak,
        "mean": round(res.working_set_mean, 1),
        "peak_requests_in_flight": res.in_flight_peak,
        "definition": "distinct tokens, at each admission, of every live session's cached "
                      "prefix that its next prompt reuses (shared prompt once), with the "
                      "requests in flight counted whole (prompt + answer); a session is live "
                      "from its first turn until its last turn ends, pauses included",
    }


def recommend(results: Sequence[dict[str, Any]], working_set_peak: int,
              card_pool_tokens: int | None = None) -> dict[str, Any]:
    """The method's rule (docs/facts.md#the-method): grow the pool before changing the eviction
    policy; add a host tier only when the working set is larger than the GPU pool and smaller
    than GPU plus host.

    1. The smallest pool where the default policy (lru, else the first swept) holds without a
       host tier.
    2. Else, at the largest pool: the smallest host tier inside its window (working set >
       pool and <= pool + host) that holds.
    3. Else, at the largest pool without a host tier: another policy that holds (best hit
       rate first).
    4. Else nothing holds: the largest pool with its best entry, and say by how much the
       working set exceeds it."""
    if not results:
        raise ValueError("nothing to recommend from: no results")
    policies = list(dict.fromkeys(r["policy"] for r in results))
    default = DEFAULT_POLICY if DEFAULT_POLICY in policies else policies[0]
    pools = sorted({r["pool_tokens"] for r in results})
    largest = pools[-1]

    def pick(r: dict[str, Any], reason: str) -> dict[str, Any]:
        note = ""
        if card_pool_tokens is not None and r["pool_tokens"] > card_pool_tokens:
            note = (f"; this card's planned pool is {card_pool_tokens} tokens: reaching "
                    f"{r['pool_tokens']} needs FP8 KV cache, FP8 weights or a larger card")
        return {"pool_tokens": r["pool_tokens"], "policy": r["policy"],
                "host_pool_tokens": r["host_pool_tokens"], "hit_rate": r["hit_rate"],
                "reason": reason + note}

    for p in pools:
        for r in results:
            if (r["pool_tokens"] == p and r["policy"] == default and r["host_pool_tokens"] == 0
                    and r["holds"]):
                return pick(r, f"smallest pool where {default} holds every turn within "
                               f"{HOLD_TOLERANCE:.2f} of an unbounded pool, no host tier "
                               f"needed (working set peak {working_set_peak} tokens)")
    in_window = sorted(
        (r for r in results if r["pool_tokens"] == largest and r["policy"] == default
         and r["host_pool_tokens"] > 0
         and largest < working_set_peak <= largest + r["host_pool_tokens"]),
        key=lambda r: int(r["host_pool_tokens"]))
    for r in in_window:
        if r["holds"]:
            return pick(r, f"no swept pool holds with {default}; the working set peak "
                           f"({working_set_peak}) is larger than the largest pool ({largest}) "
                           f"and fits pool + host ({largest + r['host_pool_tokens']}): "
                           f"smallest host tier that holds")
    others = sorted(
        (r for r in results if r["pool_tokens"] == largest and r["host_pool_tokens"] == 0
         and r["policy"] != default and r["holds"]),
        key=lambda r: -float(r["hit_rate"]))
    if others:
        return pick(others[0], f"no swept pool holds with {default} and no host tier in its "
                               f"window holds; grow the pool beyond {largest} if the card "
                               f"allows, else {others[0]['policy']} holds at {largest}")
    at_largest = [r for r in results if r["pool_tokens"] == largest
                  and (r["host_pool_tokens"] == 0
                       or largest < working_set_peak <= largest + r["host_pool_tokens"])]
    best = max(at_largest or list(results), key=lambda r: float(r["hit_rate"]))
    return pick(best, f"nothing swept holds: grow the pool past {largest} tokens (the working "
                      f"set peaks at {working_set_peak}, plus what requests in flight hold); "
                      f"best swept: hit rate {best['hit_rate']:.3f}")


def cache_document(trace_info: dict[str, Any], target: dict[str, Any],
                   reference: ReplayResult, results: list[dict[str, Any]],
                   card_pool_tokens: int | None = None) -> dict[str, Any]:
    ws = working_set_block(reference)
    ref = summarize(reference)
    return {
        "schema": SCHEMA,
        "trace": trace_info,
        "target": target,
        "working_set_tokens": ws,
        "unbounded": {"hit_rate": ref["hit_rate"], "hit_rate_by_turn": ref["hit_rate_by_turn"],
                      "ttft_ms": ref["ttft_ms"]},
        "hold_tolerance": HOLD_TOLERANCE,
        "thrash_gap": THRASH_GAP,
        "results": results,
        "recommendation": recommend(results, ws["peak"], card_pool_tokens),
    }


def unbounded_pool(trace: Sequence[Turn]) -> int:
    """A pool no trace can fill: every token of every turn, plus one."""
    return sum(t.prompt_len + t.output_len for t in trace) + 1
