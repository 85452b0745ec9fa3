"""`chatfleet gateway`: the aiohttp application, its front routes and its background tasks.

Front: POST /v1/chat/completions and /v1/completions (streaming or not), GET /v1/models;
/health (the process is up), /ready (at least one replica takes requests), /metrics
(Prometheus), /openapi.json (its OpenAPI description, gateway/openapi.py). Admin (admin key):
/admin/replicas, /admin/limits, /admin/reload (gateway/admin.py).
Background: health probes (one round before the gateway listens: a replica takes requests
only once it has passed one), the idle/total timeout sweep, and the config file watch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from chatfleet.core.engine.build import EngineSpec, step_time_model
from chatfleet.core.engine.step_time import StepTimeModel
from chatfleet.core.fleet.admission import FleetRequest
from chatfleet.core.fleet.fleet import FleetTrace
from chatfleet.core.fleet.prompt import PrefixCheck, canonicalize, describe
from chatfleet.core.fleet.routing import SESSION_HEADER, is_returning, session_key
from chatfleet.core.specs import SpecError, builtin_model, get_gpu, precision
from chatfleet.gateway.admin import add_admin_routes
from chatfleet.gateway.admission import DecisionLog
from chatfleet.gateway.config import ConfigError, GatewayConfig, KeyConfig, Overrides, load_config
from chatfleet.gateway.fleet import LiveFleet
from chatfleet.gateway.metrics import GatewayMetrics, exposition, registry
from chatfleet.gateway.openapi import openapi
from chatfleet.gateway.relay import (
    Call,
    Outcome,
    Relay,
    RelaySettings,
    StreamWatch,
    next_request_id,
)
from chatfleet.gateway.shared import SharedCaps
from chatfleet.gateway.state import MemoryState, StateBackend, StateUnavailable
from chatfleet.http.body import check_writable, read_object
from chatfleet.http.errors import BadRequest, ClientLeft, error, error_middleware
from chatfleet.http.headers import name_server
from chatfleet.http.models import ChatCompletionRequest, CompletionRequest, GenerationRequest, parse

log = logging.getLogger("chatfleet.gateway")
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:#-]{1,128}$")
KEY = web.RequestKey("key", KeyConfig)
SWEEP_S = 0.5
WATCH_S = 1.0
MODELS_TTL_S = 30.0


def step_time_for(cfg: GatewayConfig) -> StepTimeModel:
    """The step-time model that prices a spill, from the routing section's deployment."""
    r = cfg.routing
    try:
        spec = EngineSpec(get_gpu(r.gpu), builtin_model(r.model),
                          precision(r.weights, r.kv_cache))
    except SpecError as exc:
        raise ConfigError(f"routing: {exc}") from exc
    return step_time_model(spec)


class Gateway:
    """The wiring: the routes and middlewares, the fleet, the relay, the shared state and the
    background tasks, built from the configuration; also the admin API's `AdminOps`."""

    def __init__(self, cfg: GatewayConfig, *, config_path: Path | None = None,
                 overrides: Overrides | None = None, decisions: DecisionLog | None = None,
                 step_time: StepTimeModel | None = None,
                 fleet_trace: FleetTrace | None = None,
                 state: StateBackend | None = None) -> None:
        self.cfg = cfg
        self.config_path = config_path
        self.overrides = overrides or Overrides()
        self.decisions = decisions
        self.fleet_trace = fleet_trace
        self.state: StateBackend = state if state is not None else MemoryState()
        self.metrics = GatewayMetrics()
        self._step_time = step_time or step_time_for(cfg)
        self._live_ids: set[str] = set()
        self._publishing: set[asyncio.Task[None]] = set()
        self.prefix = PrefixCheck(cfg.shared_prompt)
        self._prefix_for = cfg.shared_prompt
        self.watch = StreamWatch()
        self._tasks: list[asyncio.Task[None]] = []
        self._config_mtime = self._mtime()
        self._models: tuple[float, bytes] | None = None
        self._openapi: bytes | None = None
        self._session: aiohttp.ClientSession | None = None
        self.app = self._build_app()

    # --- wiring -------------------------------------------------------------------------------
    def _build_app(self) -> web.Application:
        app = web.Application(middlewares=[error_middleware(log, "gateway"), self._auth],
                              client_max_size=2**40, handler_args={"max_field_size": 16384})
        name_server(app)
        r = app.router
        r.add_post("/v1/chat/completions", self.chat)
        r.add_post("/v1/completions", self.completions)
        r.add_get("/v1/models", self.models)
        r.add_get("/health", self.health)
        r.add_get("/ready", self.ready)
        r.add_get("/metrics", self.metrics_route)
        r.add_get("/openapi.json", self.openapi)
        add_admin_routes(self, r)
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)
        return app

    async def _start(self, app: web.Application) -> None:
        self.loop = asyncio.get_running_loop()
        self.fleet = LiveFleet(self.cfg, self._step_time, self.metrics, self.decisions,
                               self.fleet_trace)
        self.registry = registry(self.metrics, self.fleet.gauges)
        self.relay = Relay(self.fleet.admission, self.fleet.registry, self.metrics,
                           relay_settings(self.cfg), self.watch, self.remember_session)
        self.shared = SharedCaps(self.state, self.fleet, self.metrics, self.cfg.state)
        await self.shared.start()
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self.cfg.timeouts.probe_s))
        await self._probe_all()  # bounded by probe_s: the replicas that are up serve at once
        self._tasks = [asyncio.create_task(self._probe_loop()),
                       asyncio.create_task(self._sweep_loop())]
        if self.config_path is not None:
            self._tasks.append(asyncio.create_task(self._watch_loop()))

    async def _stop(self, app: web.Application) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.shared.close()
        self.fleet.close()
        if self._session is not None:
            await self._session.close()

    # --- middlewares (the errors' is chatfleet/http/errors.py's) -----------------------------
    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        path = request.path
        if path.startswith("/admin"):
            if self.cfg.admin_sha256 is None:
                return error(404, "the admin API is off: set admin.sha256 in the config file")
            if not self.cfg.is_admin(_bearer(request)):
                return error(401, "the admin API needs the admin key", code="invalid_api_key")
        elif path.startswith("/v1/") and self.cfg.keys:
            key = self.cfg.find_key(_bearer(request))
            if key is None:
                return error(401, "missing or unknown API key (Authorization: Bearer KEY)",
                             code="invalid_api_key")
            request[KEY] = key
        resp: web.StreamResponse = await handler(request)
        return resp

    # --- front --------------------------------------------------------------------------------
    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "/v1/chat/completions", ChatCompletionRequest)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "/v1/completions", CompletionRequest)

    async def _generate(self, request: web.Request, path: str,
                        model: type[GenerationRequest]) -> web.StreamResponse:
        arrival = self.loop.time()
        body = await self._read_json(request)
        # OpenAI's types, strictly, before the request takes a slot; the body goes on as it came
        stream = parse(model, body, strict=True).stream
        cfg = self.cfg
        headers: dict[str, str] = {}
        if cfg.shared_prompt.mode == "own":
            body = canonicalize(body, cfg.shared_prompt)
        elif model is ChatCompletionRequest:
            report = self.prefix.check(body)
            if report.checked and not report.matches:
                self.metrics.prefix_mismatches += 1
            if cfg.debug_headers:  # where a prompt differs tells a client the secret one
                headers["x-chatfleet-prefix"] = describe(report)
        if stream:  # the answer's usage teaches the router the session's token counts
            opts = body.get("stream_options")
            opts = dict(opts) if isinstance(opts, dict) else {}
            if opts.get("include_usage") is not True:
                opts["include_usage"] = True
                body = {**body, "stream_options": opts}
        key = request.get(KEY)
        if not _is_utf8(request.headers.get(SESSION_HEADER, "")):
            raise BadRequest("X-Session-ID must be UTF-8 text", SESSION_HEADER)
        rid = request.headers.get("X-Request-ID") or body.get("rid") or ""
        if not isinstance(rid, str) or not _REQUEST_ID.match(rid) or rid in self._live_ids:
            rid = next_request_id()
        skey = session_key(request.headers, body)
        fleet = self.fleet
        if skey is not None and self.shared.shared and self.shared.up \
                and not fleet.admission.core.is_returning(skey, arrival):
            await self._adopt(skey)
            arrival = self.loop.time()
        returning = is_returning(body) or fleet.admission.core.is_returning(skey, arrival)
        freq = FleetRequest(rid, skey, arrival, returning,
                            key=key.name if key is not None else None)
        call = Call(rid, path, orjson.dumps(body), stream, freq, arrival, headers)
        del body  # while it waits for a slot, a request holds its bytes, not their objects
        self._live_ids.add(rid)
        outcome = Outcome.ERROR
        try:
            # every wait inside is bounded: the queue by the deadline, the upstream by the
            # connect and first-byte (or total) timeouts, the stream by the idle and total
            # ones (sweep)
            relayed = await self.relay.run(request, call)
            outcome = relayed.outcome
            return relayed.response
        except (asyncio.CancelledError, ConnectionResetError):
            outcome = Outcome.CANCELLED
            raise
        finally:
            self._live_ids.discard(rid)
            self.metrics.count(outcome, cut_off=call.cut_off)  # the one count

    async def _adopt(self, key: str) -> None:
        """A session this gateway does not know: where did another gateway place it?"""
        try:
            replica = await self.state.get_session(key)
        except StateUnavailable:
            return
        if replica is not None and replica in self.fleet.replicas:
            self.fleet.admission.core.adopt_session(key, replica, self.loop.time())

    def remember_session(self, request: FleetRequest, replica: str) -> None:
        """Publish where a session runs now (fire and forget: the next turn may come in
        through another gateway)."""
        key = request.session_key
        if key is None or not self.shared.shared or not self.shared.up:
            return
        task = asyncio.create_task(self._publish(key, replica))
        self._publishing.add(task)
        task.add_done_callback(self._publishing.discard)

    async def _publish(self, key: str, replica: str) -> None:
        with contextlib.suppress(StateUnavailable):
            await self.state.set_session(key, replica, self.cfg.routing.session_ttl_s)

    async def _read_json(self, request: web.Request) -> dict[str, Any]:
        try:
            body = await read_object(request, self.cfg.body_limits())
        except ClientLeft as exc:  # nobody to answer: one line, no traceback
            log.info("client %s left while sending its body (%s)", request.remote,
                     type(exc.__cause__).__name__)
            self.metrics.client_left()
            raise
        check_writable(body)  # what cannot be written cannot be forwarded
        return body

    async def models(self, request: web.Request) -> web.Response:
        if self.cfg.served_model_name:
            return web.Response(body=_models_body([self.cfg.served_model_name]),
                                content_type="application/json")
        now = self.loop.time()
        if self._models is not None and now - self._models[0] < MODELS_TTL_S:
            return web.Response(body=self._models[1], content_type="application/json")
        ids: list[str] = []
        for rep in self.fleet.replicas.values():
            if not rep.serving or self._session is None:
                continue
            with contextlib.suppress(Exception):
                async with self._session.get(rep.config.url + "/v1/models") as r:
                    doc = await r.json(content_type=None)
                    ids = [m["id"] for m in doc.get("data", [])
                           if isinstance(m, dict) and isinstance(m.get("id"), str)]
                if ids:
                    break
        if not ids:
            return error(503, "no replica answered /v1/models", code="no_replica")
        body = _models_body(ids)
        self._models = (now, body)
        return web.Response(body=body, content_type="application/json")

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def ready(self, request: web.Request) -> web.Response:
        reps = self.fleet.replicas.items()
        serving = [n for n, r in reps if r.serving]
        status = 200 if serving else 503
        return web.json_response({"ready": bool(serving), "serving": serving,
                                  "ejected": [n for n, r in reps if r.health.ejected],
                                  "pending": [n for n, r in reps if r.health.pending]},
                                 status=status)

    async def metrics_route(self, request: web.Request) -> web.Response:
        return web.Response(body=exposition(self.registry),
                            content_type="text/plain", charset="utf-8",
                            headers={"X-Content-Type-Options": "nosniff"})

    async def openapi(self, request: web.Request) -> web.Response:
        if self._openapi is None:
            self._openapi = orjson.dumps(openapi())
        return web.Response(body=self._openapi, content_type="application/json")

    # --- configuration (AdminOps) ---------------------------------------------------------------
    def config(self) -> GatewayConfig:
        return self.cfg

    def replicas(self) -> list[dict[str, Any]]:
        f = self.fleet
        return [{"name": n, "url": rep.config.url, "cap": rep.cap,
                 "in_flight": f.in_flight(n), "serving": rep.serving,
                 "ejected": rep.health.ejected, "pending": rep.health.pending}
                for n, rep in f.replicas.items()]

    def apply(self, cfg: GatewayConfig) -> None:
        """Take a new configuration; streams keep running."""
        self.cfg = cfg
        self.relay.settings = relay_settings(cfg)
        self.shared.settings = cfg.state
        if cfg.shared_prompt != self._prefix_for:  # a new canonical prefix: check against it
            self.prefix = PrefixCheck(cfg.shared_prompt)
            self._prefix_for = cfg.shared_prompt
        self.fleet.apply(cfg)
        self.metrics.reloads += 1
        self._models = None

    def reload(self) -> GatewayConfig:
        """Re-read the config file (plus the command line's flags); raises ConfigError and
        keeps the running configuration when the file is bad (or there is none)."""
        if self.config_path is None:
            raise ConfigError("the gateway was started without --config")
        cfg = self.overrides.apply(load_config(self.config_path))
        self.apply(cfg)
        return cfg

    def _mtime(self) -> float | None:
        if self.config_path is None:
            return None
        with contextlib.suppress(OSError):
            return self.config_path.stat().st_mtime
        return None

    async def _watch_loop(self) -> None:
        while True:
            await asyncio.sleep(WATCH_S)
            mtime = self._mtime()
            if mtime is None or mtime == self._config_mtime:
                continue
            self._config_mtime = mtime
            try:
                self.reload()
                log.warning("configuration reloaded from %s", self.config_path)
            except ConfigError as exc:
                log.error("configuration not reloaded (the running one is kept): %s", exc)

    # --- health and timeouts ------------------------------------------------------------------
    async def probe(self, name: str) -> bool:
        rep = self.fleet.replicas.get(name)
        if rep is None or self._session is None:
            return False
        reason = ""
        try:
            async with self._session.get(rep.config.url + "/health") as r:
                await r.read()
                ok = r.status == 200
                reason = f"probe answered HTTP {r.status}"
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            ok = False
            reason = f"probe failed: {type(exc).__name__}"
        self.fleet.registry.report(name, ok, probe=True, reason=reason)
        return ok

    async def _probe_all(self) -> None:
        names = list(self.fleet.replicas)
        await asyncio.gather(*(self.probe(n) for n in names), return_exceptions=True)

    async def _probe_loop(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.health.probe_interval_s)
            await self._probe_all()

    async def _sweep_loop(self) -> None:
        """Abort streams idle for longer than timeouts.idle_s, or past the request's total
        timeout: the client gets the SSE error event; and cut off clients that have read
        nothing for timeouts.client_read_s while their answer waits (relay.StreamWatch)."""
        while True:
            await asyncio.sleep(SWEEP_S)
            t = self.cfg.timeouts
            self.watch.sweep(self.loop.time(), t.idle_s, t.client_read_s)


def relay_settings(cfg: GatewayConfig) -> RelaySettings:
    return RelaySettings(cfg.timeouts, cfg.debug_headers)


def _is_utf8(header: str) -> bool:
    """aiohttp decodes header bytes as UTF-8 with surrogateescape: bytes that are not UTF-8
    come back as lone surrogates, which nothing downstream can encode."""
    try:
        header.encode()
    except UnicodeEncodeError:
        return False
    return True


def _bearer(request: web.Request) -> str:
    auth = request.headers.get("Authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return request.headers.get("api-key", "")


def _models_body(ids: list[str]) -> bytes:
    created = int(time.time())
    return orjson.dumps({"object": "list", "data": [
        {"id": i, "object": "model", "created": created, "owned_by": "chatfleet"}
        for i in ids]})
