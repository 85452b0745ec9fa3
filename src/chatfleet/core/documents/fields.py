"""Reading a JSON object into a typed document, and writing it back the same.

The rules every `from_json` here follows, so that a document chatfleet wrote reads and writes
back byte for byte (with `chatfleet.io`'s `dumps`):

- numbers are kept as they were read: an int stays an int (`"p50": 0`), a float a float
  (`"p50": 0.0`); nothing is converted;
- a key the type does not know (written by a newer version: keys may be added, never renamed)
  goes into the type's `extra` mapping, in file order, and is written back after the known
  keys of its object;
- a key the type knows but the file lacks reads as its default (a hand-made or older
  document); an optional key that was absent stays absent when written (its field is None).

A value of the wrong type is a `DocumentError` naming where it is (`point 3: 'attainment'
must be a number`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from chatfleet.core.errors import ChatfleetError

T = TypeVar("T")
Extra = Mapping[str, Any]  # a type's unknown keys, in file order
JsonObject = dict[str, Any]  # a JSON object as a file holds it: what to_json returns


def no_extra() -> Extra:
    return {}


class DocumentError(ChatfleetError):
    """A document's JSON does not have the shape its type needs (bad input: one line, exit
    2 on the command line)."""


def obj(data: Any, where: str) -> Mapping[str, Any]:
    """`data` if it is a JSON object, else the error."""
    if not isinstance(data, Mapping):
        raise DocumentError(f"{where} must be a JSON object")
    return data


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def num(data: Mapping[str, Any], key: str, where: str, default: float = 0.0) -> float:
    """A number as read (int or float), or `default` when the key is absent."""
    value = data.get(key, default)
    if not _is_number(value):
        raise DocumentError(f"{where}: {key!r} must be a number, not {value!r}")
    return value  # type: ignore[no-any-return]


def opt_num(data: Mapping[str, Any], key: str, where: str) -> float | None:
    """A number as read, or None (absent or null)."""
    value = data.get(key)
    if value is None:
        return None
    if not _is_number(value):
        raise DocumentError(f"{where}: {key!r} must be a number or null, not {value!r}")
    return value  # type: ignore[no-any-return]


def integer(data: Mapping[str, Any], key: str, where: str, default: int = 0) -> int:
    value = data.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise DocumentError(f"{where}: {key!r} must be an integer, not {value!r}")
    return value


def opt_int(data: Mapping[str, Any], key: str, where: str) -> int | None:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise DocumentError(f"{where}: {key!r} must be an integer or null, not {value!r}")
    return value


def boolean(data: Mapping[str, Any], key: str, where: str, default: bool = False) -> bool:
    value = data.get(key, default)
    if not isinstance(value, bool):
        raise DocumentError(f"{where}: {key!r} must be true or false, not {value!r}")
    return value


def opt_bool(data: Mapping[str, Any], key: str, where: str) -> bool | None:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, bool):
        raise DocumentError(f"{where}: {key!r} must be true, false or null, not {value!r}")
    return value


def text(data: Mapping[str, Any], key: str, where: str, default: str = "") -> str:
    value = data.get(key, default)
    if not isinstance(value, str):
        raise DocumentError(f"{where}: {key!r} must be a string, not {value!r}")
    return value


def opt_text(data: Mapping[str, Any], key: str, where: str) -> str | None:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise DocumentError(f"{where}: {key!r} must be a string or null, not {value!r}")
    return value


def opt_obj(data: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any] | None:
    value = data.get(key)
    if value is None:
        return None
    return obj(value, f"{where}: {key!r}")


def seq(data: Mapping[str, Any], key: str, where: str) -> list[Any] | None:
    """A JSON array (as a list), or None when absent or null."""
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, list | tuple):
        raise DocumentError(f"{where}: {key!r} must be a list, not {value!r}")
    return list(value)


def rest(data: Mapping[str, Any], known: Iterable[str]) -> JsonObject:
    """The keys of `data` outside `known`, in file order: a type's `extra`."""
    names = set(known)
    return {k: v for k, v in data.items() if k not in names}


def put(out: JsonObject, key: str, value: Any) -> None:
    """Write an optional key: absent when its value is None."""
    if value is not None:
        out[key] = value


def with_extra(out: JsonObject, extra: Mapping[str, Any]) -> JsonObject:
    """`out` followed by the unknown keys (a known key is never overwritten)."""
    for k, v in extra.items():
        out.setdefault(k, v)
    return out


@dataclass(frozen=True, slots=True)
class View:
    """A block kept as its producer wrote it (its keys in their order), read through typed
    properties."""

    fields: Mapping[str, Any] = field(default_factory=no_extra)

    def get(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)

    def to_json(self) -> JsonObject:
        return dict(self.fields)

