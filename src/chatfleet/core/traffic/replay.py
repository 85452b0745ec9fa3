"""The twin's driver for a trace (`TraceLoop`): it offers one segment's lines to the fleet as
the product's users sent them, and counts what became of them.

- A session arrives at its first line's time (sessions in the order of their first line).
- Its next line follows the previous one after the gap the trace holds between the two
  lines' times, but never before the previous line's answer ended or its 429 came back: a
  user cannot answer an answer not yet seen. So a slower fleet delays a session's later turns
  as it would live, and a faster one sends them when the trace did.
- A line that repeats a turn (`attempt` > 0: a client's retry after a 429, as a gateway logged
  it) is offered only while that turn has no answer in the replay; the replay itself never
  retries a shed turn (the lines are the traffic).
- Prompts are made of segments as the synthetic workload's are (core/workload/sessions.py):
  the shared system prompt (the first `shared_prefix_tokens` of every prompt, the same for
  every session), then one segment per new part. A line whose prompt holds the previous
  answered turn's prompt and answer reuses both (its new part is the rest); one that holds
  the previous prompt but not the answer (thinking, an edited answer) reuses the prompt; a
  shorter one starts afresh (a truncated history). Only the lengths are replayed: a line's
  token ids or text count as their length.
"""

from __future__ import annotations

from array import array

from chatfleet.core.records import RequestRecord
from chatfleet.core.traffic.columns import Segment
from chatfleet.core.traffic.tally import ReplayTally
from chatfleet.core.workload.sessions import RequestSpec, segment_tokens

SYSTEM_SEGMENT = 1  # the shared system prompt's segment id (its group 0)

Segments = tuple[tuple[int, int], ...]


class TraceLoop:
    """A segment's lines, offered to the fleet twin (twin/fleet.py drives it as it drives an
    open loop: `next_arrival`, `on_done`, and `on_shed`); every record of a served or shed
    line comes back through `record`, which counts the counted ones."""

    mode = "trace"

    def __init__(self, segment: Segment, shared_prefix_tokens: int, tally: ReplayTally) -> None:
        self.segment = segment
        self.shared = shared_prefix_tokens
        self.tally = tally
        self.offsets: list[int] = segment.offsets.tolist()
        self.rank: list[int] = segment.rank.tolist()
        self.time: list[float] = segment.time.tolist()
        self.prompt: list[int] = segment.prompt.tolist()
        self.output: list[int] = segment.output.tolist()
        self.key: list[int] = segment.key.tolist()
        self.counted: list[bool] = segment.counted.tolist()
        self.continues: list[bool] = segment.continues.tolist()
        self.names = segment.session_names
        self.keys = segment.keys
        self._next_session = 0
        self._next_segment = SYSTEM_SEGMENT + 1
        self._system_ids: array[int] | None = (
            segment_tokens(((SYSTEM_SEGMENT, shared_prefix_tokens),))
            if shared_prefix_tokens else None)
        self._row_of: dict[str, int] = {}  # request id -> its line
        self._session_of: dict[str, int] = {}
        self._answered: dict[int, int] = {}  # session -> rank of its last answered turn
        self._history: dict[int, tuple[Segments, int, tuple[int, int]]] = {}
        self._current: dict[int, tuple[int, Segments]] = {}  # session -> (rank, its prompt)
        self.opened: list[float] = []  # per session: when its first line arrived
        self.closed: list[float] = []  # ... and when its last line ended (inf: it goes on)

    # --- the driver's interface -------------------------------------------------------------
    def next_arrival(self, now: float) -> RequestSpec | None:
        """The next session's first line, or None when every session has arrived."""
        j = self._next_session
        if j >= len(self.names):
            return None
        self._next_session = j + 1
        row = self.offsets[j]
        self.opened.append(self.time[row])
        self.closed.append(float("inf"))
        return self._spec(j, row, self.time[row])

    def on_done(self, spec: RequestSpec, now: float) -> RequestSpec | None:
        """The session's next line after an answer (its retries of this turn skipped)."""
        row = self._row_of.pop(spec.request_id)
        j = self._session_of.pop(spec.request_id)
        rank = self.rank[row]
        self._answered[j] = rank
        self._history[j] = (spec.segments, spec.prompt_len, spec.output_segments[-1])
        nxt = row + 1
        end = self.offsets[j + 1]
        while nxt < end and self.rank[nxt] == rank:
            nxt += 1
        return self._follow(j, row, nxt, spec.scheduled_time, now)

    def on_shed(self, spec: RequestSpec, now: float) -> RequestSpec | None:
        """The session's next line after a 429: its retry of the turn, or its next turn."""
        row = self._row_of.pop(spec.request_id)
        j = self._session_of.pop(spec.request_id)
        return self._follow(j, row, row + 1, spec.scheduled_time, now)

    def key_of(self, spec: RequestSpec) -> str | None:
        k = self.key[self._row_of[spec.request_id]]
        return None if k < 0 else self.keys[k]

    def record(self, rec: RequestRecord) -> None:
        """A served, shed or unfinished line's record, given before `on_done` or `on_shed`
        (while its line is known)."""
        self.tally.add(rec, self.counted[self._row_of[rec.request_id]])

    # --- the lines ----------------------------------------------------------------------------
    def _follow(self, j: int, row: int, nxt: int, sent: float,
                now: float) -> RequestSpec | None:
        if nxt >= self.offsets[j + 1]:
            if not self.continues[j]:
                self.closed[j] = now
            return None
        return self._spec(j, nxt, max(now, sent + self.time[nxt] - self.time[row]))

    def _new(self, n: int) -> tuple[int, int]:
        sid = self._next_segment
        self._next_segment = sid + 1
        return (sid, n)

    def _fresh(self, n: int) -> Segments:
        shared = min(n, self.shared)
        segs: list[tuple[int, int]] = [(SYSTEM_SEGMENT, shared)] if shared else []
        if n > shared:
            segs.append(self._new(n - shared))
        return tuple(segs)

    def _prompt(self, j: int, rank: int, n: int) -> Segments:
        current = self._current.get(j)
        if current is not None and current[0] == rank:
            return current[1]  # a retry: the same prompt
        hist = self._history.get(j)
        if hist is None or n < hist[1]:
            segs = self._fresh(n)
        else:
            before, before_len, answer = hist
            base, base_len = before, before_len
            if n >= before_len + answer[1]:
                base, base_len = (*before, answer), before_len + answer[1]
            segs = base if n == base_len else (*base, self._new(n - base_len))
        self._current[j] = (rank, segs)
        return segs

    def _spec(self, j: int, row: int, at: float) -> RequestSpec:
        rank = self.rank[row]
        segs = self._prompt(j, rank, self.prompt[row])
        out = self.output[row]
        rid = f"t{row}"
        self._row_of[rid] = row
        self._session_of[rid] = j
        first = self._system_ids if segs and segs[0] == (SYSTEM_SEGMENT, self.shared) else None
        return RequestSpec(rid, self.names[j], j, rank, 0, segs, (self._new(out),), out, at,
                           first)
