"""Where gateways share their state: in process (one gateway), or Redis (several).

The core still decides (which replica, queue or shed); a backend supplies one atomic step, so
that caps hold across every gateway whatever Redis does, and a session map, so that a session
finds its replica whichever gateway it reaches. The protocol is docs/gateway.md's ("Several
gateways: the protocol"); in short:

- **Shares.** Each gateway holds a *share* of each replica's cap: the most it may have in
  flight there. Its core enforces exactly that share, so a request needs no call to Redis of
  its own. The shares of all gateways never add up to more than the cap: a share only grows
  inside the room the others' shares leave, in one atomic script (`sync`), and only once Redis
  has confirmed it does the gateway use it; it shrinks at once, locally, and never below what
  the gateway has in flight there.
- **sync**, every `refresh_s`: the gateway checks in (it is alive), publishes its demand, its
  in-flight counts and the share it wants (its fair share, core/fleet/fairshare.py), and gets
  back the shares Redis confirms and every gateway's demand.
- **Dead gateways.** One that has not synced for `fence_s` (the lease TTL) is taken for dead and
  its shares free. A Redis that answered nobody for fence_s / 2 (paused, or cut off from all)
  first forgives everybody's silence.
- **A Redis that lost its state** (restarted empty) starts a new *epoch*. For fence_s (or
  until all `gateways`, when configured, have checked in) no share may grow past what its
  gateway held before: each gateway tells Redis its prior share, and one that was not there
  before may hold its fallback share, cap // gateways, when the number of gateways is
  configured, else nothing. Then shares grow again as usual.

Every Redis call has a socket timeout, a dead pooled connection is retried once on a fresh
one, and a failure raises `StateUnavailable`; the gateway then keeps the shares Redis last
confirmed (shared.py). Times are Redis's own clock (TIME), so gateways' clocks need not agree.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from chatfleet.core.errors import ChatfleetError
from chatfleet.core.fleet.fairshare import Demand


class StateUnavailable(ConnectionError):
    """The shared store did not answer in time."""


@dataclass(frozen=True, slots=True)
class ReplicaAsk:
    """One replica in a sync: its cap; the share the gateway wants; its requests in flight
    there (the share never goes below them); the share it may re-assert in a new epoch."""

    name: str
    cap: int
    wanted: int
    in_flight: int
    prior: int


@dataclass(frozen=True, slots=True)
class SyncRequest:
    instance: str
    epoch: str | None  # the epoch the gateway last synced in (None: never)
    gateways: int  # configured number of gateways (0: not known)
    fence_s: float
    demand: Demand
    replicas: tuple[ReplicaAsk, ...]


@dataclass(frozen=True, slots=True)
class SyncResult:
    epoch: str
    grace: bool  # a new epoch's first fence_s: no share grows past its prior
    gateways: int  # live gateways, this one included
    shares: dict[str, int]  # replica -> this gateway's confirmed share
    others_in_flight: dict[str, int]  # replica -> what the other gateways have in flight
    demands: dict[str, Demand]  # instance -> its published demand (this one included)


class StateBackend(Protocol):
    shared: bool  # several gateways see the same state

    async def start(self, instance: str) -> None: ...

    async def close(self) -> None: ...

    async def sync(self, req: SyncRequest) -> SyncResult: ...

    async def leave(self, instance: str, replicas: Sequence[str]) -> None: ...

    async def get_session(self, key: str) -> str | None: ...

    async def set_session(self, key: str, replica: str, ttl_s: float) -> None: ...


class MemoryState:
    """One gateway: its own counts are the truth; every replica's share is its whole cap."""

    shared = False

    async def start(self, instance: str) -> None:
        return None

    async def close(self) -> None:
        return None

    async def sync(self, req: SyncRequest) -> SyncResult:
        return SyncResult("memory", False, 1, {r.name: r.cap for r in req.replicas},
                          {r.name: 0 for r in req.replicas}, {req.instance: req.demand})

    async def leave(self, instance: str, replicas: Sequence[str]) -> None:
        return None

    async def get_session(self, key: str) -> str | None:
        return None

    async def set_session(self, key: str, replica: str, ttl_s: float) -> None:
        return None


# KEYS: 1 epoch, 2 clock, 3 seen (instance -> last sync), 4 demand (instance -> "rate,need"),
#   then per replica r: 3 + 2r shares (instance -> share), 4 + 2r in flight (instance -> n)
# ARGV: 1 instance, 2 its epoch or "", 3 a fresh epoch token, 4 fence_s, 5 gateways (0: not
#   known), 6 demand "rate,need", 7 number of replicas, then per replica: cap, wanted, in
#   flight, prior
_SYNC = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local me, fence, n = ARGV[1], tonumber(ARGV[4]), tonumber(ARGV[7])
local epoch = redis.call('GET', KEYS[1])
if not epoch then
  epoch = ARGV[3] .. ':' .. string.format('%.6f', now)
  redis.call('SET', KEYS[1], epoch)
end
local young = now - tonumber(string.match(epoch, ':([^:]+)$')) < fence
local last = tonumber(redis.call('GET', KEYS[2]) or '')
if last and now - last > fence / 2 then
  for _, inst in ipairs(redis.call('HKEYS', KEYS[3])) do redis.call('HSET', KEYS[3], inst, now) end
end
redis.call('SET', KEYS[2], string.format('%.6f', now))
local seen = redis.call('HGETALL', KEYS[3])
for i = 1, #seen, 2 do
  if seen[i] ~= me and now - tonumber(seen[i + 1]) > fence then
    redis.call('HDEL', KEYS[3], seen[i])
    redis.call('HDEL', KEYS[4], seen[i])
    for r = 1, n do
      redis.call('HDEL', KEYS[3 + 2 * r], seen[i])
      redis.call('HDEL', KEYS[4 + 2 * r], seen[i])
    end
  end
end
redis.call('HSET', KEYS[3], me, string.format('%.6f', now))
redis.call('HSET', KEYS[4], me, ARGV[6])
local live = redis.call('HLEN', KEYS[3])
local k = math.max(tonumber(ARGV[5]), live)
-- a young epoch holds shares at their priors until every gateway that may exist is back
local grace = young and not (tonumber(ARGV[5]) > 0 and live >= tonumber(ARGV[5]))
local shares, others = {}, {}
for r = 1, n do
  local a = 8 + 4 * (r - 1)
  local cap, wanted = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  local floor, prior = tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local held, sum = nil, 0
  local all = redis.call('HGETALL', KEYS[3 + 2 * r])
  for i = 1, #all, 2 do
    if all[i] == me then held = tonumber(all[i + 1]) else sum = sum + tonumber(all[i + 1]) end
  end
  local upper
  if grace then
    upper = held or prior
  else
    upper = cap - sum - (k - live) * math.floor(cap / k)
  end
  local share = math.max(floor, math.min(wanted, upper))
  redis.call('HSET', KEYS[3 + 2 * r], me, share)
  redis.call('HSET', KEYS[4 + 2 * r], me, floor)
  shares[r] = share
  local busy = 0
  local fl = redis.call('HGETALL', KEYS[4 + 2 * r])
  for i = 1, #fl, 2 do
    if fl[i] ~= me then busy = busy + tonumber(fl[i + 1]) end
  end
  others[r] = busy
end
return cjson.encode({epoch, grace and 1 or 0, live, shares, others,
                     redis.call('HGETALL', KEYS[4])})
"""


class RedisState:
    """Redis (redis-py asyncio): `chatfleet:epoch`, `chatfleet:clock`, `chatfleet:seen`,
    `chatfleet:demand`, per replica `chatfleet:shares:{replica}` and `chatfleet:inflight:
    {replica}` (hashes by gateway instance); sessions `chatfleet:session:{key}` (strings with
    a TTL)."""

    shared = True

    def __init__(self, url: str, *, timeout_s: float = 0.5, prefix: str = "chatfleet") -> None:
        import redis.asyncio as aioredis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff
        from redis.exceptions import ConnectionError as RedisConnectionError

        self.url = url
        self.timeout_s = timeout_s
        self.prefix = prefix
        # one retry on a fresh connection for a pooled one that died (Redis restarted), none
        # for a timeout: a call takes at most about two timeouts, never redis-py's 10 retries
        # with backoff; connections idle for a second are checked before use
        self._redis: Any = aioredis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
            retry_on_timeout=False, decode_responses=True, health_check_interval=1,
            retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)))
        self._sync = self._redis.register_script(_SYNC)

    def _keys(self, replicas: Sequence[str]) -> list[str]:
        p = self.prefix
        keys = [f"{p}:epoch", f"{p}:clock", f"{p}:seen", f"{p}:demand"]
        for r in replicas:
            keys += [f"{p}:shares:{r}", f"{p}:inflight:{r}"]
        return keys

    async def _call(self, coro: Any) -> Any:
        import asyncio

        from redis.exceptions import RedisError

        try:
            return await asyncio.wait_for(coro, 3 * self.timeout_s)
        except (RedisError, OSError, TimeoutError) as exc:
            raise StateUnavailable(f"redis at {self.url}: {type(exc).__name__}") from exc

    async def start(self, instance: str) -> None:
        await self._call(self._redis.ping())

    async def close(self) -> None:
        await self._redis.aclose()

    async def sync(self, req: SyncRequest) -> SyncResult:
        import uuid

        args: list[Any] = [req.instance, req.epoch or "", uuid.uuid4().hex[:12], req.fence_s,
                           req.gateways, f"{req.demand.rate:.6g},{req.demand.need}",
                           len(req.replicas)]
        for r in req.replicas:
            args += [r.cap, r.wanted, r.in_flight, r.prior]
        names = [r.name for r in req.replicas]
        raw = await self._call(self._sync(keys=self._keys(names), args=args))
        epoch, grace, live, shares, others, demands = json.loads(raw)
        return SyncResult(
            epoch, bool(grace), int(live),
            {n: int(v) for n, v in zip(names, _list(shares), strict=True)},
            {n: int(v) for n, v in zip(names, _list(others), strict=True)},
            {demands[i]: _demand(demands[i + 1]) for i in range(0, len(demands), 2)})

    async def leave(self, instance: str, replicas: Sequence[str]) -> None:
        """A gateway that stops gives its shares back at once."""
        keys = self._keys(replicas)
        pipe = self._redis.pipeline(transaction=True)
        for key in keys[2:]:
            pipe.hdel(key, instance)
        await self._call(pipe.execute())

    async def get_session(self, key: str) -> str | None:
        value = await self._call(self._redis.get(f"{self.prefix}:session:{key}"))
        return value if isinstance(value, str) else None

    async def set_session(self, key: str, replica: str, ttl_s: float) -> None:
        await self._call(self._redis.set(f"{self.prefix}:session:{key}", replica,
                                         px=max(1, int(ttl_s * 1000))))


def _list(value: Any) -> list[Any]:
    """cjson encodes an empty Lua table as {}: no replicas."""
    return value if isinstance(value, list) else []


def _demand(text: str) -> Demand:
    rate, _, need = text.partition(",")
    try:
        return Demand(max(0.0, float(rate)), max(0, int(need)))
    except ValueError:
        return Demand(0.0, 0)


def backend_from(spec: str, timeout_s: float = 0.5) -> StateBackend:
    """`memory`, or `redis://HOST:PORT/DB`."""
    if spec == "memory":
        return MemoryState()
    if spec.startswith(("redis://", "rediss://", "unix://")):
        return RedisState(spec, timeout_s=timeout_s)
    raise ChatfleetError(f"--state must be memory or redis://HOST:PORT/DB, not {spec!r}")
