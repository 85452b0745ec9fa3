"""Workloads: shared system prompts, prompt groups, multi-turn sessions, length distributions,
closed-loop users and open-loop arrivals. Everything is seeded through a `random.Random`.

A prompt is a list of segments, each (segment id, token count): the shared system prompt of a
group, then for every earlier turn the user's message and the answer's content (Qwen3's chat
template drops earlier turns' reasoning, so a returning session's cached prefix ends before the
last answer's reasoning), then the new user message. The twin turns segments into synthetic
token ids (`segment_tokens`); a live client turns them into text of the same token counts.
Chat-template tokens around turns are not counted (a few per turn).
"""

from __future__ import annotations

import itertools
import math
import random
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from chatfleet.core.documents.sweep import ClosedLoad, Load

LengthKind = Literal["fixed", "uniform", "sharegpt", "file"]
RangeConvention = Literal["sglang", "vllm"]
GroupDraw = Literal["round-robin", "user", "request"]
GROUP_DRAWS: tuple[GroupDraw, ...] = ("round-robin", "user", "request")

# Synthetic token ids: token j of segment s is (s x 7919 + j x 104729) mod 151643, so every
# id is an ordinary Qwen3 vocabulary id (below the special tokens) and the same prompts can be
# sent to a live engine as token ids; the first tokens of two segments differ whenever their
# ids differ modulo 151643, so segments never share a spurious cached prefix.
SYNTH_VOCAB = 151643
_SEG_MUL = 7919
_POS_MUL = 104729


class WorkloadError(ValueError):
    """A workload parameter that cannot describe real traffic."""


@dataclass(frozen=True, slots=True)
class LengthSpec:
    """How long each user message (input) and answer (output) is.

    - fixed: every request `input_len` in, `output_len` out.
    - uniform, sglang convention (bench_serving --random-range-ratio r): uniform integers in
      [max(int(len * r), 1), len].
    - uniform, vllm convention (vllm bench serve --random-range-ratio r): uniform integers in
      [floor(len * (1 - r)), ceil(len * (1 + r))].
    - sharegpt / file: (input, output) pairs drawn uniformly from `pairs` (ShareGPT-derived or a
      user's file; loaded by the shell and passed in).
    """

    kind: LengthKind = "fixed"
    input_len: int = 512
    output_len: int = 128
    range_ratio: float = 0.0
    convention: RangeConvention = "sglang"
    pairs: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        if self.kind in ("fixed", "uniform") and (self.input_len <= 0 or self.output_len <= 0):
            raise WorkloadError("input and output lengths must be positive")
        if self.kind == "uniform":
            if self.convention not in ("sglang", "vllm"):
                raise WorkloadError(f"unknown range convention {self.convention!r}")
            top_ok = self.range_ratio <= 1.0 if self.convention == "sglang" else (
                self.range_ratio < 1.0)
            if not (self.range_ratio >= 0.0 and top_ok):
                raise WorkloadError(
                    f"range ratio {self.range_ratio} is outside [0, 1] (sglang) / [0, 1) (vllm)")
        if self.kind in ("sharegpt", "file"):
            if not self.pairs:
                raise WorkloadError(f"{self.kind} lengths need at least one (input, output) pair")
            if any(i <= 0 or o <= 0 for i, o in self.pairs):
                raise WorkloadError("every length pair must be positive")

    def sample(self, rng: random.Random) -> tuple[int, int]:
        if self.kind == "fixed":
            return self.input_len, self.output_len
        if self.kind == "uniform":
            return self._uniform(rng, self.input_len), self._uniform(rng, self.output_len)
        return self.pairs[rng.randrange(len(self.pairs))]

    def _uniform(self, rng: random.Random, n: int) -> int:
        """A uniform integer in the convention's closed range."""
        r = self.range_ratio
        if self.convention == "sglang":
            lo, hi = max(int(n * r), 1), n
        else:
            lo, hi = max(1, math.floor(n * (1 - r))), math.ceil(n * (1 + r))
        return lo + int(rng.random() * (hi - lo + 1))

    def max_lengths(self) -> tuple[int, int]:
        if self.kind == "fixed":
            return self.input_len, self.output_len
        if self.kind == "uniform":
            if self.convention == "sglang":
                return self.input_len, self.output_len
            r = self.range_ratio
            return math.ceil(self.input_len * (1 + r)), math.ceil(self.output_len * (1 + r))
        return max(i for i, _ in self.pairs), max(o for _, o in self.pairs)

    def to_json(self) -> dict[str, object]:
        d: dict[str, object] = {"kind": self.kind}
        if self.kind in ("fixed", "uniform"):
            d.update(input_len=self.input_len, output_len=self.output_len)
        if self.kind == "uniform":
            d.update(range_ratio=self.range_ratio, convention=self.convention)
        if self.kind in ("sharegpt", "file"):
            ins = [i for i, _ in self.pairs]
            outs = [o for _, o in self.pairs]
            d.update(num_pairs=len(self.pairs), mean_input_len=round(sum(ins) / len(ins), 1),
                     mean_output_len=round(sum(outs) / len(outs), 1))
        return d


@dataclass(frozen=True, slots=True)
class WorkloadConfig:
    system_prompt_tokens: int = 2048
    prompt_groups: int = 1
    # how a session gets its prompt group (Workload.new_session): round-robin over sessions in
    # creation order; "user": user u's sessions are all in group u mod G; "request": each
    # session draws its group uniformly from all G with its own generator (with one turn per
    # session, each request: SGLang's generated-shared-prefix workload)
    group_draw: GroupDraw = "round-robin"
    lengths: LengthSpec = field(default_factory=LengthSpec)
    turns: int = 1
    think_time_s: float = 0.0  # mean pause between a turn's last token and the next turn
    think_dist: Literal["fixed", "exp"] = "exp"
    reasoning_share: float = 0.0  # 0: thinking off; else share of each answer that is reasoning
    ignore_eos: bool = True  # the answer runs to its sampled length; max_tokens = that length
    ramp_up_s: float = 0.0  # closed loop: user i starts at i / users * ramp_up_s

    def __post_init__(self) -> None:
        if self.system_prompt_tokens < 0:
            raise WorkloadError("system prompt tokens must not be negative")
        if self.prompt_groups <= 0:
            raise WorkloadError("prompt groups must be at least 1")
        if self.group_draw not in GROUP_DRAWS:
            raise WorkloadError(f"unknown group draw {self.group_draw!r}; choose "
                                f"{', '.join(GROUP_DRAWS)}")
        if self.turns <= 0:
            raise WorkloadError("turns must be at least 1")
        if self.think_time_s < 0 or self.ramp_up_s < 0:
            raise WorkloadError("think time and ramp-up must not be negative")
        if not 0.0 <= self.reasoning_share < 1.0:
            raise WorkloadError("reasoning share must be in [0, 1)")

    def max_context_tokens(self) -> int:
        """The longest prompt plus answer a session can reach."""
        i, o = self.lengths.max_lengths()
        return self.system_prompt_tokens + self.turns * i + (self.turns - 1) * o + o

    def to_json(self) -> dict[str, object]:
        return {
            "system_prompt_tokens": self.system_prompt_tokens,
            "prompt_groups": self.prompt_groups,
            "group_draw": self.group_draw,
            "lengths": self.lengths.to_json(),
            "turns": self.turns,
            "think_time_s": self.think_time_s,
            "think_dist": self.think_dist,
            "thinking": self.reasoning_share > 0,
            "reasoning_share": self.reasoning_share,
            "ignore_eos": self.ignore_eos,
            "ramp_up_s": self.ramp_up_s,
        }


def segment_tokens(segments: Sequence[tuple[int, int]]) -> array[int]:
    """Synthetic token ids for a list of (segment id, length), as array('q')."""
    out = array("q")
    for sid, n in segments:
        ids = (sid * _SEG_MUL + np.arange(n, dtype=np.int64) * _POS_MUL) % SYNTH_VOCAB
        out.frombytes(ids.tobytes())
    return out


@dataclass(slots=True)
class RequestSpec:
    request_id: str
    session_id: str
    user: int
    turn: int
    group: int
    segments: tuple[tuple[int, int], ...]
    output_segments: tuple[tuple[int, int], ...]  # reasoning (if any), then content
    max_new_tokens: int
    scheduled_time: float = 0.0

    @property
    def prompt_len(self) -> int:
        return sum(n for _, n in self.segments)

    @property
    def output_len(self) -> int:
        return sum(n for _, n in self.output_segments)

    def prompt_ids(self) -> array[int]:
        return segment_tokens(self.segments)

    def output_ids(self) -> array[int]:
        return segment_tokens(self.output_segments)


@dataclass(slots=True)
class Session:
    session_id: str
    user: int
    group: int
    history: list[tuple[int, int]]
    turn: int = 0
    rng: random.Random | None = None  # the session's own draws (lengths, think times)


class Workload:
    """Makes sessions and their turns. Segment ids are allocated in order, so the same seed
    gives the same token ids.

    Each session draws its lengths and think times (and, with `group_draw="request"`, its
    prompt group) from its own generator, seeded from the workload's seed, the user and the
    user's session count; `rng` itself only draws arrival times. So a session's requests do
    not depend on the order in which other sessions finish: the twin and a live run (where
    completions that tie in the model land in either order) offer the same trace. The one
    exception is the default round-robin group of a closed loop's later sessions, which
    follows creation order (`draw_group`)."""

    def __init__(self, cfg: WorkloadConfig, rng: random.Random) -> None:
        self.cfg = cfg
        self.rng = rng
        self._base_seed = rng.getrandbits(64)
        self._next_segment = cfg.prompt_groups + 1  # 1..G are the shared system prompts
        self._num_sessions = 0
        self._num_requests = 0
        self._sessions_of_user: dict[int, int] = {}

    def draw_group(self, user: int, session_index: int, rng: random.Random) -> int:
        """The prompt group of a new session (`session_index`: sessions created so far; `rng`:
        the session's own generator).

        - round-robin: session i is in group i mod G, in creation order (the working set of
          shared prefixes is all G prompts even with fewer users than groups; a closed loop's
          creation order follows completions, so a live run may order it differently);
        - user: user u's sessions are all in group u mod G (fewer users than groups leave
          groups unused);
        - request: uniform over all G, drawn from the session's generator, so the same seed
          gives each session the same group whatever the order of completions. SGLang's
          generated-shared-prefix benchmark shuffles its G x prompts-per-group requests, so a
          request's group is random and independent of which client slot sends it; it deals
          each group exactly prompts-per-group times, where independent draws only balance
          on average."""
        g = self.cfg.prompt_groups
        if self.cfg.group_draw == "user":
            return user % g
        if self.cfg.group_draw == "request":
            return rng.randrange(g)
        return session_index % g

    def system_segment(self, group: int) -> tuple[int, int]:
        return (group + 1, self.cfg.system_prompt_tokens)

    def _segment(self, n: int) -> tuple[int, int]:
        sid = self._next_segment
        self._next_segment += 1
        return (sid, n)

    def new_session(self, user: int) -> Session:
        """User u's k-th session is "s{u+1}" (k = 0) or "s{u+1}.{k}", whatever the order of
        creation; its prompt group is `draw_group`'s."""
        k = self._sessions_of_user.get(user, 0)
        self._sessions_of_user[user] = k + 1
        rng = random.Random(f"{self._base_seed}/{user}/{k}")
        group = self.draw_group(user, self._num_sessions, rng)
        self._num_sessions += 1
        history = [self.system_segment(group)] if self.cfg.system_prompt_tokens else []
        name = f"s{user + 1}" if k == 0 else f"s{user + 1}.{k}"
        return Session(name, user, group, history, rng=rng)

    def next_turn(self, session: Session, scheduled_time: float) -> RequestSpec:
        """The session's next request; its answer's content joins the session's history."""
        in_len, out_len = self.cfg.lengths.sample(session.rng or self.rng)
        user_seg = self._segment(in_len)
        segments = (*session.history, user_seg)
        reasoning = int(out_len * self.cfg.reasoning_share)
        content = out_len - reasoning
        out_segs: list[tuple[int, int]] = []
        if reasoning > 0:
            out_segs.append(self._segment(reasoning))
        content_seg = self._segment(content) if content > 0 else None
        if content_seg is not None:
            out_segs.append(content_seg)
        session.history.append(user_seg)
        if content_seg is not None:
            session.history.append(content_seg)
        self._num_requests += 1
        spec = RequestSpec(
            request_id=f"r{self._num_requests}",
            session_id=session.session_id,
            user=session.user,
            turn=session.turn,
            group=session.group,
            segments=segments,
            output_segments=tuple(out_segs),
            max_new_tokens=out_len,
            scheduled_time=scheduled_time,
        )
        session.turn += 1
        return spec

    def think_time(self, session: Session | None = None) -> float:
        mean = self.cfg.think_time_s
        if mean <= 0:
            return 0.0
        if self.cfg.think_dist == "fixed":
            return mean
        rng = session.rng if session is not None and session.rng is not None else self.rng
        return rng.expovariate(1.0 / mean)


class ClosedLoop:
    """N users; each sends a turn, waits for its last token, thinks, sends the next turn; after
    its last turn it starts a new session. All start at once unless a ramp-up is asked for."""

    mode = "closed"

    def __init__(self, workload: Workload, users: int) -> None:
        if users <= 0:
            raise WorkloadError("concurrency must be at least 1")
        self.workload = workload
        self.users = users
        self.sessions: dict[int, Session] = {}

    def start(self) -> list[RequestSpec]:
        out = []
        ramp = self.workload.cfg.ramp_up_s
        for u in range(self.users):
            t = ramp * u / self.users if ramp else 0.0
            s = self.workload.new_session(u)
            self.sessions[u] = s
            out.append(self.workload.next_turn(s, t))
        return out

    def on_done(self, spec: RequestSpec, now: float) -> RequestSpec:
        """The user's next request, scheduled after its think time."""
        s = self.sessions[spec.user]
        think = self.workload.think_time(s)
        if s.turn >= self.workload.cfg.turns:
            s = self.workload.new_session(spec.user)
            self.sessions[spec.user] = s
        return self.workload.next_turn(s, now + think)


class OpenLoop:
    """Sessions arrive on a schedule whatever the server does: Poisson at `rate` per second,
    or gamma with burstiness B (shape B, mean 1 / rate; B < 1 is burstier, as in vLLM's
    bench). A session's later turns follow its previous answer after the think time."""

    mode = "open"

    def __init__(self, workload: Workload, rate: float, burstiness: float = 1.0,
                 arrival_times: Sequence[float] | None = None) -> None:
        """`arrival_times`, when given, is the trace of session arrivals (sorted, in
        seconds): sessions arrive exactly then, and `rate` only labels the load."""
        if rate <= 0:
            raise WorkloadError("arrival rate must be positive")
        if burstiness <= 0:
            raise WorkloadError("burstiness must be positive")
        if arrival_times is not None and any(
                b < a for a, b in itertools.pairwise(arrival_times)):
            raise WorkloadError("arrival times must be sorted")
        self.workload = workload
        self.rate = rate
        self.burstiness = burstiness
        self.arrival_times = list(arrival_times) if arrival_times is not None else None
        self._sessions: dict[str, Session] = {}
        self._users = 0

    def interarrival(self) -> float:
        rng = self.workload.rng
        if self.burstiness == 1.0:
            return rng.expovariate(self.rate)
        return rng.gammavariate(self.burstiness, 1.0 / (self.rate * self.burstiness))

    def next_arrival(self, now: float) -> RequestSpec:
        """A new session's first turn, arriving one inter-arrival time after `now` (or at
        the trace's next arrival time; after the trace's last, at infinity)."""
        if self.arrival_times is not None:
            i = self._users
            t = self.arrival_times[i] if i < len(self.arrival_times) else math.inf
        else:
            t = now + self.interarrival()
        s = self.workload.new_session(self._users)
        self._users += 1
        self._sessions[s.session_id] = s
        return self.workload.next_turn(s, t)

    def on_done(self, spec: RequestSpec, now: float) -> RequestSpec | None:
        s = self._sessions.get(spec.session_id)
        if s is None:
            return None
        if s.turn >= self.workload.cfg.turns:
            del self._sessions[spec.session_id]
            return None
        return self.workload.next_turn(s, now + self.workload.think_time(s))


def driver_for(load: Load, workload: Workload,
               arrival_times: Sequence[float] | None = None) -> ClosedLoop | OpenLoop:
    """The driver a load point names: a closed loop of `concurrency` users, or an open loop at
    `rate_rps` (gamma with shape `burstiness` where it is set, else Poisson); `arrival_times`
    makes an open loop follow a trace."""
    if isinstance(load, ClosedLoad):
        return ClosedLoop(workload, load.concurrency)
    burstiness = 1.0 if load.burstiness is None else float(load.burstiness)
    return OpenLoop(workload, float(load.rate_rps), burstiness, arrival_times)
