"""Sessions and their turns: `Workload` makes each session's requests, seeded through a
`random.Random`.

A prompt is a list of segments, each (segment id, token count): the shared system prompt of a
group, then for every earlier turn the user's message and the answer's content (Qwen3's chat
template drops earlier turns' reasoning, so a returning session's cached prefix ends before the
last answer's reasoning), then the new user message. The twin turns segments into synthetic
token ids (`segment_tokens`); a live client turns them into text of the same token counts.
Chat-template tokens around turns are not counted (a few per turn).
"""

from __future__ import annotations

import random
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from chatfleet.core.workload.config import WorkloadConfig

# Synthetic token ids: token j of segment s is (s x 7919 + j x 104729) mod 151643, so every
# id is an ordinary Qwen3 vocabulary id (below the special tokens) and the same prompts can be
# sent to a live engine as token ids; the first tokens of two segments differ whenever their
# ids differ modulo 151643, so segments never share a spurious cached prefix.
SYNTH_VOCAB = 151643
_SEG_MUL = 7919
_POS_MUL = 104729
# 104729 is invertible mod 151643, so (s x 7919 + j x 104729) mod V = ((k + j) x 104729) mod V
# with k = (s x 7919) x 104729^-1 mod V: a segment's ids are the run k, k+1, ... of the one
# table i x 104729 mod V. The table holds two periods, so any run of up to V ids is one slice
# of it (a copy of bytes, with no arithmetic per token).
_POS_INV = pow(_POS_MUL, -1, SYNTH_VOCAB)
_TABLE = memoryview(((np.arange(2 * SYNTH_VOCAB, dtype=np.int64) % SYNTH_VOCAB * _POS_MUL)
                     % SYNTH_VOCAB).tobytes())
_ID_BYTES = 8  # array('q')


def segment_tokens(segments: Sequence[tuple[int, int]]) -> array[int]:
    """Synthetic token ids for a list of (segment id, length), as array('q')."""
    out = array("q")
    for sid, n in segments:
        out.frombytes(_segment_bytes(sid, n))
    return out


def _segment_bytes(sid: int, n: int) -> memoryview | bytes:
    """One segment's ids as array('q') bytes."""
    k = sid * _SEG_MUL % SYNTH_VOCAB * _POS_INV % SYNTH_VOCAB
    if n <= SYNTH_VOCAB:
        return _TABLE[k * _ID_BYTES: (k + n) * _ID_BYTES]
    ids = (sid * _SEG_MUL + np.arange(n, dtype=np.int64) * _POS_MUL) % SYNTH_VOCAB
    return ids.tobytes()


@dataclass(slots=True, init=False)
class RequestSpec:
    request_id: str
    session_id: str
    user: int
    turn: int
    group: int
    segments: tuple[tuple[int, int], ...]
    output_segments: tuple[tuple[int, int], ...]  # reasoning (if any), then content
    max_new_tokens: int
    scheduled_time: float
    # the first segment's token ids (the group's system prompt), shared by every request that
    # starts with it; None: prompt_ids() builds them too. Not part of the spec's value.
    first_ids: array[int] | None = field(repr=False, compare=False)

    # __init__ written out (init=False): chatfleet/_native.py says why
    def __init__(self, request_id: str, session_id: str, user: int, turn: int, group: int,
                 segments: tuple[tuple[int, int], ...],
                 output_segments: tuple[tuple[int, int], ...], max_new_tokens: int,
                 scheduled_time: float = 0.0, first_ids: array[int] | None = None) -> None:
        self.request_id = request_id
        self.session_id = session_id
        self.user = user
        self.turn = turn
        self.group = group
        self.segments = segments
        self.output_segments = output_segments
        self.max_new_tokens = max_new_tokens
        self.scheduled_time = scheduled_time
        self.first_ids = first_ids

    @property
    def prompt_len(self) -> int:
        return sum(n for _, n in self.segments)

    @property
    def output_len(self) -> int:
        return sum(n for _, n in self.output_segments)

    def prompt_ids(self) -> array[int]:
        if self.first_ids is None:
            return segment_tokens(self.segments)
        # one allocation of the whole prompt, where appending the rest to a copy of the first
        # segment grew (moved) it: the twin builds every request's prompt
        return self.first_ids + segment_tokens(self.segments[1:])

    def output_ids(self) -> array[int]:
        return segment_tokens(self.output_segments)


@dataclass(slots=True, init=False)
class Session:
    session_id: str
    user: int
    group: int
    history: list[tuple[int, int]]
    turn: int
    rng: random.Random | None  # the session's own draws (lengths, think times)

    # __init__ written out (init=False): chatfleet/_native.py says why
    def __init__(self, session_id: str, user: int, group: int, history: list[tuple[int, int]],
                 turn: int = 0, rng: random.Random | None = None) -> None:
        self.session_id = session_id
        self.user = user
        self.group = group
        self.history = history
        self.turn = turn
        self.rng = rng


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
        self._lengths = cfg.lengths.sampler()
        self._system_ids: dict[int, array[int]] = {}  # by group, built at its first request

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

    def system_ids(self, group: int) -> array[int] | None:
        """The token ids of the group's system prompt (None without one), built once."""
        if not self.cfg.system_prompt_tokens:
            return None
        ids = self._system_ids.get(group)
        if ids is None:
            ids = self._system_ids[group] = segment_tokens((self.system_segment(group),))
        return ids

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
        in_len, out_len = self._lengths.sample(session.rng or self.rng)
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
            first_ids=self.system_ids(session.group),  # history[0] is the system prompt
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
