"""The shared prompt: the product's system prompt and tool list, byte-identical on every engine,
so every replica's prefix cache holds it and every request hits it.

Rules (docs/fleet-core.md, "The shared prompt", states them with an example):

- Config: `mode` is "own" or "pass-through" (the default); `system` a string or None; `tools` a
  list of `{"type": "function", "function": {"name": <non-empty str>, ...}}` with distinct names;
  `completion_prefix` a string or None. `SharedPrompt.from_config` refuses anything else
  (unknown keys included) with a ValueError, and "own" mode with nothing to own.
- own, chat body (it has `messages`): a new body (the input is never mutated). Messages: the
  canonical `{"role": "system", "content": system}` first, unless the client's first message
  already has that role and that content string (then it is kept, not duplicated); the client's
  other messages follow unchanged, in order. Tools: the canonical tools first, in config order,
  the very configured dicts; then the client's tools whose `function.name` is not canonical, in
  the client's order (a client tool with a canonical name is dropped: the canonical definition
  wins). No canonical tools and no client `tools`: no `tools` key is added.
- own, completions body (it has `prompt` and no `messages`): a string prompt that does not
  already start with `completion_prefix` gets it prepended (as is: put any separator in the
  config). No `completion_prefix`, or a prompt that is not a string (token ids, a batch): left
  alone.
- canonicalize leaves alone what it cannot understand: `messages` not a list (the whole body),
  `tools` not a list (that key), messages or tools that are not dicts (copied through). The
  gateway validates bodies and answers 400 separately. pass-through: `dict(body)`, unchanged.
- Prefix bytes of a body: UTF-8 of `json.dumps([prefix messages, tools], ensure_ascii=False,
  separators=(",", ":"), sort_keys=False)`, where the prefix messages are the system/developer
  messages (whole dicts, key order kept) before the first user message, and tools is the body's
  `tools` as sent (absent or null: `[]`). Key order counts, as it does in the chat template's
  `tojson`. The canonical prefix is the prefix bytes of `{"messages": [canonical system message],
  "tools": [canonical tools]}`.
- pass-through check (`PrefixCheck`): compare a request's prefix bytes with the canonical ones;
  the report holds the first differing byte offset (None when equal; the shorter length when one
  is a prefix of the other). The canonical prefix comes from config (system and/or tools); with
  neither configured it is learned, once, from the first request whose prefix holds a
  system/developer message. Until then, and for bodies without a `messages` list, requests are
  not compared (`checked=False`).

Pure: no I/O, no clock. `PrefixCheck` keeps the learned prefix; everything else is a function.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from chatfleet.core.errors import ChatfleetError

Mode = Literal["own", "pass-through"]
MODES: tuple[str, ...] = get_args(Mode)
CONFIG_KEYS = ("mode", "system", "tools", "completion_prefix")
PREFIX_ROLES = ("system", "developer")


# --- config ------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SharedPrompt:
    """What the gateway makes identical on every engine (module docstring). Constructing one
    validates it; `from_config` also parses a raw config mapping."""

    mode: Mode = "pass-through"
    system: str | None = None
    tools: tuple[dict[str, Any], ...] = ()
    completion_prefix: str | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ChatfleetError(f"shared prompt: mode must be one of {', '.join(MODES)}, "
                                 f"not {self.mode!r}")
        if self.system is not None and not isinstance(self.system, str):
            raise ChatfleetError("shared prompt: system must be a string, not "
                                 f"{type(self.system).__name__}")
        if self.completion_prefix is not None and not isinstance(self.completion_prefix, str):
            raise ChatfleetError("shared prompt: completion_prefix must be a string, not "
                                 f"{type(self.completion_prefix).__name__}")
        if not isinstance(self.tools, tuple):
            raise ChatfleetError("shared prompt: tools must be a tuple of tool dicts")
        seen: set[str] = set()
        for i, tool in enumerate(self.tools):
            name = _configured_tool_name(i, tool)
            if name in seen:
                raise ChatfleetError(f"shared prompt: tools[{i}]: duplicate tool name {name!r}")
            seen.add(name)
        if self.mode == "own" and self.system is None and not self.tools \
                and self.completion_prefix is None:
            raise ChatfleetError("shared prompt: mode 'own' needs system, tools or "
                                 "completion_prefix")

    @classmethod
    def from_config(cls, raw: Mapping[str, Any]) -> SharedPrompt:
        """From a config mapping with the keys mode, system, tools, completion_prefix (all
        optional; null means absent). Raises ValueError saying what is wrong."""
        if not isinstance(raw, Mapping):
            raise ChatfleetError("shared prompt: config must be a mapping, not "
                                 f"{type(raw).__name__}")
        unknown = sorted(str(k) for k in raw if k not in CONFIG_KEYS)
        if unknown:
            raise ChatfleetError(f"shared prompt: unknown key(s) {', '.join(unknown)} "
                                 f"(known: {', '.join(CONFIG_KEYS)})")
        mode = raw.get("mode")
        tools = raw.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise ChatfleetError("shared prompt: tools must be a list, not "
                                 f"{type(tools).__name__}")
        return cls(mode="pass-through" if mode is None else mode, system=raw.get("system"),
                   tools=tuple(tools or ()), completion_prefix=raw.get("completion_prefix"))

    def system_message(self) -> dict[str, Any] | None:
        """The canonical system message, or None without a system text."""
        return None if self.system is None else {"role": "system", "content": self.system}

    def tool_names(self) -> frozenset[str]:
        return frozenset(str(tool["function"]["name"]) for tool in self.tools)

    def canonical_prefix(self) -> bytes | None:
        """The prefix bytes every request should have; None when neither system text nor tools
        are configured (then `PrefixCheck` learns it)."""
        message = self.system_message()
        if message is None and not self.tools:
            return None
        return prefix_bytes({"messages": [] if message is None else [message],
                             "tools": list(self.tools)})


def _configured_tool_name(i: int, tool: object) -> str:
    where = f"shared prompt: tools[{i}]"
    if not isinstance(tool, dict):
        raise ChatfleetError(f"{where} must be a dict, not {type(tool).__name__}")
    if tool.get("type") != "function":
        raise ChatfleetError(f"{where}: type must be 'function', not {tool.get('type')!r}")
    function = tool.get("function")
    if not isinstance(function, dict):
        raise ChatfleetError(f"{where}: function must be a dict with a name")
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise ChatfleetError(f"{where}: function.name must be a non-empty string, not {name!r}")
    return name


# --- own mode ----------------------------------------------------------------------------------
def canonicalize(body: Mapping[str, Any], shared: SharedPrompt) -> dict[str, Any]:
    """own mode: a new body with the shared system message and tools in place (module
    docstring); pass-through: `dict(body)`. Never mutates `body`, never raises on a malformed
    one (it leaves what it cannot understand alone)."""
    out = dict(body)
    if shared.mode != "own":
        return out
    if "messages" in out:
        messages = out["messages"]
        if not isinstance(messages, list):
            return out
        out["messages"] = _with_system(messages, shared.system_message())
        if "tools" in out or shared.tools:
            out["tools"] = _with_tools(out.get("tools"), shared)
    elif "prompt" in out:
        prompt, prefix = out["prompt"], shared.completion_prefix
        if isinstance(prompt, str) and prefix is not None and not prompt.startswith(prefix):
            out["prompt"] = prefix + prompt
    return out


def _with_system(messages: list[Any], system: dict[str, Any] | None) -> list[Any]:
    if system is None:
        return list(messages)
    first = messages[0] if messages else None
    if (isinstance(first, Mapping) and first.get("role") == "system"
            and isinstance(first.get("content"), str) and first["content"] == system["content"]):
        return list(messages)
    return [system, *messages]


def _with_tools(client: object, shared: SharedPrompt) -> object:
    """Canonical tools, then the client's others. A client `tools` of null counts as none; one
    that is neither null nor a list is left as it is."""
    if client is None:
        return list(shared.tools) if shared.tools else None
    if not isinstance(client, list):
        return client
    names = shared.tool_names()
    return [*shared.tools, *(t for t in client if client_tool_name(t) not in names)]


def client_tool_name(tool: object) -> str | None:
    """A client tool's `function.name`, or None when it has none."""
    if isinstance(tool, Mapping):
        function = tool.get("function")
        if isinstance(function, Mapping):
            name = function.get("name")
            if isinstance(name, str):
                return name
    return None


# --- pass-through mode -------------------------------------------------------------------------
def prefix_messages(body: Mapping[str, Any]) -> list[Any] | None:
    """The system/developer messages before the first user message; None when `messages` is
    not a list."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return None
    out: list[Any] = []
    for message in messages:
        if not isinstance(message, Mapping):
            continue
        role = message.get("role")
        if role == "user":
            break
        if role in PREFIX_ROLES:
            out.append(message)
    return out


def prefix_bytes(body: Mapping[str, Any]) -> bytes:
    """UTF-8 of the compact, key-order-keeping JSON of [prefix messages, tools as sent]
    (module docstring). Never raises: values JSON cannot hold are written with str()."""
    tools = body.get("tools")
    blob = [prefix_messages(body) or [], [] if tools is None else tools]
    try:
        text = json.dumps(blob, ensure_ascii=False, separators=(",", ":"), sort_keys=False,
                          default=str)
    except (TypeError, ValueError):  # non-string keys, cycles: not from a JSON body
        text = repr(blob)
    return text.encode("utf-8", "surrogatepass")


def first_difference(a: bytes, b: bytes) -> int | None:
    """The first offset where `a` and `b` differ (the shorter length when one is a prefix of
    the other); None when they are equal."""
    if a == b:
        return None
    n = min(len(a), len(b))
    lo, hi = 0, n  # the answer lies in [lo, hi]: a[:lo] == b[:lo]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass(frozen=True, slots=True)
class PrefixReport:
    """How a request's prefix compares with the canonical one. checked: it was compared (False
    for a body without a `messages` list, or before a canonical prefix is known). When checked,
    `offset` (the first differing byte) is None exactly when `matches`. learned: this request
    set the canonical prefix."""

    matches: bool
    offset: int | None
    learned: bool = False
    checked: bool = True


UNCHECKED = PrefixReport(matches=False, offset=None, checked=False)


class PrefixCheck:
    """pass-through: does a request's prefix equal the shared one? The canonical prefix comes
    from the config, or is learned from the first request with a system/developer message."""

    def __init__(self, shared: SharedPrompt) -> None:
        self.canonical: bytes | None = shared.canonical_prefix()
        self.learned = False

    def check(self, body: Mapping[str, Any]) -> PrefixReport:
        messages = prefix_messages(body)
        if messages is None:
            return UNCHECKED
        if self.canonical is None:
            if not messages:
                return UNCHECKED
            self.canonical = prefix_bytes(body)
            self.learned = True
            return PrefixReport(matches=True, offset=None, learned=True)
        offset = first_difference(prefix_bytes(body), self.canonical)
        return PrefixReport(matches=offset is None, offset=offset)


def describe(report: PrefixReport) -> str:
    """A short debug-header value: "match", "match; learned", "mismatch; offset=123" or
    "unchecked"."""
    if not report.checked:
        return "unchecked"
    if report.matches:
        return "match; learned" if report.learned else "match"
    return f"mismatch; offset={report.offset}"

