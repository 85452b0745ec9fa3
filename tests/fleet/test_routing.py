"""Routing: session keys, rendezvous stability, the load bound, the recompute-aware spill on the
real L4 step-time model, least-loaded placement, the session table, and routing inside
admission."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chatfleet.core.calibration import step_constants
from chatfleet.core.engine.step_time import StepTimeModel
from chatfleet.core.fleet.admission import AdmissionController, FleetRequest
from chatfleet.core.fleet.routing import (
    MAX_SESSION_VALUE_BYTES,
    ORDER_MEMO_ENTRIES,
    Router,
    conversation_fingerprint,
    is_returning,
    least_loaded,
    rendezvous_order,
    rendezvous_top,
    rendezvous_weight,
    session_key,
)
from chatfleet.core.fleet.session import SessionTable, entry_bytes
from chatfleet.core.specs import builtin_model, get_gpu, precision

QWEN = builtin_model("qwen3-8b")
L4 = get_gpu("l4")
BF16 = precision("bf16", "bf16")
L4_BF16 = StepTimeModel(QWEN, L4, BF16, step_constants(L4, QWEN, BF16))
SHARED = 2048  # docs/facts.md#the-reference-case: every request starts with the same 2,048 tokens


@dataclass
class View:
    """A hand-set fleet: caps, in-flight counts, drain rates, queued-ahead counts."""

    caps: dict[str, int]
    busy: dict[str, int] = field(default_factory=dict)
    rates: dict[str, float] = field(default_factory=dict)
    ahead: dict[str, int] = field(default_factory=dict)

    def replicas(self) -> list[str]:
        return sorted(self.caps)

    def cap(self, replica: str) -> int:
        return self.caps[replica]

    def in_flight(self, replica: str) -> int:
        return self.busy.get(replica, 0)

    def can_admit(self, replica: str) -> bool:
        return self.in_flight(replica) < self.caps[replica]

    def drain_rate(self, replica: str | None, now: float) -> float:
        return self.rates.get(replica or "", 0.0)

    def queued_ahead(self, replica: str, request: FleetRequest) -> int:
        return self.ahead.get(replica, 0)


def session(key: str, prompt: int | None = None, rid: str = "q", t: float = 0.0,
            returning: bool = True) -> FleetRequest:
    return FleetRequest(rid, key, t, returning=returning, prompt_tokens=prompt)


def key_homed_at(replica: str, replicas: list[str]) -> str:
    return next(k for k in (f"s{i}" for i in range(10_000))
                if rendezvous_top(k, replicas) == replica)


# --- session keys --------------------------------------------------------------------------------
CHAT = {"messages": [
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "Hello"},
]}


def test_session_key_precedence_header_then_user_then_fingerprint() -> None:
    body = {**CHAT, "user": "u-7"}
    assert session_key({"X-Session-ID": "abc"}, body) == "sid:abc"
    assert session_key({"x-session-id": " abc "}, body) == "sid:abc"  # any case, trimmed
    assert session_key({"X-Session-ID": "  "}, body) == "user:u-7"  # blank falls through
    assert session_key({}, body) == "user:u-7"
    assert session_key({}, {**CHAT, "user": ""}) == "fp:" + conversation_fingerprint(
        CHAT["messages"])
    assert session_key({}, {"messages": [{"role": "system", "content": "x"}]}) is None
    assert session_key({}, {}) is None


def test_fingerprint_is_stable_as_turns_are_appended() -> None:
    first = conversation_fingerprint(CHAT["messages"])
    later = CHAT["messages"] + [
        {"role": "assistant", "content": "Hi!"},
        {"role": "user", "content": "Tell me more"},
        {"role": "assistant", "content": "Sure"},
        {"role": "user", "content": "Thanks"},
    ]
    assert first is not None and len(first) == 32
    assert conversation_fingerprint(later) == first
    assert conversation_fingerprint(list(later)) == first  # a fresh copy, same hash


def test_fingerprint_tells_conversations_apart() -> None:
    other_user = [CHAT["messages"][0], {"role": "user", "content": "Hello!"}]
    other_system = [{"role": "system", "content": "Be terse."}, CHAT["messages"][1]]
    no_system = [CHAT["messages"][1]]
    parts = [CHAT["messages"][0], {"role": "user",
                                   "content": [{"type": "text", "text": "Hello"}]}]
    prints = {conversation_fingerprint(m) for m in
              (CHAT["messages"], other_user, other_system, no_system, parts)}
    assert len(prints) == 5


def test_is_returning_means_an_earlier_answer_is_in_the_messages() -> None:
    assert not is_returning(CHAT)
    assert is_returning({"messages": [*CHAT["messages"], {"role": "assistant", "content": ""}]})


# --- rendezvous stability ------------------------------------------------------------------------
KEYS = st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=60, unique=True)
REPLICAS = st.lists(st.sampled_from([f"gpu-{i}" for i in range(12)]), min_size=2, max_size=8,
                    unique=True)


@settings(max_examples=150, deadline=None)
@given(keys=KEYS, replicas=REPLICAS, data=st.data())
def test_a_leaving_replica_moves_only_its_own_sessions(keys: list[str], replicas: list[str],
                                                       data: st.DataObject) -> None:
    gone = data.draw(st.sampled_from(replicas))
    rest = [r for r in replicas if r != gone]
    for key in keys:
        before = rendezvous_order(key, replicas)
        after = rendezvous_top(key, rest)
        if before[0] != gone:
            assert after == before[0]
        else:
            assert after == before[1]  # the next in the session's own order


@settings(max_examples=150, deadline=None)
@given(keys=KEYS, replicas=REPLICAS, data=st.data())
def test_a_joining_replica_takes_only_sessions_it_now_tops(keys: list[str],
                                                           replicas: list[str],
                                                           data: st.DataObject) -> None:
    new = data.draw(st.sampled_from([f"gpu-{i}" for i in range(12, 16)]))
    for key in keys:
        before = rendezvous_top(key, replicas)
        after = rendezvous_top(key, [*replicas, new])
        assert before is not None
        if rendezvous_weight(key, new) > rendezvous_weight(key, before):
            assert after == new
        else:
            assert after == before


@settings(max_examples=60, deadline=None)
@given(keys=KEYS, replicas=REPLICAS, data=st.data())
def test_router_with_recorded_sessions_moves_only_the_lost_replicas(
        keys: list[str], replicas: list[str], data: st.DataObject) -> None:
    router = Router(L4_BF16)
    view = View(dict.fromkeys(replicas, 1000))
    placed = {}
    for key in keys:
        placed[key] = router.route(session(key), view, 0.0)
        router.sessions.place(key, placed[key], 0.0)
    gone = data.draw(st.sampled_from(replicas))
    joined = View({**dict.fromkeys(replicas, 1000), "gpu-99": 1000})
    left = View({r: 1000 for r in replicas if r != gone})
    for key in keys:
        assert placed[key] == rendezvous_top(key, replicas)
        # a join moves no recorded session: their caches stay where they are
        assert router.route(session(key), joined, 1.0) == placed[key]
        moved = router.route(session(key), left, 1.0)
        assert (moved == placed[key]) == (placed[key] != gone)


# --- the load bound and the spill rule -----------------------------------------------------------
def test_a_hot_home_spills_a_new_session_to_the_next_in_its_order() -> None:
    replicas = ["a", "b", "c", "d"]
    key = "session-42"
    order = rendezvous_order(key, replicas)
    view = View(dict.fromkeys(replicas, 2), busy={order[0]: 2, order[1]: 2},
                rates={order[0]: 100.0})
    choice = Router(L4_BF16).choose(session(key, returning=False), view, 0.0)
    # no history: recomputing costs nothing, so any wait is worse
    assert choice.rule == "spill" and choice.home == order[0]
    assert choice.replica == order[2]  # order[1] is hot too
    assert choice.recompute_s == 0.0


def test_the_router_remembers_an_order_only_for_the_fleet_it_was_drawn_for() -> None:
    router = Router(L4_BF16)
    fleet = ["a", "b", "c", "d"]
    assert router.rendezvous_order("s1", fleet) == rendezvous_order("s1", fleet)
    home = rendezvous_top("s1", fleet)
    rest = [r for r in fleet if r != home]
    assert router.rendezvous_order("s1", rest) == rendezvous_order("s1", rest)
    view = View(dict.fromkeys(rest, 2))
    assert router.choose(session("s1"), view, 0.0).replica == rendezvous_top("s1", rest)
    for i in range(ORDER_MEMO_ENTRIES + 10):  # bounded: the oldest keys are forgotten
        router.rendezvous_order(f"k{i}", fleet)
    assert len(router._orders) == ORDER_MEMO_ENTRIES
    assert router.rendezvous_order("s1", fleet) == rendezvous_order("s1", fleet)


def test_a_home_with_room_keeps_its_session() -> None:
    key = "session-42"
    view = View({"a": 2, "b": 2}, busy={"a": 1, "b": 1})
    choice = Router(L4_BF16).choose(session(key, 8192), view, 0.0)
    assert (choice.rule, choice.replica) == ("home", rendezvous_top(key, ["a", "b"]))


def test_with_the_whole_fleet_hot_a_session_waits_for_home() -> None:
    key = "session-42"
    view = View({"a": 2, "b": 2}, busy={"a": 2, "b": 2})
    choice = Router(L4_BF16).choose(session(key), view, 0.0)
    assert (choice.rule, choice.replica) == ("all_full", rendezvous_top(key, ["a", "b"]))


def test_a_long_history_waits_when_the_wait_is_shorter_than_recomputing() -> None:
    """6,144 tokens of history after the shared 2,048-token prompt: recomputing it on an L4 in
    BF16 costs T(8192) - T(2048) = 1.937 s. Home drains 2 requests/s with nobody queued for it:
    the wait is (0 + 1) / 2 = 0.5 s, shorter, so the session waits."""
    home = "a"
    key = key_homed_at(home, ["a", "b"])
    cost = L4_BF16.recompute_s(8192) - L4_BF16.recompute_s(2048)
    assert cost == pytest.approx(1.937, abs=0.001)
    view = View({"a": 4, "b": 4}, busy={"a": 4, "b": 1}, rates={"a": 2.0})
    router = Router(L4_BF16, shared_prefix_tokens=SHARED)
    choice = router.choose(session(key, 8192), view, 0.0)
    assert choice.rule == "wait" and choice.replica == home
    assert choice.wait_s == pytest.approx(0.5)
    assert choice.recompute_s == pytest.approx(cost)


def test_a_long_history_spills_when_the_wait_is_longer_than_recomputing() -> None:
    """Same session; home drains 0.5 requests/s with one request queued for it ahead: the wait
    is (1 + 1) / 0.5 = 4 s, longer than the 1.937 s recompute, so it spills."""
    key = key_homed_at("a", ["a", "b"])
    view = View({"a": 4, "b": 4}, busy={"a": 4, "b": 1}, rates={"a": 0.5}, ahead={"a": 1})
    router = Router(L4_BF16, shared_prefix_tokens=SHARED)
    choice = router.choose(session(key, 8192), view, 0.0)
    assert choice.rule == "spill" and choice.replica == "b"
    assert choice.wait_s == pytest.approx(4.0)


def test_a_short_history_spills_at_the_wait_a_long_one_waits_out() -> None:
    """512 tokens of history cost T(2560) - T(2048) = 0.201 s to recompute: less than the same
    0.5 s wait."""
    key = key_homed_at("a", ["a", "b"])
    view = View({"a": 4, "b": 4}, busy={"a": 4}, rates={"a": 2.0})
    router = Router(L4_BF16, shared_prefix_tokens=SHARED)
    choice = router.choose(session(key, 2560), view, 0.0)
    assert choice.recompute_s == pytest.approx(0.2008, abs=0.001)
    assert choice.rule == "spill" and choice.replica == "b"


def test_strict_stickiness_never_leaves_a_hot_home() -> None:
    """spill="never": a new session (nothing to recompute) whose home is at its cap waits for
    it, though the other replica is idle; with room at home it goes home as always."""
    key = key_homed_at("a", ["a", "b"])
    router = Router(L4_BF16, shared_prefix_tokens=SHARED, spill="never")
    hot = View({"a": 4, "b": 4}, busy={"a": 4})
    choice = router.choose(session(key, returning=False), hot, 0.0)
    assert (choice.rule, choice.replica) == ("wait", "a")
    assert Router(L4_BF16, shared_prefix_tokens=SHARED).choose(
        session(key, returning=False), hot, 0.0).replica == "b"  # the default spills
    assert router.choose(session(key), View({"a": 4, "b": 4}, busy={"a": 3}),
                         0.0).replica == "a"


def test_bounded_load_spills_whenever_home_is_hot() -> None:
    """spill="full": the 8,192-token session that waits out a 0.5 s wait under the default
    rule (recomputing costs 1.937 s) moves at once."""
    key = key_homed_at("a", ["a", "b"])
    view = View({"a": 4, "b": 4}, busy={"a": 4, "b": 1}, rates={"a": 2.0})
    assert Router(L4_BF16, shared_prefix_tokens=SHARED).choose(
        session(key, 8192), view, 0.0).rule == "wait"
    choice = Router(L4_BF16, shared_prefix_tokens=SHARED, spill="full").choose(
        session(key, 8192), view, 0.0)
    assert (choice.rule, choice.replica) == ("spill", "b")
    full = View({"a": 4, "b": 4}, busy={"a": 4, "b": 4})
    assert Router(L4_BF16, spill="full").choose(session(key), full, 0.0).rule == "all_full"


def test_an_unknown_spill_rule_is_refused() -> None:
    with pytest.raises(ValueError, match="spill must be one of"):
        Router(L4_BF16, spill="sometimes")  # type: ignore[arg-type]


def test_without_a_shared_prefix_the_whole_prompt_is_the_cost() -> None:
    router = Router(L4_BF16)
    assert router.recompute_cost_s(8192) == pytest.approx(L4_BF16.recompute_s(8192))
    assert Router(L4_BF16, shared_prefix_tokens=SHARED).recompute_cost_s(1000) == 0.0


def test_token_counts_come_from_the_request_else_the_session_table() -> None:
    router = Router(L4_BF16)
    router.sessions.place("k", "a", 0.0)
    router.observe_usage("k", 8192, 8000, 1.0)
    assert router.prefix_tokens(session("k"), 2.0) == 8192
    assert router.prefix_tokens(session("k", 3000), 2.0) == 3000
    only_cached = FleetRequest("q", "k2", 0.0, True, None, 1500)
    assert router.prefix_tokens(only_cached, 2.0) == 1500
    assert router.prefix_tokens(session("unknown"), 2.0) == 0


# --- sessionless requests ------------------------------------------------------------------------
def test_sessionless_requests_go_to_the_least_loaded_replica() -> None:
    assert least_loaded(View({"a": 4, "b": 4, "c": 2}, busy={"a": 2, "b": 1, "c": 1})) == "b"
    assert least_loaded(View({"b": 4, "a": 4})) == "a"  # ties by name
    assert least_loaded(View({"a": 4, "b": 2}, busy={"a": 2, "b": 1})) == "b"  # fewer in flight
    assert least_loaded(View({"a": 0, "b": 8}, busy={"b": 7})) == "b"  # a zero cap is full
    assert least_loaded(View({})) is None
    choice = Router(L4_BF16).choose(FleetRequest("q", None, 0.0), View({"a": 1, "b": 1},
                                                                       busy={"a": 1}), 0.0)
    assert (choice.rule, choice.replica) == ("least_loaded", "b")


# --- the session table ---------------------------------------------------------------------------
def test_session_table_ttl() -> None:
    table = SessionTable(ttl_s=600.0)
    table.place("k", "a", 0.0, prompt_tokens=3000)
    assert table.get("k", 600.0) is not None
    assert table.get("k", 600.1) is None
    table.place("j", "b", 100.0)
    assert table.expire(650.0) == 1 and len(table) == 1
    table.observe_usage("j", 4000, 3500, 200.0)  # usage refreshes last-seen
    entry = table.get("j", 790.0)
    assert entry is not None and (entry.prompt_tokens, entry.cached_tokens) == (4000, 3500)
    table.observe_usage("nobody", 1, 1, 200.0)
    assert len(table) == 1


def test_session_table_size_bound_drops_the_stalest() -> None:
    table = SessionTable(max_sessions=2)
    table.place("a", "r", 0.0)
    table.place("b", "r", 1.0)
    table.place("a", "r", 2.0)
    table.place("c", "r", 3.0)
    assert table.get("b", 3.0) is None and table.get("a", 3.0) is not None
    assert table.num_evicted == 1


def test_after_a_spill_the_session_lives_where_its_cache_went() -> None:
    key = key_homed_at("a", ["a", "b"])
    router = Router(L4_BF16)
    hot = View({"a": 1, "b": 1}, busy={"a": 1})
    ac = AdmissionController({"a": 1, "b": 1}, 4, 1.0, route=router.route)
    ac.offer(FleetRequest("filler", None, 0.0), 0.0)  # a (ties by name)
    decisions = ac.offer(session(key, returning=False, rid="t1"), 0.0)
    assert decisions[0].replica == "b"
    router.note(decisions, 0.0)
    assert router.choose(session(key, rid="t2"), View({"a": 1, "b": 1}), 1.0).replica == "b"
    assert router.choose(session(key), hot, 1.0).rule == "home"


# --- routing inside admission --------------------------------------------------------------------
def busy_fleet(rate_releases: int) -> tuple[AdmissionController, str]:
    """a (cap 1) busy with a long-running request after `rate_releases` completions in the
    last 10 s; b has room. Returns the controller and a session homed at a."""
    router = Router(L4_BF16, shared_prefix_tokens=SHARED)
    ac = AdmissionController({"a": 1, "b": 1}, 8, 100.0, route=router.route)
    key_a = key_homed_at("a", ["a", "b"])
    for k in range(rate_releases):
        t = 10.0 * k / rate_releases
        out = ac.offer(session(key_a, rid=f"w{k}", t=t), t)
        assert out[0].replica == "a"
        ac.release("a", t + 0.01)
    ac.offer(session(key_a, rid="running", t=10.0), 10.0)
    assert ac.in_flight("a") == 1
    return ac, key_a


def test_admission_holds_a_long_session_for_its_home_when_the_wait_is_short() -> None:
    ac, key = busy_fleet(rate_releases=20)  # 2 per second at a
    out = ac.offer(session(key, 8192, rid="next", t=10.0), 10.0)
    assert out[0].queued and out[0].replica == "a"
    assert ac.in_flight("b") == 0
    admitted = ac.release("a", 10.3)
    assert [(d.request.request_id, d.replica) for d in admitted] == [("next", "a")]


def test_admission_spills_a_long_session_when_home_drains_slowly() -> None:
    ac, key = busy_fleet(rate_releases=2)  # 0.2 per second: a 5 s wait
    out = ac.offer(session(key, 8192, rid="next", t=10.0), 10.0)
    assert out[0].admitted and out[0].replica == "b"


def test_a_waiting_session_is_routed_again_when_capacity_frees() -> None:
    """It waits for home while home drains fast; seconds later the window has slid, home's
    drain rate has fallen, and when b frees the session spills there."""
    ac, key = busy_fleet(rate_releases=20)
    ac.offer(FleetRequest("b-filler", None, 10.0), 10.0)
    assert ac.in_flight("b") == 1
    out = ac.offer(session(key, 8192, rid="next", t=10.0), 10.0)
    assert out[0].queued and out[0].replica == "a"
    # at 19.5 s only the releases after 9.5 s count: 1 of them, 0.1/s, a 10 s wait > 1.94 s
    admitted = ac.release("b", 19.5)
    assert [(d.request.request_id, d.replica) for d in admitted] == [("next", "b")]


SESSION_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("offer"), st.integers(0, 6), st.sampled_from([None, 2300, 8192]),
                  st.floats(0.0, 0.7)),
        st.tuples(st.just("release"), st.integers(0, 5), st.none(), st.floats(0.0, 0.7)),
    ),
    max_size=60,
)


@settings(max_examples=100, deadline=None)
@given(ops=SESSION_OPS, caps=st.lists(st.integers(1, 3), min_size=1, max_size=4))
def test_sessions_through_admission_keep_caps_and_end_once(
        ops: list[tuple[str, int, int | None, float]], caps: list[int]) -> None:
    names = [f"r{i}" for i in range(len(caps))]
    router = Router(L4_BF16, shared_prefix_tokens=SHARED)
    ac = AdmissionController(dict(zip(names, caps, strict=True)), 3, 1.0, route=router.route)
    now, ended, offered = 0.0, set(), 0
    for op, n, prompt, dt in ops:
        now += dt
        if op == "offer":
            offered += 1
            key = None if n == 6 else f"user-{n}"
            out = ac.offer(FleetRequest(f"q{offered}", key, now, prompt is not None, prompt), now)
        else:
            busy = [r for r in names if ac.in_flight(r)]
            out = ac.release(busy[n % len(busy)], now) if busy else []
        router.note(out, now)
        for d in out:
            if not d.queued:
                assert d.request.request_id not in ended
                ended.add(d.request.request_id)
        assert all(ac.in_flight(r) <= ac.cap(r) for r in names)
    for d in ac.expire(now + 5.0):
        assert d.shed and d.request.request_id not in ended
        ended.add(d.request.request_id)
    assert ac.queue_depth() == 0
    assert ended == {f"q{i}" for i in range(1, offered + 1)}
    assert ac.num_admitted + sum(ac.num_shed.values()) == offered


def test_a_long_session_value_becomes_a_short_stable_key() -> None:
    """A client chooses its session value: whatever its size, the key is at most 133 bytes,
    the same on every turn, and different for different values."""
    short = "s" * MAX_SESSION_VALUE_BYTES
    assert session_key({"X-Session-ID": short}, {}) == "sid:" + short  # kept as it is
    huge = "u" * 1_000_000
    key = session_key({}, {**CHAT, "user": huge})
    assert key is not None and key.startswith("user#") and len(key) == 37
    assert session_key({}, {**CHAT, "user": huge}) == key
    assert session_key({}, {**CHAT, "user": huge[:-1] + "v"}) != key
    over = "s" * (MAX_SESSION_VALUE_BYTES + 1)
    hashed = session_key({"X-Session-ID": over}, {})
    assert hashed is not None and hashed.startswith("sid#")
    # a client cannot forge another's hashed key: its own value lands under "sid:"
    assert session_key({"X-Session-ID": hashed[4:]}, {}) == "sid:" + hashed[4:]
    # bytes, not characters: 43 four-byte characters are 172 bytes
    wide = session_key({"X-Session-ID": "😀" * 43}, {})
    assert wide is not None and wide.startswith("sid#")
    for value in (short, huge, over, "😀" * 1000):
        k = session_key({"X-Session-ID": value}, {})
        assert k is not None and len(k.encode()) <= 4 + MAX_SESSION_VALUE_BYTES


def test_session_table_is_bounded_in_bytes() -> None:
    table = SessionTable(max_bytes=10 * entry_bytes("k" * 100))
    for i in range(50):
        table.place(f"{i:0100d}", "r", float(i))
    assert len(table) == 10 and table.num_evicted == 40
    assert table.num_bytes == sum(entry_bytes(f"{i:0100d}") for i in range(40, 50))
    assert table.get(f"{39:0100d}", 50.0) is None and table.get(f"{49:0100d}", 50.0)
    # short keys: more of them fit in the same bytes
    for i in range(50):
        table.place(f"s{i}", "r", 100.0 + i)
    assert len(table) > 10 and table.num_bytes <= table.max_bytes  # type: ignore[operator]
    table.expire(10_000.0)
    assert len(table) == 0 and table.num_bytes == 0
    with pytest.raises(ValueError, match="max_bytes"):
        SessionTable(max_bytes=10)
