"""The admin API (admin key only): replicas and limits at run time, and a config reload.

Changes made here last until the next reload of the config file, which restates the file (and
the command line's flags). None of them drops a running stream: lowering a cap stops new
admissions until the replica is under it; removing a replica lets its streams finish.

    GET    /admin/replicas              name, url, cap, in flight, serving, ejected, pending
    (a replica added here is pending: it takes requests after its first successful probe)
    POST   /admin/replicas              {"url": ..., "name": ..., "cap": ...}
    DELETE /admin/replicas/{name}
    GET    /admin/limits                caps, queue depth, per-key limits
    PUT    /admin/limits                {"cap": n | "caps": {name: n}, "queue_depth": n,
                                         "keys": {name: n | null}}
    POST   /admin/reload                re-read the config file
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import orjson
from aiohttp import web

from chatfleet.gateway import errors
from chatfleet.gateway.config import (
    ConfigError,
    GatewayConfig,
    check,
    config_summary,
    parse_replica,
)


class AdminOps(Protocol):
    """What the admin API may do to a gateway (app.Gateway provides it)."""

    def config(self) -> GatewayConfig: ...

    def replicas(self) -> list[dict[str, Any]]:
        """Per replica: name, url, cap, in_flight, serving, ejected, pending."""
        ...

    def apply(self, cfg: GatewayConfig) -> None: ...

    def reload(self) -> GatewayConfig:
        """Re-read the config file; ConfigError (the running configuration is kept) when it
        is bad or there is none."""
        ...


def add_admin_routes(ops: AdminOps, r: web.UrlDispatcher) -> None:
    async def body(request: web.Request) -> dict[str, Any]:
        try:
            doc = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            doc = None
        if not isinstance(doc, dict):
            raise _Bad("the body must be a JSON object")
        return doc

    async def list_replicas(request: web.Request) -> web.Response:
        return web.json_response({"replicas": ops.replicas()})

    async def add_replica(request: web.Request) -> web.Response:
        try:
            rc = parse_replica(await body(request), 0)
            now = ops.config()
            cfg = check(dataclasses.replace(now, replicas=(*now.replicas, rc)))
        except (ConfigError, _Bad) as exc:
            return errors.error(400, str(exc))
        ops.apply(cfg)
        return web.json_response({"replicas": ops.replicas()}, status=201)

    async def remove_replica(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        now = ops.config()
        kept = tuple(x for x in now.replicas if x.name != name)
        if len(kept) == len(now.replicas):
            return errors.error(404, f"no replica named {name!r}")
        if not kept:
            return errors.error(400, "cannot remove the last replica")
        ops.apply(dataclasses.replace(now, replicas=kept))
        return web.json_response({"replicas": ops.replicas()})

    async def get_limits(request: web.Request) -> web.Response:
        return web.json_response(config_summary(ops.config()))

    async def put_limits(request: web.Request) -> web.Response:
        try:
            cfg = _limits(ops.config(), await body(request))
        except (ConfigError, _Bad) as exc:
            return errors.error(400, str(exc))
        ops.apply(cfg)
        return web.json_response(config_summary(ops.config()))

    async def reload(request: web.Request) -> web.Response:
        try:
            ops.reload()
        except ConfigError as exc:
            return errors.error(400, f"not reloaded (the running configuration is kept): "
                                f"{exc}")
        return web.json_response(config_summary(ops.config()))

    r.add_get("/admin/replicas", list_replicas)
    r.add_post("/admin/replicas", add_replica)
    r.add_delete("/admin/replicas/{name}", remove_replica)
    r.add_get("/admin/limits", get_limits)
    r.add_put("/admin/limits", put_limits)
    r.add_post("/admin/reload", reload)


class _Bad(ValueError):
    pass


def _count(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _Bad(f"{what} must be a whole number >= 0, not {value!r}")
    return value


def _limits(cfg: GatewayConfig, doc: dict[str, Any]) -> GatewayConfig:
    unknown = set(doc) - {"cap", "caps", "queue_depth", "keys"}
    if unknown:
        raise _Bad(f"unknown key(s) {sorted(unknown)}: use cap, caps, queue_depth, keys")
    if "cap" in doc:
        cfg = dataclasses.replace(cfg, cap=_count(doc["cap"], "cap"), replicas=tuple(
            dataclasses.replace(x, cap=None) for x in cfg.replicas))
    caps = doc.get("caps", {})
    if not isinstance(caps, dict):
        raise _Bad("caps must map replica names to caps")
    names = {x.name for x in cfg.replicas}
    for name in caps:
        if name not in names:
            raise _Bad(f"no replica named {name!r}")
    cfg = dataclasses.replace(cfg, replicas=tuple(
        dataclasses.replace(x, cap=_count(caps[x.name], f"caps.{x.name}"))
        if x.name in caps else x for x in cfg.replicas))
    if "queue_depth" in doc:
        cfg = dataclasses.replace(cfg, queue_depth=_count(doc["queue_depth"], "queue_depth"))
    keys = doc.get("keys", {})
    if not isinstance(keys, dict):
        raise _Bad("keys must map key names to limits")
    known = {k.name for k in cfg.keys}
    for name, limit in keys.items():
        if name not in known:
            raise _Bad(f"no key named {name!r}")
        if limit is not None and _count(limit, f"keys.{name}") < 1:
            raise _Bad(f"keys.{name} must be at least 1 (or null: no limit)")
    cfg = dataclasses.replace(cfg, keys=tuple(
        dataclasses.replace(k, max_concurrent=keys[k.name]) if k.name in keys else k
        for k in cfg.keys))
    return check(cfg)
