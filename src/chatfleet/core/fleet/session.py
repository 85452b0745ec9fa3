"""The session table: where each session last ran, what its last turn's usage said, when it was
last seen. Pure and `now`-driven: an entry idle for more than `ttl_s` is gone.

Bounded twice: in entries (`max_sessions`) and in bytes (`max_bytes`), whichever is reached
first drops the stalest entries. An entry's bytes are its key's UTF-8 bytes plus
`SESSION_ENTRY_OVERHEAD_BYTES` (the entry, its numbers and the table's slot: about 290 bytes
beyond the key, measured with tracemalloc on CPython 3.11 for 100,000 entries). Session keys
are short (routing.session_key hashes a client's long value), so the bytes bound is what holds
when an attacker sends many distinct sessions.

The table is what keeps a session where its cache is: after a spill, the session's prefix lives
on the replica it spilled to, so that replica (not the rendezvous top) is its home from then on.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from chatfleet.core.errors import ChatfleetError

DEFAULT_SESSION_TTL_S = 600.0
SESSION_ENTRY_OVERHEAD_BYTES = 300
DEFAULT_MAX_SESSION_BYTES = 64 * 1024 * 1024  # about 190,000 sessions of the longest keys


def entry_bytes(key: str) -> int:
    """What one session entry is counted as (module docstring)."""
    return len(key.encode("utf-8", "surrogatepass")) + SESSION_ENTRY_OVERHEAD_BYTES


@dataclass(slots=True, init=False)
class SessionEntry:
    replica: str
    last_seen: float
    prompt_tokens: int | None  # the last turn's usage.prompt_tokens
    cached_tokens: int | None  # the last turn's usage.prompt_tokens_details.cached_tokens

    # __init__ written out (init=False): chatfleet/_native.py says why
    def __init__(self, replica: str, last_seen: float, prompt_tokens: int | None = None,
                 cached_tokens: int | None = None) -> None:
        self.replica = replica
        self.last_seen = last_seen
        self.prompt_tokens = prompt_tokens
        self.cached_tokens = cached_tokens


class SessionTable:
    """Session key -> SessionEntry, with a TTL on idleness, an optional count bound and a bound
    in bytes (module docstring).

    Entries are kept in last-seen order, so expiry and the size bounds drop the stalest first.
    `now` must not go backwards between calls (both clocks that drive the core are monotonic).
    """

    def __init__(self, ttl_s: float = DEFAULT_SESSION_TTL_S,
                 max_sessions: int | None = None,
                 max_bytes: int | None = DEFAULT_MAX_SESSION_BYTES) -> None:
        if ttl_s <= 0:
            raise ChatfleetError("the session TTL must be positive")
        if max_sessions is not None and max_sessions < 1:
            raise ChatfleetError("max_sessions must be at least 1")
        if max_bytes is not None and max_bytes < SESSION_ENTRY_OVERHEAD_BYTES:
            raise ChatfleetError(f"max_bytes must be at least {SESSION_ENTRY_OVERHEAD_BYTES} "
                                 "(one entry)")
        self.ttl_s = ttl_s
        self.max_sessions = max_sessions
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, SessionEntry] = OrderedDict()
        self.num_bytes = 0  # sum of entry_bytes over the entries
        self.num_expired = 0
        self.num_evicted = 0

    def __len__(self) -> int:
        return len(self._entries)

    def is_live(self, entry: SessionEntry, now: float) -> bool:
        return now - entry.last_seen <= self.ttl_s

    def get(self, key: str, now: float) -> SessionEntry | None:
        """The session's entry, or None when it is unknown or has been idle past the TTL."""
        entry = self._entries.get(key)
        if entry is None or not self.is_live(entry, now):
            return None
        return entry

    def place(self, key: str, replica: str, now: float, prompt_tokens: int | None = None,
              cached_tokens: int | None = None) -> None:
        """The session's request was admitted to `replica` at `now`. Token counts, when given,
        replace the stored ones; when not, the stored ones stay."""
        entry = self.get(key, now)
        if entry is None:
            self._touch(key, SessionEntry(replica, now, prompt_tokens, cached_tokens), now)
            return
        entry.replica = replica
        self._update(key, entry, prompt_tokens, cached_tokens, now)

    def observe_usage(self, key: str, prompt_tokens: int | None, cached_tokens: int | None,
                      now: float) -> None:
        """A turn of the session finished with this usage. Unknown sessions are ignored (the
        placement comes first, with `place`)."""
        entry = self.get(key, now)
        if entry is not None:
            self._update(key, entry, prompt_tokens, cached_tokens, now)

    def _update(self, key: str, entry: SessionEntry, prompt_tokens: int | None,
                cached_tokens: int | None, now: float) -> None:
        """Seen at `now`; token counts that are given replace the stored ones."""
        entry.last_seen = now
        if prompt_tokens is not None:
            entry.prompt_tokens = prompt_tokens
        if cached_tokens is not None:
            entry.cached_tokens = cached_tokens
        self._touch(key, entry, now)

    def expire(self, now: float) -> int:
        """Drop every entry idle past the TTL; returns how many were dropped."""
        entries = self._entries
        dropped = 0
        while entries:
            key = next(iter(entries))  # the stalest
            if self.is_live(entries[key], now):
                break
            del entries[key]
            self.num_bytes -= entry_bytes(key)
            dropped += 1
        self.num_expired += dropped
        return dropped

    def _touch(self, key: str, entry: SessionEntry, now: float) -> None:
        if key not in self._entries:
            self.num_bytes += entry_bytes(key)
        self._entries[key] = entry
        self._entries.move_to_end(key)
        self.expire(now)
        while self._entries and self._over_bounds():
            stalest, _ = self._entries.popitem(last=False)
            self.num_bytes -= entry_bytes(stalest)
            self.num_evicted += 1

    def _over_bounds(self) -> bool:
        return ((self.max_sessions is not None and len(self._entries) > self.max_sessions)
                or (self.max_bytes is not None and self.num_bytes > self.max_bytes))
