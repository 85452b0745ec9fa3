"""Routing: which replica a request should run on now.

- Session key: the `X-Session-ID` header, else the body's `user`, else a fingerprint of the
  conversation's first turn (system messages + first user message), namespaced so the three
  sources never collide: "sid:...", "user:...", "fp:...". A client's value longer than
  MAX_SESSION_VALUE_BYTES (UTF-8) is replaced by its hash, "sid#<32 hex>" / "user#<32 hex>":
  the key stays the same for every turn, and no key is longer than 133 bytes whatever the
  client sends (a 1 MB `user` field once cost 1 MB per session, in the gateway and in Redis).
- A session's home is the replica that served its last turn (the session table), while that
  entry is live and the replica is in the fleet; otherwise the top of its rendezvous
  (highest-random-weight) order over the fleet.
- Load bound: a replica is hot when its in-flight count has reached its cap. A session whose
  home has room goes home. When home is hot, the spill candidate is the first replica with room
  in the session's rendezvous order, and the session spills there only if the expected wait at
  home is longer than recomputing its prefix elsewhere:

      wait_s      = (requests queued for home ahead of it + 1) / home's drain rate  (inf if 0)
      recompute_s = max(0, T(prefix) - T(min(prefix, shared_prefix_tokens)))
      spill  iff  a candidate exists and wait_s > recompute_s

  T = StepTimeModel.recompute_s; prefix = the last turn's prompt tokens (from usage), else its
  cached tokens, else 0. With no candidate (the whole fleet at its caps) the session waits for
  home. That is the default spill rule, "cost"; "full" spills whenever home is hot and a
  candidate has room (plain bounded-load rendezvous), "never" always waits for home (strict
  stickiness: rendezvous hashing with no load bound).
- Requests without a session go to the least-loaded replica: lowest in-flight / cap (a zero cap
  counts as full), then fewest in flight, then name.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from chatfleet.core.errors import ChatfleetError
from chatfleet.core.fleet.admission import Decision, FleetRequest, FleetView
from chatfleet.core.fleet.session import SessionTable

SESSION_HEADER = "x-session-id"
MAX_SESSION_VALUE_BYTES = 128
SYSTEM_ROLES = ("system", "developer")

Rule = Literal["no_replica", "least_loaded", "home", "wait", "spill", "all_full"]
# when a session whose home is hot moves: when waiting costs more than recomputing ("cost"),
# whenever another replica has room ("full"), or never ("never": strict stickiness)
SpillRule = Literal["cost", "full", "never"]
SPILL_RULES: tuple[SpillRule, ...] = ("cost", "full", "never")


# --- session keys ------------------------------------------------------------------------------
def session_key(headers: Mapping[str, str], body: Mapping[str, Any]) -> str | None:
    """The request's session: header > user > first-turn fingerprint; None if none applies."""
    for name, value in headers.items():
        if name.lower() == SESSION_HEADER and value.strip():
            return bounded_key("sid", value.strip())
    user = body.get("user")
    if isinstance(user, str) and user.strip():
        return bounded_key("user", user.strip())
    fingerprint = conversation_fingerprint(body.get("messages"))
    return None if fingerprint is None else "fp:" + fingerprint


def bounded_key(namespace: str, value: str) -> str:
    """`namespace:value`, or `namespace#<hash>` when the value is longer than
    MAX_SESSION_VALUE_BYTES in UTF-8 (the two forms never collide: ':' against '#')."""
    raw = value.encode("utf-8", "surrogatepass")
    if len(raw) <= MAX_SESSION_VALUE_BYTES:
        return f"{namespace}:{value}"
    return f"{namespace}#{hashlib.sha256(raw).hexdigest()[:32]}"


def conversation_fingerprint(messages: object) -> str | None:
    """A stable hash (SHA-256, 32 hex digits) of the system/developer messages before the
    first user message and that first user message: the same for every later turn of the
    conversation. None without a user message."""
    if not isinstance(messages, list):
        return None
    system: list[object] = []
    for message in messages:
        if not isinstance(message, Mapping):
            continue
        role = message.get("role")
        if role in SYSTEM_ROLES:
            system.append(message.get("content"))
        elif role == "user":
            blob = json.dumps([system, message.get("content")], sort_keys=True,
                              separators=(",", ":"), ensure_ascii=False, default=str)
            return hashlib.sha256(blob.encode()).hexdigest()[:32]
    return None


def is_returning(body: Mapping[str, Any]) -> bool:
    """A later turn of a conversation: its messages hold an earlier assistant answer."""
    messages = body.get("messages")
    return isinstance(messages, list) and any(
        isinstance(m, Mapping) and m.get("role") == "assistant" for m in messages)


# --- rendezvous hashing ------------------------------------------------------------------------
def rendezvous_weight(key: str, replica: str) -> int:
    digest = hashlib.blake2b(f"{key}\x1f{replica}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def rendezvous_order(key: str, replicas: Iterable[str]) -> list[str]:
    """Replicas by descending weight for `key` (ties, astronomically rare, by name). Removing
    a replica leaves the others' relative order unchanged: only its own keys move."""
    return sorted(replicas, key=lambda r: (-rendezvous_weight(key, r), r))


def rendezvous_top(key: str, replicas: Iterable[str]) -> str | None:
    order = rendezvous_order(key, replicas)
    return order[0] if order else None


# --- placement ---------------------------------------------------------------------------------
def least_loaded(view: FleetView) -> str | None:
    """Lowest in-flight / cap (zero cap: full), then fewest in flight, then name."""
    def load(replica: str) -> tuple[float, int, str]:
        cap = view.cap(replica)
        n = view.in_flight(replica)
        return (n / cap if cap > 0 else math.inf, n, replica)

    return min(view.replicas(), key=load, default=None)


def route_least_loaded(request: FleetRequest, view: FleetView, now: float) -> str | None:
    """A Route that ignores sessions."""
    return least_loaded(view)


class RecomputeModel(Protocol):
    def recompute_s(self, tokens: int) -> float: ...


@dataclass(frozen=True, slots=True)
class RouteChoice:
    """A routing decision and why: `rule` names the branch, `home` the session's home,
    `wait_s` / `recompute_s` the two costs when they were weighed."""

    replica: str | None
    rule: Rule
    home: str | None = None
    wait_s: float | None = None
    recompute_s: float | None = None


# RouteChoice's fields in order
_Choice = tuple[str | None, Rule, str | None, float | None, float | None]

ORDER_MEMO_ENTRIES = 4096


class Router:
    """Session affinity with a load bound and a recompute-aware spill (module docstring)."""

    def __init__(self, step_time: RecomputeModel, sessions: SessionTable | None = None, *,
                 shared_prefix_tokens: int = 0, spill: SpillRule = "cost") -> None:
        if shared_prefix_tokens < 0:
            raise ChatfleetError("shared_prefix_tokens must not be negative")
        if spill not in SPILL_RULES:
            raise ChatfleetError(f"spill must be one of {', '.join(SPILL_RULES)}, not "
                                 f"{spill!r}")
        self.spill = spill
        self.step_time = step_time
        self.sessions = sessions if sessions is not None else SessionTable()
        self.shared_prefix_tokens = shared_prefix_tokens
        # session key -> (the replicas, their rendezvous order): a queued request is routed
        # again at every dispatch, and the order changes only with the fleet
        self._orders: dict[str, tuple[list[str], list[str]]] = {}

    def rendezvous_order(self, key: str, replicas: list[str]) -> list[str]:
        """rendezvous_order(key, replicas), remembered for the last ORDER_MEMO_ENTRIES keys."""
        seen = self._orders.get(key)
        if seen is not None and seen[0] == replicas:
            return seen[1]
        order = rendezvous_order(key, replicas)
        if len(self._orders) >= ORDER_MEMO_ENTRIES:
            del self._orders[next(iter(self._orders))]  # the oldest
        self._orders[key] = (list(replicas), order)
        return order

    def route(self, request: FleetRequest, view: FleetView, now: float) -> str | None:
        """The Route for AdmissionController: a pure query, it changes nothing."""
        return self._choose(request, view, now)[0]

    def choose(self, request: FleetRequest, view: FleetView, now: float) -> RouteChoice:
        return RouteChoice(*self._choose(request, view, now))

    def _choose(self, request: FleetRequest, view: FleetView, now: float) -> _Choice:
        """`choose`'s fields, as a tuple (`route`, called for every placement, needs only the
        first)."""
        replicas = view.replicas()
        if not replicas:
            return (None, "no_replica", None, None, None)
        key = request.session_key
        if key is None:
            return (least_loaded(view), "least_loaded", None, None, None)
        home = self.home(key, replicas, now)
        if view.can_admit(home):
            return (home, "home", home, None, None)
        if self.spill == "never":
            return (home, "wait", home, None, None)
        for spill in self.rendezvous_order(key, replicas):
            if spill != home and view.can_admit(spill):
                break
        else:
            return (home, "all_full", home, None, None)
        if self.spill == "full":
            return (spill, "spill", home, None, None)
        wait = self.expected_wait_s(request, home, view, now)
        cost = self.recompute_cost_s(self.prefix_tokens(request, now))
        if wait > cost:
            return (spill, "spill", home, wait, cost)
        return (home, "wait", home, wait, cost)

    def home(self, key: str, replicas: list[str], now: float) -> str:
        """Where the session's cache is: its last replica while the session table says so and
        that replica is in the fleet, else its rendezvous top."""
        entry = self.sessions.get(key, now)
        if entry is not None and entry.replica in replicas:
            return entry.replica
        return self.rendezvous_order(key, replicas)[0]

    def prefix_tokens(self, request: FleetRequest, now: float) -> int:
        """Tokens of history the home replica holds: the last turn's prompt tokens, else its
        cached tokens; from the request, else from the session table; else 0."""
        for counts in self._counts(request, now):
            prompt, cached = counts
            if prompt is not None:
                return prompt
            if cached is not None:
                return cached
        return 0

    def recompute_cost_s(self, prefix_tokens: int) -> float:
        """What moving costs: prefilling the prefix beyond the shared prompt every replica
        already holds (T(prefix) - T(shared), T = StepTimeModel.recompute_s)."""
        shared = min(prefix_tokens, self.shared_prefix_tokens)
        if prefix_tokens <= shared:
            return 0.0
        cost = self.step_time.recompute_s(prefix_tokens)
        if shared > 0:
            cost -= self.step_time.recompute_s(shared)
        return max(0.0, cost)

    @staticmethod
    def expected_wait_s(request: FleetRequest, home: str, view: FleetView, now: float) -> float:
        """(queued for home ahead of the request + 1) / home's drain rate; inf with no drain
        observed."""
        rate = view.drain_rate(home, now)
        if rate <= 0:
            return math.inf
        return (view.queued_ahead(home, request) + 1) / rate

    def note(self, decisions: Iterable[Decision], now: float) -> None:
        """Record in the session table where admitted session requests went (and the token
        counts they carried). Call with every batch of decisions admission returns."""
        for decision in decisions:
            req = decision.request
            if (decision.outcome == "admitted" and decision.replica is not None
                    and req.session_key):
                self.sessions.place(req.session_key, decision.replica, now, req.prompt_tokens,
                                    req.cached_tokens)

    def observe_usage(self, key: str, prompt_tokens: int | None, cached_tokens: int | None,
                      now: float) -> None:
        """A session's turn finished with this usage: the next turn's prefix is this prompt."""
        self.sessions.observe_usage(key, prompt_tokens, cached_tokens, now)

    def _counts(self, request: FleetRequest,
                now: float) -> list[tuple[int | None, int | None]]:
        counts = [(request.prompt_tokens, request.cached_tokens)]
        if request.session_key is not None:
            entry = self.sessions.get(request.session_key, now)
            if entry is not None:
                counts.append((entry.prompt_tokens, entry.cached_tokens))
        return counts
