"""The gateway's configuration: one YAML (or JSON) file plus the command line's flags.

Everything is validated up front into frozen dataclasses; a bad file is a `ConfigError` with
the offending key named, never a traceback. Loading has no side effects: the gateway decides
what to do with a new `GatewayConfig` (hot reload applies limits, keys, the shared prompt and
the replica list without dropping streams).

API keys are stored hashed: the file holds `sha256:<hex>` of each key (`chatfleet gateway
hash-key` prints it). Keys are long random tokens, so an unsalted SHA-256 is enough to keep
them out of the file; a plaintext key in the file is refused.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from chatfleet.core.documents.fields import DocumentError
from chatfleet.core.documents.sweep import SweepDoc
from chatfleet.core.errors import ChatfleetError
from chatfleet.core.fleet.fleet import FleetSettings
from chatfleet.core.fleet.prompt import SharedPrompt
from chatfleet.core.fleet.reserve import ReserveSettings
from chatfleet.core.fleet.routing import SPILL_RULES, SpillRule
from chatfleet.core.fleet.session import DEFAULT_SESSION_TTL_S
from chatfleet.http.body import BodyLimits


class ConfigError(ChatfleetError):
    """A configuration that cannot be used, with the key that is wrong."""


HASH_PREFIX = "sha256:"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$")


def hash_key(key: str) -> str:
    """What the config file stores for an API key. A header's bytes that are not UTF-8 (aiohttp
    keeps them as surrogates) hash as they came: such a key never matches, and never raises."""
    return HASH_PREFIX + hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()


def key_matches(key: str, stored: str) -> bool:
    return hmac.compare_digest(hash_key(key), stored)


@dataclass(frozen=True, slots=True)
class ReplicaConfig:
    name: str
    url: str  # http://host:port, no path
    cap: int | None = None  # None: the gateway's cap

    @property
    def host(self) -> str:
        return urlsplit(self.url).hostname or ""

    @property
    def port(self) -> int:
        return urlsplit(self.url).port or 80


@dataclass(frozen=True, slots=True)
class KeyConfig:
    name: str
    sha256: str
    max_concurrent: int | None = None  # requests queued or in flight under this key


@dataclass(frozen=True, slots=True)
class Timeouts:
    connect_s: float = 2.0  # opening a connection to a replica
    first_byte_s: float = 60.0  # from sending upstream to the response head
    idle_s: float = 60.0  # between two reads of a stream
    total_s: float = 900.0  # a whole request, queueing included
    client_body_s: float = 10.0  # reading the client's request body
    probe_s: float = 1.0  # one health probe
    client_header_s: float = 10.0  # a request head, from its first byte to its end
    client_idle_s: float = 30.0  # a client connection with no request in progress
    # a stream whose client has read nothing of what waits for it in the gateway (the
    # kernel's buffers full) for this long is cut off: its slot frees, the engine aborts
    client_read_s: float = 10.0


# (lowest, highest) a timeout may be set to; unlisted ones only need to be positive
TIMEOUT_BOUNDS: dict[str, tuple[float, float]] = {
    # the sweep that cuts idle streams runs every 0.5 s, and a prefill stalls every running
    # stream of its engine for its whole length: below a second, healthy streams get cut
    "idle_s": (1.0, 3600.0),
    "client_header_s": (0.5, 300.0),
    "client_idle_s": (1.0, 3600.0),
    # the sweep that watches clients runs every 0.5 s
    "client_read_s": (1.0, 3600.0),
}
MAX_CONNECTIONS_BOUNDS = (16, 1_000_000)


@dataclass(frozen=True, slots=True)
class Health:
    probe_interval_s: float = 2.0
    eject_after_failures: int = 3  # consecutive failures (probes or requests)
    readmit_after_successes: int = 2  # consecutive probe successes of an ejected replica


@dataclass(frozen=True, slots=True)
class StateSettings:
    """The shared store (--state redis://...), docs/gateway.md "Several gateways":
    lease_ttl_s: a gateway silent this long is taken for dead (its shares free), and after
    Redis starts empty no gateway grows its shares for this long; refresh_s: how often each
    gateway syncs its shares; timeout_s: each call's timeout; gateways: how many gateways may
    share the replicas (0: not known; each then serves nothing until Redis has confirmed its
    shares), what a gateway that has never reached Redis divides each cap by."""

    lease_ttl_s: float = 5.0
    refresh_s: float = 0.05
    timeout_s: float = 0.5
    gateways: int = 0


@dataclass(frozen=True, slots=True)
class Routing:
    affinity: bool = True
    session_ttl_s: float = DEFAULT_SESSION_TTL_S
    max_sessions: int = 1_000_000
    # the step-time model that prices a spill (recompute of a session's prefix elsewhere)
    gpu: str = "l4"
    model: str = "qwen3-8b"
    weights: str = "fp8"
    kv_cache: str = "fp8"
    shared_prefix_tokens: int = 0
    spill: SpillRule = "cost"  # when a session leaves a hot home: cost, full or never


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    replicas: tuple[ReplicaConfig, ...] = ()
    cap: int = 8
    queue_depth: int = FleetSettings().queue_depth
    ttft_budget_s: float = FleetSettings().ttft_budget_s
    prefill_reserve_s: float = FleetSettings().prefill_reserve_s
    # the reserve learned per replica (admission -> first byte); prefill_reserve_s its prior
    reserve: ReserveSettings = field(default_factory=ReserveSettings)
    prioritize_returning: bool = FleetSettings().prioritize_returning
    max_body_bytes: int = 4 * 1024 * 1024
    debug_headers: bool = False  # x-chatfleet-replica / -route on responses
    keys: tuple[KeyConfig, ...] = ()
    admin_sha256: str | None = None
    timeouts: Timeouts = field(default_factory=Timeouts)
    health: Health = field(default_factory=Health)
    routing: Routing = field(default_factory=Routing)
    state: StateSettings = field(default_factory=StateSettings)
    shared_prompt: SharedPrompt = field(default_factory=SharedPrompt)
    served_model_name: str | None = None  # None: ask the replicas
    # client connections open at once; None: from the descriptor limit (gateway/server.py)
    max_connections: int | None = None

    def replica_cap(self, replica: ReplicaConfig) -> int:
        return self.cap if replica.cap is None else replica.cap

    def find_key(self, key: str) -> KeyConfig | None:
        digest = hash_key(key)
        for k in self.keys:
            if hmac.compare_digest(digest, k.sha256):
                return k
        return None

    def is_admin(self, key: str) -> bool:
        return self.admin_sha256 is not None and key_matches(key, self.admin_sha256)

    def body_limits(self) -> BodyLimits:
        """A client's request body: at most max_body_bytes, within timeouts.client_body_s."""
        return BodyLimits(self.max_body_bytes, self.timeouts.client_body_s)


# --- parsing ----------------------------------------------------------------------------------
def _section(raw: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    value = raw.get(name, {})
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{name}: must be a mapping")
    return value


def _known(raw: Mapping[str, Any], where: str, allowed: set[str]) -> None:
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)} "
                          f"(known: {', '.join(sorted(allowed))})")


def _num(raw: Mapping[str, Any], key: str, default: float, where: str, *,
         positive: bool = True, integer: bool = False) -> Any:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{where}.{key}: must be a number, not {value!r}")
    if integer and not float(value).is_integer():
        raise ConfigError(f"{where}.{key}: must be a whole number, not {value!r}")
    if value < 0 or (positive and value == 0) or value != value or value == float("inf"):
        raise ConfigError(f"{where}.{key}: must be {'positive' if positive else '>= 0'} "
                          f"and finite, not {value!r}")
    return int(value) if integer else float(value)


def _bool(raw: Mapping[str, Any], key: str, default: bool, where: str) -> bool:
    value = raw.get(key, default)
    if not isinstance(value, bool):
        raise ConfigError(f"{where}.{key}: must be true or false, not {value!r}")
    return value


def _str(raw: Mapping[str, Any], key: str, default: str | None, where: str) -> Any:
    value = raw.get(key, default)
    if value is not None and not isinstance(value, str):
        raise ConfigError(f"{where}.{key}: must be a string, not {value!r}")
    return value


def parse_replica(value: object, index: int) -> ReplicaConfig:
    """A replica from the file (a URL string or {name, url, cap}) or the command line
    (`URL` or `NAME=URL`). Its default name is host:port."""
    where = f"replicas[{index}]"
    name: str | None = None
    cap: int | None = None
    if isinstance(value, str):
        url = value
        if "=" in value and not value.startswith("http"):
            name, url = value.split("=", 1)
    elif isinstance(value, Mapping):
        _known(value, where, {"name", "url", "cap"})
        url = _str(value, "url", None, where)
        name = _str(value, "name", None, where)
        if "cap" in value:
            cap = _num(value, "cap", 0, where, positive=False, integer=True)
        if url is None:
            raise ConfigError(f"{where}.url: missing")
    else:
        raise ConfigError(f"{where}: must be a URL or a mapping with url")
    parts = urlsplit(url.rstrip("/"))
    if parts.scheme != "http" or not parts.hostname or parts.path or parts.query:
        raise ConfigError(f"{where}: {url!r} is not an http://host:port URL (https and paths "
                          "are not supported: put the gateway next to its replicas)")
    try:
        port = parts.port or 80
    except ValueError as exc:
        raise ConfigError(f"{where}: {url!r} has a bad port") from exc
    name = name or f"{parts.hostname}:{port}"
    if not _NAME.match(name):
        raise ConfigError(f"{where}: replica name {name!r} must be 1-64 of A-Z a-z 0-9 . _ : -")
    return ReplicaConfig(name, f"http://{parts.hostname}:{port}", cap)


def _keys(raw: object) -> tuple[KeyConfig, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ConfigError("keys: must be a list of {name, sha256, max_concurrent}")
    out: list[KeyConfig] = []
    for i, item in enumerate(raw):
        where = f"keys[{i}]"
        if not isinstance(item, Mapping):
            raise ConfigError(f"{where}: must be a mapping")
        _known(item, where, {"name", "sha256", "max_concurrent"})
        name = _str(item, "name", f"key-{i}", where)
        digest = _check_hash(item.get("sha256"), where + ".sha256")
        limit = None
        if item.get("max_concurrent") is not None:
            limit = _num(item, "max_concurrent", 0, where, integer=True)
        out.append(KeyConfig(name, digest, limit))
    if len({k.sha256 for k in out}) != len(out):
        raise ConfigError("keys: the same key appears twice")
    return tuple(out)


def _check_hash(value: object, where: str) -> str:
    if not isinstance(value, str) or not re.fullmatch(r"sha256:[0-9a-f]{64}", value):
        raise ConfigError(f"{where}: must be 'sha256:' and 64 hex digits (run `chatfleet "
                          "gateway hash-key` to get it); plaintext keys are not accepted")
    return value


TOP_KEYS = {"replicas", "cap", "queue_depth", "ttft_budget_s", "prefill_reserve_s", "reserve",
            "prioritize_returning", "max_body_bytes", "debug_headers", "keys", "admin",
            "timeouts", "health", "routing", "shared_prompt", "served_model_name", "state",
            "max_connections"}


def parse_config(raw: Mapping[str, Any]) -> GatewayConfig:
    _known(raw, "config", TOP_KEYS)
    d = GatewayConfig()
    replicas_raw = raw.get("replicas") or []
    if not isinstance(replicas_raw, list):
        raise ConfigError("replicas: must be a list")
    replicas = tuple(parse_replica(r, i) for i, r in enumerate(replicas_raw))
    t_raw, h_raw, r_raw = (_section(raw, n) for n in ("timeouts", "health", "routing"))
    s_raw = _section(raw, "state")
    _known(s_raw, "state", set(StateSettings.__dataclass_fields__))
    sd = StateSettings()
    state = StateSettings(**{k: _num(s_raw, k, getattr(sd, k), "state",
                                     positive=k != "gateways", integer=k == "gateways")
                             for k in StateSettings.__dataclass_fields__})
    _known(t_raw, "timeouts", set(Timeouts.__dataclass_fields__))
    _known(h_raw, "health", set(Health.__dataclass_fields__))
    _known(r_raw, "routing", set(Routing.__dataclass_fields__))
    td, hd, rd = Timeouts(), Health(), Routing()
    timeouts = Timeouts(**{k: _bounded(_num(t_raw, k, getattr(td, k), "timeouts"),
                                       TIMEOUT_BOUNDS.get(k), f"timeouts.{k}")
                           for k in Timeouts.__dataclass_fields__})
    health = Health(
        probe_interval_s=_num(h_raw, "probe_interval_s", hd.probe_interval_s, "health"),
        eject_after_failures=_num(h_raw, "eject_after_failures", hd.eject_after_failures,
                                  "health", integer=True),
        readmit_after_successes=_num(h_raw, "readmit_after_successes",
                                     hd.readmit_after_successes, "health", integer=True))
    routing = Routing(
        affinity=_bool(r_raw, "affinity", rd.affinity, "routing"),
        session_ttl_s=_num(r_raw, "session_ttl_s", rd.session_ttl_s, "routing"),
        max_sessions=_num(r_raw, "max_sessions", rd.max_sessions, "routing", integer=True),
        gpu=_str(r_raw, "gpu", rd.gpu, "routing"),
        model=_str(r_raw, "model", rd.model, "routing"),
        weights=_str(r_raw, "weights", rd.weights, "routing"),
        kv_cache=_str(r_raw, "kv_cache", rd.kv_cache, "routing"),
        shared_prefix_tokens=_num(r_raw, "shared_prefix_tokens", rd.shared_prefix_tokens,
                                  "routing", positive=False, integer=True),
        spill=_spill(r_raw))
    admin = _section(raw, "admin")
    _known(admin, "admin", {"sha256"})
    admin_hash = _check_hash(admin["sha256"], "admin.sha256") if "sha256" in admin else None
    try:
        shared = SharedPrompt.from_config(_section(raw, "shared_prompt"))
    except ValueError as exc:
        raise ConfigError(f"shared_prompt: {exc}") from exc
    cfg = GatewayConfig(
        replicas=replicas,
        cap=_num(raw, "cap", d.cap, "config", positive=False, integer=True),
        queue_depth=_num(raw, "queue_depth", d.queue_depth, "config", positive=False,
                         integer=True),
        ttft_budget_s=_num(raw, "ttft_budget_s", d.ttft_budget_s, "config"),
        prefill_reserve_s=_num(raw, "prefill_reserve_s", d.prefill_reserve_s, "config",
                               positive=False),
        reserve=_reserve(_section(raw, "reserve")),
        prioritize_returning=_bool(raw, "prioritize_returning", d.prioritize_returning,
                                   "config"),
        max_body_bytes=_num(raw, "max_body_bytes", d.max_body_bytes, "config", integer=True),
        debug_headers=_bool(raw, "debug_headers", d.debug_headers, "config"),
        keys=_keys(raw.get("keys")), admin_sha256=admin_hash, timeouts=timeouts,
        health=health, routing=routing, state=state, shared_prompt=shared,
        served_model_name=_str(raw, "served_model_name", None, "config"),
        max_connections=None if raw.get("max_connections") is None else _bounded(
            _num(raw, "max_connections", 0, "config", integer=True), MAX_CONNECTIONS_BOUNDS,
            "max_connections"))
    return check(cfg)


def _spill(raw: Mapping[str, Any]) -> SpillRule:
    value = raw.get("spill", Routing().spill)
    if value not in SPILL_RULES:
        raise ConfigError(f"routing.spill: must be one of {', '.join(SPILL_RULES)}, not "
                          f"{value!r}")
    return value  # type: ignore[no-any-return]


def _reserve(raw: Mapping[str, Any]) -> ReserveSettings:
    """The `reserve` section: how the prefill reserve is learned (checked against the TTFT
    budget in `check`)."""
    _known(raw, "reserve", set(ReserveSettings.__dataclass_fields__))
    d = ReserveSettings()
    return ReserveSettings(
        learn=_bool(raw, "learn", d.learn, "reserve"),
        window_s=_num(raw, "window_s", d.window_s, "reserve"),
        max_samples=_num(raw, "max_samples", d.max_samples, "reserve", integer=True),
        percentile=_bounded(_num(raw, "percentile", d.percentile, "reserve"), (1.0, 100.0),
                            "reserve.percentile"),
        min_samples=_num(raw, "min_samples", d.min_samples, "reserve", integer=True),
        min_s=_num(raw, "min_s", d.min_s, "reserve", positive=False),
        max_s=None if raw.get("max_s") is None else _num(raw, "max_s", 0.0, "reserve",
                                                         positive=False),
        resolution_s=_bounded(_num(raw, "resolution_s", d.resolution_s, "reserve"),
                              (0.001, 0.1), "reserve.resolution_s"))


def _bounded(value: Any, bounds: tuple[float, float] | None, where: str) -> Any:
    if bounds is not None and not bounds[0] <= value <= bounds[1]:
        raise ConfigError(f"{where}: must lie in [{bounds[0]:g}, {bounds[1]:g}], not {value!r}")
    return value


def check(cfg: GatewayConfig) -> GatewayConfig:
    names = [r.name for r in cfg.replicas]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ConfigError(f"replicas: duplicate names {dup}")
    urls = [r.url for r in cfg.replicas]
    if len(set(urls)) != len(urls):
        raise ConfigError("replicas: the same URL appears twice")
    if cfg.prefill_reserve_s >= cfg.ttft_budget_s:
        raise ConfigError("prefill_reserve_s must be less than ttft_budget_s")
    if cfg.reserve.learn:
        try:
            cfg.reserve.check(cfg.ttft_budget_s)
        except ChatfleetError as exc:
            raise ConfigError(str(exc)) from None
    return cfg


class _UniqueKeyLoader(yaml.SafeLoader):  # type: ignore[misc]
    """YAML's safe loader, refusing a key that a mapping already has (YAML keeps the last one
    silently: a second `timeouts:` once reset every other timeout)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            if isinstance(key, str) and key in seen:
                raise ConfigError(f"duplicate key {key!r} on line {line} (first on line "
                                  f"{seen[key]}): YAML would keep only the last one")
            if isinstance(key, str):
                seen[key] = line
        mapping: dict[Any, Any] = super().construct_mapping(node, deep=deep)
        return mapping


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ConfigError(f"duplicate key {key!r}: JSON would keep only the last one")
        out[key] = value
    return out


def load_config(path: Path | None) -> GatewayConfig:
    """The file's configuration (empty: the defaults). YAML, or JSON (a subset of YAML)."""
    if path is None:
        return GatewayConfig()
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        raw = (json.loads(text, object_pairs_hook=_unique_pairs) if path.suffix == ".json"
               else yaml.load(text, Loader=_UniqueKeyLoader))
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path} is not valid {'JSON' if path.suffix == '.json' else 'YAML'}:"
                          f" {exc}") from exc
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{path}: the top level must be a mapping")
    return parse_config(raw)


@dataclass(frozen=True, slots=True)
class Overrides:
    """Command-line flags: they win over the file, at start and at every reload."""

    replicas: tuple[str, ...] = ()
    cap: int | None = None
    queue_depth: int | None = None
    gateways: int | None = None  # state.gateways

    def apply(self, cfg: GatewayConfig) -> GatewayConfig:
        if self.replicas:
            cfg = replace(cfg, replicas=tuple(parse_replica(r, i)
                                              for i, r in enumerate(self.replicas)))
        if self.cap is not None:
            if self.cap < 0:
                raise ConfigError("--cap must not be negative")
            cfg = replace(cfg, cap=self.cap)
        if self.queue_depth is not None:
            if self.queue_depth < 0:
                raise ConfigError("--queue-depth must not be negative")
            cfg = replace(cfg, queue_depth=self.queue_depth)
        if self.gateways is not None:
            if self.gateways < 1:
                raise ConfigError("--gateways must be at least 1")
            cfg = replace(cfg, state=replace(cfg.state, gateways=self.gateways))
        if not cfg.replicas:
            raise ConfigError("no replicas: pass --replica URL or list them in the config file")
        return check(cfg)


def config_summary(cfg: GatewayConfig) -> dict[str, Any]:
    """What /admin/limits shows (no key material)."""
    return {"cap": cfg.cap, "queue_depth": cfg.queue_depth,
            "caps": {r.name: cfg.replica_cap(r) for r in cfg.replicas},
            "keys": {k.name: k.max_concurrent for k in cfg.keys},
            "ttft_budget_s": cfg.ttft_budget_s, "prefill_reserve_s": cfg.prefill_reserve_s,
            "reserve": asdict(cfg.reserve),
            "timeouts": asdict(cfg.timeouts)}


def key_limits(cfg: GatewayConfig) -> dict[str, int]:
    """API key name -> its limit on requests queued or in flight (keys with a limit)."""
    return {k.name: k.max_concurrent for k in cfg.keys if k.max_concurrent is not None}


def cap_from_sweep(path: Path) -> int:
    """A sweep document's `recommended_cap` (chatfleet.sweep/1)."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read a sweep from {path}: {exc}") from exc
    try:
        cap = SweepDoc.from_json(raw, str(path)).recommended_cap
    except DocumentError as exc:
        raise ConfigError(f"{exc}: --cap-from needs a chatfleet.sweep/1 document") from None
    if cap is None or cap < 1:
        raise ConfigError(f"{path} has no recommended_cap (a chatfleet.sweep/1 document whose "
                          "knee was found carries one)")
    return cap
