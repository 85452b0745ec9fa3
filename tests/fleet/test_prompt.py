"""The shared prompt: own mode puts the canonical system message and tools in place (idempotent,
never mutating, never duplicating), completions get the prefix, pass-through finds the first
differing byte of a request's prefix (from config or learned), and config validation."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chatfleet.core.fleet.prompt import (
    PrefixCheck,
    PrefixReport,
    SharedPrompt,
    canonicalize,
    describe,
    first_difference,
    prefix_bytes,
)

SYSTEM = "You are the Acme assistant. Answer briefly."


def tool(name: str, description: str = "") -> dict[str, Any]:
    return {"type": "function",
            "function": {"name": name, "description": description or f"does {name}",
                         "parameters": {"type": "object", "properties": {}}}}


SEARCH, WEATHER, CALC = tool("search"), tool("weather"), tool("calc")
OWN = SharedPrompt(mode="own", system=SYSTEM, tools=(SEARCH, WEATHER))


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def dumps(value: object) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def shared_part(body: dict[str, Any], shared: SharedPrompt) -> bytes:
    """What every engine must see identically: the first message and the canonical tools."""
    return dumps([body["messages"][0], body["tools"][:len(shared.tools)]])


# --- own mode: chat ------------------------------------------------------------------------------
def test_own_puts_the_system_message_first_and_two_clients_share_the_prefix_bytes() -> None:
    a = canonicalize({"model": "m", "messages": [user("Hi")]}, OWN)
    b = canonicalize({"messages": [{"role": "system", "content": "I am a client prompt"},
                                   user("What is the weather in Oslo?")],
                      "tools": [CALC, WEATHER], "temperature": 0.2}, OWN)
    assert a["messages"] == [{"role": "system", "content": SYSTEM}, user("Hi")]
    assert b["messages"][0] == {"role": "system", "content": SYSTEM}
    assert b["messages"][1:] == [{"role": "system", "content": "I am a client prompt"},
                                 user("What is the weather in Oslo?")]
    assert shared_part(a, OWN) == shared_part(b, OWN)
    assert a["tools"] == [SEARCH, WEATHER] and b["tools"] == [SEARCH, WEATHER, CALC]
    assert (a["model"], b["temperature"]) == ("m", 0.2)  # everything else is kept


def test_own_bodies_with_only_user_turns_have_exactly_the_canonical_prefix() -> None:
    canonical = OWN.canonical_prefix()
    assert canonical is not None
    for body in ({"messages": [user("x")]},
                 {"messages": [user("y"), {"role": "assistant", "content": "z"}, user("w")],
                  "tools": [WEATHER, SEARCH]},
                 {"messages": [{"role": "system", "content": SYSTEM}, user("q")],
                  "tools": [tool("search", "a client's own search")]}):
        assert prefix_bytes(canonicalize(body, OWN)) == canonical


def test_own_is_idempotent() -> None:
    body = {"messages": [{"role": "developer", "content": "d"}, user("a"),
                         {"role": "assistant", "content": "b"}, user("c")],
            "tools": [CALC, tool("search", "other"), tool("zeta")]}
    once = canonicalize(body, OWN)
    assert canonicalize(once, OWN) == once
    assert dumps(canonicalize(once, OWN)) == dumps(once)


def test_own_does_not_duplicate_a_system_message_the_client_already_sent() -> None:
    sent = {"role": "system", "content": SYSTEM}
    out = canonicalize({"messages": [sent, user("hi")]}, OWN)
    assert out["messages"] == [sent, user("hi")]
    # same text under another role, or a different text, or not first: the canonical one goes first
    for first in ({"role": "developer", "content": SYSTEM},
                  {"role": "system", "content": SYSTEM + " "},
                  {"role": "system", "content": [{"type": "text", "text": SYSTEM}]}):
        assert canonicalize({"messages": [first, user("hi")]}, OWN)["messages"] == [
            {"role": "system", "content": SYSTEM}, first, user("hi")]
    later = canonicalize({"messages": [user("hi"), sent]}, OWN)["messages"]
    assert later == [sent, user("hi"), sent]


def test_own_fixes_the_tool_order_and_the_canonical_definition_wins() -> None:
    client_search = tool("search", "the client's search")
    orders: list[list[dict[str, Any]]] = [[WEATHER, SEARCH], [client_search, CALC, WEATHER],
                                          [CALC], []]
    for tools in orders:
        out = canonicalize({"messages": [user("q")], "tools": tools}, OWN)
        assert out["tools"][:2] == [SEARCH, WEATHER]
        assert out["tools"][0] is SEARCH and out["tools"][1] is WEATHER  # as configured
        assert client_search not in out["tools"]
    out = canonicalize({"messages": [user("q")],
                        "tools": [tool("b"), SEARCH, tool("a"), WEATHER, tool("c")]}, OWN)
    names = [t["function"]["name"] for t in out["tools"]]
    assert names == ["search", "weather", "b", "a", "c"]  # client extras keep client order


def test_own_adds_no_tools_key_when_there_are_no_tools_at_all() -> None:
    only_system = SharedPrompt(mode="own", system=SYSTEM)
    assert "tools" not in canonicalize({"messages": [user("q")]}, only_system)
    assert canonicalize({"messages": [user("q")], "tools": [CALC]}, only_system)["tools"] == [CALC]
    assert canonicalize({"messages": [user("q")], "tools": None}, OWN)["tools"] == [SEARCH,
                                                                                   WEATHER]
    only_tools = SharedPrompt(mode="own", tools=(SEARCH,))
    out = canonicalize({"messages": [user("q")]}, only_tools)
    assert out == {"messages": [user("q")], "tools": [SEARCH]}  # no system message without one


def test_canonicalize_never_mutates_its_input() -> None:
    body = {"messages": [{"role": "system", "content": "client"}, user("q")],
            "tools": [CALC, tool("search", "client")], "prompt_cache_key": "k"}
    before = copy.deepcopy(body)
    out = canonicalize(body, OWN)
    assert body == before
    assert out is not body and out["messages"] is not body["messages"]
    assert out["tools"] is not body["tools"]
    out["messages"].append(user("more"))
    out["tools"].append(tool("more"))
    assert body == before
    assert OWN.tools == (SEARCH, WEATHER)


def test_pass_through_canonicalize_returns_an_unchanged_copy() -> None:
    body = {"messages": [user("q")], "tools": [CALC]}
    out = canonicalize(body, SharedPrompt(system=SYSTEM, tools=(SEARCH,)))
    assert out == body and out is not body


def test_canonicalize_leaves_what_it_cannot_understand_alone() -> None:
    for body in ({"messages": "not a list"}, {"messages": None, "tools": [CALC]},
                 {"messages": {"role": "user"}}):
        assert canonicalize(body, OWN) == body
    odd = canonicalize({"messages": [42, user("q")], "tools": "nope"}, OWN)
    assert odd == {"messages": [{"role": "system", "content": SYSTEM}, 42, user("q")],
                   "tools": "nope"}
    weird_tools = [7, {"type": "function"}, {"function": "x"}, CALC]
    out = canonicalize({"messages": [], "tools": weird_tools}, OWN)
    assert out == {"messages": [{"role": "system", "content": SYSTEM}],
                   "tools": [SEARCH, WEATHER, *weird_tools]}
    assert canonicalize({}, OWN) == {}


# --- own mode: completions -----------------------------------------------------------------------
def test_own_prefixes_a_string_completion_prompt_once() -> None:
    shared = SharedPrompt(mode="own", system=SYSTEM, completion_prefix=SYSTEM + "\n\n")
    out = canonicalize({"model": "m", "prompt": "Once upon a time"}, shared)
    assert out == {"model": "m", "prompt": SYSTEM + "\n\nOnce upon a time"}
    assert canonicalize(out, shared) == out
    tokens = {"prompt": [1, 2, 3]}
    assert canonicalize(tokens, shared) == tokens
    # no completion_prefix configured: completions are left alone
    assert canonicalize({"prompt": "x"}, OWN) == {"prompt": "x"}


# --- prefix bytes --------------------------------------------------------------------------------
def test_prefix_bytes_is_the_compact_json_of_prefix_messages_and_tools() -> None:
    body = {"messages": [{"role": "system", "content": "Ä"}, {"role": "tool", "content": "t"},
                         {"role": "developer", "content": "d"}, user("u"),
                         {"role": "system", "content": "late"}],
            "tools": [{"type": "function", "function": {"name": "f"}}]}
    assert prefix_bytes(body) == (
        '[[{"role":"system","content":"Ä"},{"role":"developer","content":"d"}],'
        '[{"type":"function","function":{"name":"f"}}]]').encode()
    assert prefix_bytes({"messages": [user("u")]}) == b"[[],[]]"
    assert prefix_bytes({"messages": [user("u")], "tools": None}) == b"[[],[]]"
    # key order counts
    swapped = {"messages": [{"content": "Ä", "role": "system"}]}
    assert prefix_bytes(swapped) != prefix_bytes({"messages": [{"role": "system",
                                                                "content": "Ä"}]})


def test_prefix_bytes_never_raises_on_malformed_bodies() -> None:
    for body in ({}, {"messages": "x"}, {"messages": [None, 3, "s"]}, {"tools": "x"},
                 {"messages": [{"role": "system", "content": "\ud800"}]},
                 {"messages": [{"role": "system", "content": {1, 2}}]},
                 {"messages": [{"role": "system", "content": {(1, 2): "tuple key"}}]}):
        assert isinstance(prefix_bytes(body), bytes)


def test_first_difference() -> None:
    assert first_difference(b"abc", b"abc") is None
    assert first_difference(b"abc", b"abd") == 2
    assert first_difference(b"abc", b"ab") == 2
    assert first_difference(b"", b"x") == 0
    assert first_difference(b"xbc", b"abc") == 0


# --- pass-through: the prefix check --------------------------------------------------------------
def stamped(ts: str, question: str = "hi") -> dict[str, Any]:
    return {"messages": [{"role": "system", "content": f"{SYSTEM} Current time: {ts}."},
                         user(question)], "tools": [SEARCH]}


def test_a_per_request_timestamp_is_found_at_its_offset() -> None:
    check = PrefixCheck(SharedPrompt())
    first = check.check(stamped("2025-03-01T10:15:00Z"))
    assert first == PrefixReport(matches=True, offset=None, learned=True)
    report = check.check(stamped("2025-03-01T10:16:30Z", "another question"))
    canonical = check.canonical
    assert canonical is not None and not report.matches and not report.learned
    start = canonical.index(b"2025-03-01T10:15:00Z")
    assert report.offset == start + len("2025-03-01T10:1")  # the minutes differ
    assert describe(report) == f"mismatch; offset={report.offset}"


def test_equal_prompts_match_whatever_the_conversation() -> None:
    check = PrefixCheck(SharedPrompt(system=SYSTEM, tools=(SEARCH,)))
    for question in ("a", "b", "a much longer question"):
        body = {"messages": [{"role": "system", "content": SYSTEM}, user(question),
                             {"role": "assistant", "content": "ok"}, user("and?")],
                "tools": [SEARCH], "stream": True}
        assert check.check(body) == PrefixReport(matches=True, offset=None)
        assert describe(check.check(body)) == "match"


def test_config_prefix_catches_tool_order_and_extra_tools() -> None:
    check = PrefixCheck(SharedPrompt(system=SYSTEM, tools=(SEARCH, WEATHER)))
    base = {"messages": [{"role": "system", "content": SYSTEM}, user("q")]}
    good = check.check({**base, "tools": [SEARCH, WEATHER]})
    swapped = check.check({**base, "tools": [WEATHER, SEARCH]})
    extra = check.check({**base, "tools": [SEARCH, WEATHER, CALC]})
    missing = check.check(base)
    assert good.matches and not swapped.matches and not extra.matches and not missing.matches
    canonical = check.canonical
    assert canonical is not None
    assert swapped.offset == canonical.index(b'"search"') + 1  # in the first tool's name
    assert extra.offset == len(canonical) - 2  # where the canonical list closes: "]]"
    assert check.check({"messages": [user("q")], "tools": [SEARCH, WEATHER]}).offset == 2


def test_learning_waits_for_a_system_message_and_happens_once() -> None:
    check = PrefixCheck(SharedPrompt())
    assert check.canonical is None and not check.learned
    early = check.check({"messages": [user("no system")]})
    assert not early.checked and describe(early) == "unchecked"
    assert check.canonical is None
    taught = check.check(stamped("t1"))
    assert taught.learned and taught.matches and describe(taught) == "match; learned"
    assert check.canonical == prefix_bytes(stamped("t1")) and check.learned
    again = check.check(stamped("t1", "other"))
    assert again == PrefixReport(matches=True, offset=None)
    assert not check.check(stamped("t2")).learned  # learned once, from the first
    assert check.check({"messages": [user("no system")]}).offset == 2


def test_bodies_without_messages_are_not_compared() -> None:
    check = PrefixCheck(SharedPrompt(system=SYSTEM))
    for body in ({"prompt": "text"}, {"messages": "bad"}):
        report = check.check(body)
        assert not report.checked and describe(report) == "unchecked"


def test_configured_system_is_compared_as_a_plain_system_message() -> None:
    check = PrefixCheck(SharedPrompt(system=SYSTEM))
    assert not check.learned
    assert check.canonical == dumps([[{"role": "system", "content": SYSTEM}], []])
    assert check.check({"messages": [{"role": "system", "content": SYSTEM}, user("q")]}).matches
    assert not check.check({"messages": [{"role": "system", "content": SYSTEM,
                                          "name": "x"}, user("q")]}).matches


# --- config --------------------------------------------------------------------------------------
def test_from_config_reads_every_key() -> None:
    tools = [SEARCH, WEATHER]
    shared = SharedPrompt.from_config({"mode": "own", "system": SYSTEM, "tools": tools,
                                       "completion_prefix": "P: "})
    assert shared == SharedPrompt("own", SYSTEM, (SEARCH, WEATHER), "P: ")
    assert shared.tools[0] is SEARCH  # the configured dicts themselves
    assert SharedPrompt.from_config({}) == SharedPrompt()
    assert SharedPrompt.from_config({"mode": None, "system": None, "tools": None}) == \
        SharedPrompt()
    assert SharedPrompt().mode == "pass-through"


@pytest.mark.parametrize(("raw", "message"), [
    ({"mode": "owned"}, "mode must be one of own, pass-through"),
    ({"mode": "own"}, "mode 'own' needs"),
    ({"system": 3}, "system must be a string"),
    ({"system": ["a"]}, "system must be a string"),
    ({"completion_prefix": 1}, "completion_prefix must be a string"),
    ({"tools": {"name": "x"}}, "tools must be a list"),
    ({"tools": "search"}, "tools must be a list"),
    ({"tools": ["search"]}, r"tools\[0\] must be a dict"),
    ({"tools": [{"type": "code", "function": {"name": "x"}}]}, "type must be 'function'"),
    ({"tools": [{"type": "function"}]}, "function must be a dict"),
    ({"tools": [{"type": "function", "function": {"description": "x"}}]},
     "function.name must be a non-empty string"),
    ({"tools": [{"type": "function", "function": {"name": ""}}]}, "non-empty string"),
    ({"tools": [SEARCH, WEATHER, tool("search", "again")]},
     r"tools\[2\]: duplicate tool name 'search'"),
    ({"system_prompt": "x"}, "unknown key"),
])
def test_from_config_refuses_bad_input(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SharedPrompt.from_config(raw)


def test_from_config_refuses_a_non_mapping() -> None:
    with pytest.raises(ValueError, match="must be a mapping"):
        SharedPrompt.from_config(["mode", "own"])  # type: ignore[arg-type]


# --- properties ----------------------------------------------------------------------------------
NAMES = st.sampled_from(["search", "weather", "calc", "zeta", "alpha"])
CLIENT_TOOLS = st.lists(st.one_of(
    st.builds(tool, NAMES, st.sampled_from(["", "client"])),
    st.just({"type": "function"}), st.just(7)), max_size=6)
MESSAGES = st.lists(st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["system", "developer", "user", "assistant"]),
                           "content": st.sampled_from([SYSTEM, "x", "é", ""])}),
    st.just(None)), max_size=6)


@settings(max_examples=300, deadline=None)
@given(messages=MESSAGES, tools=st.none() | CLIENT_TOOLS, with_system=st.booleans(),
       n_tools=st.integers(0, 2))
def test_own_mode_properties(messages: list[Any], tools: list[Any] | None, with_system: bool,
                             n_tools: int) -> None:
    shared = SharedPrompt(mode="own", system=SYSTEM if with_system else None,
                          tools=(SEARCH, WEATHER)[:n_tools], completion_prefix="p")
    body: dict[str, Any] = {"messages": messages}
    if tools is not None:
        body["tools"] = tools
    before = copy.deepcopy(body)
    out = canonicalize(body, shared)
    assert body == before
    assert canonicalize(out, shared) == out
    rest = out["messages"]
    if with_system:
        assert out["messages"][0] == {"role": "system", "content": SYSTEM}
        if messages[:1] == [{"role": "system", "content": SYSTEM}]:
            assert out["messages"] == messages
        else:
            rest = out["messages"][1:]
    assert rest == messages  # the client's messages, unchanged and in order
    names = shared.tool_names()
    if tools is None and not shared.tools:
        assert "tools" not in out
    else:
        assert out["tools"][:n_tools] == list(shared.tools)
        assert out["tools"][n_tools:] == [
            t for t in tools or [] if not (isinstance(t, dict) and isinstance(
                t.get("function"), dict) and t["function"].get("name") in names)]
    if with_system and all(isinstance(m, dict) and m["role"] not in ("system", "developer")
                           for m in messages):
        # nothing of the client's in the prefix but its own extra tools
        assert prefix_bytes(out).startswith(dumps([[shared.system_message()]])[:-1])


@settings(max_examples=300, deadline=None)
@given(a=st.text(max_size=30), b=st.text(max_size=30))
def test_prefix_offset_is_the_first_differing_byte(a: str, b: str) -> None:
    check = PrefixCheck(SharedPrompt(system=a))
    report = check.check({"messages": [{"role": "system", "content": b}, user("q")]})
    canonical, request = check.canonical, prefix_bytes(
        {"messages": [{"role": "system", "content": b}]})
    assert canonical is not None
    assert report.matches == (a == b) == (report.offset is None)
    if report.offset is not None:
        k = report.offset
        assert canonical[:k] == request[:k]
        assert k == min(len(canonical), len(request)) or canonical[k] != request[k]
