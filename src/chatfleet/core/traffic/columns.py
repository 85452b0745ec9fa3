"""A trace in columns (`Trace`): one numpy array per field, so that a day of a fleet's traffic
(a million turns) fits in tens of megabytes and is cut, scaled and split without a loop per
turn in Python.

- `Trace.build(rows)`: from the checked rows (core/traffic/trace.py), refusing a session whose
  (turn, attempt) appears twice, with the line of the second;
- `window(start, end)`: the turns sent in [start, end) seconds of the trace (its first line
  at 0), the window's start becoming 0: a busy hour of a day;
- `scaled(k)`: each session starts k times sooner (its start time / k) and keeps its own
  pace (the gaps between its turns): k times as many sessions an hour, the same users;
- `segments(length, lead_in)`: the trace cut into consecutive windows of `length` seconds,
  each replayed on its own from `lead_in` seconds before its start (turns sent then warm the
  fleet, its caches and its queue, and are not counted), so that the hours of a day run at
  once on several cores.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from chatfleet.core.traffic.trace import TraceError, TraceRow

IntArray = NDArray[np.int64]
FloatArray = NDArray[np.float64]
BoolArray = NDArray[np.bool_]
NO_PRIORITY = -(2**62)  # the priority column where a line gave none
HOUR_S = 3600.0


@dataclass(frozen=True, slots=True)
class Trace:
    """The trace's turns (one entry per line, in the file's order). `time` is seconds after
    the trace's first line (`origin`, in the file's own clock); `rank` is a turn's 0-based
    place among its session's turns; `output` is 0 where the line gave no length."""

    source: str
    sessions: tuple[str, ...]  # names, by session index
    keys: tuple[str, ...]  # API keys, by key index
    session: IntArray
    turn: IntArray
    rank: IntArray
    attempt: IntArray
    time: FloatArray
    prompt: IntArray
    output: IntArray
    key: IntArray  # -1: none
    priority: IntArray  # NO_PRIORITY: none
    line: IntArray
    origin: float = 0.0
    # what was done to it: [start, end) of the window taken, the time scale
    window: tuple[float, float] | None = None
    time_scale: float = 1.0
    ids: tuple[Any, ...] | None = field(default=None, compare=False)  # prompt ids (the cache)

    @property
    def num_lines(self) -> int:
        return int(self.time.size)

    @classmethod
    def build(cls, rows: Iterable[tuple[int, TraceRow]], source: str,
              keep_ids: bool = False) -> Trace:
        """From (line number, row) pairs. `keep_ids`: keep each line's prompt ids (None where
        it gave a count), for the cache's replay."""
        names: dict[str, int] = {}
        keys: dict[str, int] = {}
        cols: dict[str, list[Any]] = {k: [] for k in (
            "session", "turn", "attempt", "time", "prompt", "output", "key", "priority",
            "line")}
        ids: list[Any] = []
        for line, r in rows:
            cols["session"].append(names.setdefault(r.session, len(names)))
            cols["turn"].append(r.turn)
            cols["attempt"].append(r.attempt)
            cols["time"].append(r.time)
            cols["prompt"].append(r.prompt_tokens)
            cols["output"].append(r.output_tokens or 0)
            cols["key"].append(-1 if r.api_key is None else keys.setdefault(r.api_key,
                                                                            len(keys)))
            cols["priority"].append(NO_PRIORITY if r.priority is None else r.priority)
            cols["line"].append(line)
            if keep_ids:
                ids.append(r.prompt)
        if not cols["time"]:
            raise TraceError(f"{source}: no turns in the file")
        arr = {k: np.asarray(v, dtype=np.int64) for k, v in cols.items() if k != "time"}
        time = np.asarray(cols["time"], dtype=np.float64)
        origin = float(time.min())
        trace = cls(source=source, sessions=tuple(names), keys=tuple(keys),
                    session=arr["session"], turn=arr["turn"],
                    rank=np.zeros_like(arr["turn"]), attempt=arr["attempt"],
                    time=time - origin, prompt=arr["prompt"], output=arr["output"],
                    key=arr["key"], priority=arr["priority"], line=arr["line"], origin=origin,
                    ids=tuple(ids) if keep_ids else None)
        return replace(trace, rank=trace._ranks())

    def _ranks(self) -> IntArray:
        """Each line's turn rank in its session, refusing a repeated (turn, attempt)."""
        order = np.lexsort((self.attempt, self.turn, self.session))
        s, t, a = self.session[order], self.turn[order], self.attempt[order]
        same = (s[1:] == s[:-1]) & (t[1:] == t[:-1])
        dup = same & (a[1:] == a[:-1])
        if dup.any():
            i = int(order[int(np.flatnonzero(dup)[0]) + 1])
            what = (f"turn {self.turn[i]}" if not self.attempt[i]
                    else f"turn {self.turn[i]} attempt {self.attempt[i]}")
            raise TraceError(f"{self.source}, line {self.line[i]}: session "
                             f"{self.sessions[self.session[i]]!r} {what} appears twice")
        new_session = np.concatenate(([True], s[1:] != s[:-1]))
        new_turn = np.concatenate(([True], ~same))
        counter = np.cumsum(new_turn)  # turns so far, over all sessions
        first_of_session = np.maximum.accumulate(np.where(new_session, counter, 0))
        ranks = np.empty_like(self.turn)
        ranks[order] = counter - first_of_session
        return ranks

    def take(self, mask: BoolArray | IntArray) -> Trace:
        """The lines `mask` selects (a boolean mask or indices), the rest of the trace kept."""
        ids = None if self.ids is None else tuple(
            self.ids[i] for i in (np.flatnonzero(mask) if mask.dtype == np.bool_ else mask))
        return replace(self, session=self.session[mask], turn=self.turn[mask],
                       rank=self.rank[mask], attempt=self.attempt[mask], time=self.time[mask],
                       prompt=self.prompt[mask], output=self.output[mask], key=self.key[mask],
                       priority=self.priority[mask], line=self.line[mask], ids=ids)

    def with_output(self, default: int) -> Trace:
        """Lines without an answer length get `default`."""
        return replace(self, output=np.where(self.output > 0, self.output, default))

    @property
    def span_s(self) -> float:
        return float(self.time.max() - self.time.min()) if self.time.size else 0.0

    def windowed(self, start: float, end: float) -> Trace:
        """The lines sent in [start, end) (seconds after the first line); times then count
        from `start`. A session already under way joins at its first turn inside."""
        if not (0 <= start < end):
            raise TraceError(f"a window needs 0 <= start < end, got {start:g}-{end:g}")
        picked = self.take((self.time >= start) & (self.time < end))
        if not picked.num_lines:
            raise TraceError(f"{self.source}: no turn was sent in the window {start:g}-{end:g} "
                             f"s (the trace spans {self.span_s:g} s)")
        return replace(picked, time=picked.time - start, window=(start, end))

    def scaled(self, k: float) -> Trace:
        """Each session starts at its first line's time / k and keeps its gaps: k times the
        sessions per hour. k = 1 leaves the trace as it is."""
        if not (k > 0 and math.isfinite(k)):
            raise TraceError(f"a time scale must be a positive number, got {k!r}")
        if k == 1.0:
            return self
        first = np.full(len(self.sessions), np.inf)
        np.minimum.at(first, self.session, self.time)
        start = first[self.session]
        return replace(self, time=start / k + (self.time - start),
                       time_scale=self.time_scale * k)

    def segments(self, length_s: float = HOUR_S, lead_in_s: float = 300.0) -> list[Segment]:
        """Consecutive windows of `length_s` (the last one shorter), each with the lines sent
        up to `lead_in_s` before it, uncounted. Empty windows are left out."""
        if not length_s > 0 or lead_in_s < 0:
            raise TraceError("a segment needs a positive length and a lead-in >= 0")
        last = {int(s): float(t) for s, t in zip(*_last_times(self), strict=True)}
        n = max(1, math.ceil((float(self.time.max()) + 1e-9) / length_s))
        out: list[Segment] = []
        for i in range(n):
            start, end = i * length_s, (i + 1) * length_s
            if i == n - 1:
                end = math.inf
            pick = np.flatnonzero((self.time >= start - lead_in_s) & (self.time < end))
            counted = self.time[pick] >= start
            if not counted.any():
                continue
            out.append(Segment.of(self, len(out), start, end, pick, counted, last))
        return out


def _last_times(trace: Trace) -> tuple[IntArray, FloatArray]:
    """(session index, its last line's time) for every session with a line."""
    last = np.full(len(trace.sessions), -np.inf)
    np.maximum.at(last, trace.session, trace.time)
    idx = np.flatnonzero(np.isfinite(last))
    return idx, last[idx]


@dataclass(frozen=True, slots=True)
class Segment:
    """The lines one replay offers: grouped by session (sessions in the order of their first
    line here), each session's lines by (rank, attempt). `counted` says which lines lie in the
    counted window [start, end); `continues` which sessions have lines after it."""

    index: int
    start: float
    end: float
    session_names: tuple[str, ...]
    offsets: IntArray  # session j's lines are [offsets[j], offsets[j + 1])
    continues: BoolArray
    rank: IntArray
    attempt: IntArray
    time: FloatArray
    prompt: IntArray
    output: IntArray
    key: IntArray
    keys: tuple[str, ...]
    counted: BoolArray

    @classmethod
    def of(cls, trace: Trace, index: int, start: float, end: float, pick: IntArray,
           counted: BoolArray, last: dict[int, float]) -> Segment:
        s = trace.session[pick]
        t = trace.time[pick]
        first: dict[int, float] = {}
        for sid, ti in zip(s.tolist(), t.tolist(), strict=True):
            if sid not in first or ti < first[sid]:
                first[sid] = ti
        local = {sid: j for j, sid in enumerate(sorted(first, key=lambda x: (first[x], x)))}
        loc = np.fromiter((local[x] for x in s.tolist()), np.int64, s.size)
        order = np.lexsort((trace.attempt[pick], trace.rank[pick], loc))
        rows = pick[order]
        counts = np.bincount(loc, minlength=len(local))
        names = tuple(trace.sessions[sid] for sid in sorted(local, key=local.__getitem__))
        by_local = sorted(local, key=local.__getitem__)
        return cls(index=index, start=start, end=end, session_names=names,
                   offsets=np.concatenate(([0], np.cumsum(counts))).astype(np.int64),
                   continues=np.array([last[sid] >= end for sid in by_local], dtype=np.bool_),
                   rank=trace.rank[rows], attempt=trace.attempt[rows], time=trace.time[rows],
                   prompt=trace.prompt[rows], output=trace.output[rows], key=trace.key[rows],
                   keys=trace.keys, counted=counted[order])

    @property
    def num_counted(self) -> int:
        return int(np.count_nonzero(self.counted))

    @property
    def num_sessions(self) -> int:
        return len(self.session_names)

    def work(self) -> tuple[int, int]:
        """How busy the window is, to judge the busiest first: its counted answer tokens,
        then its counted lines."""
        return int(self.output[self.counted].sum()), self.num_counted


def busiest_first(segments: Sequence[Segment]) -> list[int]:
    """The segments' indices, the busiest (`Segment.work`) first."""
    return sorted(range(len(segments)), key=lambda i: (segments[i].work(), -i), reverse=True)


def subset(seg: Segment, sessions: Sequence[int]) -> Segment:
    """The segment with only the listed sessions (their local indices, in order)."""
    starts, ends = seg.offsets[:-1], seg.offsets[1:]
    keep = np.asarray(sessions, dtype=np.int64)
    rows = (np.concatenate([np.arange(starts[j], ends[j]) for j in keep.tolist()])
            if keep.size else np.zeros(0, dtype=np.int64))
    counts = (ends - starts)[keep]
    return replace(seg, session_names=tuple(seg.session_names[j] for j in keep.tolist()),
                   offsets=np.concatenate(([0], np.cumsum(counts))).astype(np.int64),
                   continues=seg.continues[keep], rank=seg.rank[rows],
                   attempt=seg.attempt[rows], time=seg.time[rows], prompt=seg.prompt[rows],
                   output=seg.output[rows], key=seg.key[rows], counted=seg.counted[rows])
