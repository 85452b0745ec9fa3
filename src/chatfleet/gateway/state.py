"""Where gateways share their state: in process (one gateway), or Redis (several).

The core still decides (which replica, queue or shed); a backend only supplies atomic
primitives, so that caps hold across every gateway and a session finds its replica whichever
gateway it reaches:

- **Slot leases**, per replica, with a TTL: `try_acquire(replica, cap, lease)` takes a slot
  only while fewer than `cap` unexpired leases exist (one atomic script); `release` drops it;
  `renew` pushes the expiry of every lease a gateway holds (and re-asserts a lease a restarted,
  empty Redis lost). A crashed gateway's leases expire on their own.
- **Counts**: unexpired leases per replica, which each gateway reads to know what the others
  hold.
- **Sessions**: session key -> replica, with a TTL.
- **Instances**: each gateway's heartbeat, so that without Redis a gateway can fall back to
  its share of each cap (cap / instances last seen).

Every Redis call has a socket timeout; a failure raises `StateUnavailable`, which the gateway
turns into its local-share mode until Redis answers again. Times are Redis's own clock (TIME),
so gateways' clocks need not agree.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from chatfleet.core.errors import ChatfleetError

LEASE_TTL_S = 15.0
INSTANCE_TTL_S = 5.0


class StateUnavailable(ConnectionError):
    """The shared store did not answer in time."""


class StateBackend(Protocol):
    shared: bool  # several gateways see the same state

    async def start(self, instance: str) -> None: ...

    async def close(self) -> None: ...

    async def try_acquire(self, replica: str, cap: int, lease: str) -> bool: ...

    async def release(self, replica: str, lease: str) -> None: ...

    async def renew(self, leases: Iterable[tuple[str, str]]) -> None: ...

    async def counts(self, replicas: Iterable[str]) -> dict[str, int]: ...

    async def get_session(self, key: str) -> str | None: ...

    async def set_session(self, key: str, replica: str, ttl_s: float) -> None: ...

    async def heartbeat(self, instance: str) -> int: ...


class MemoryState:
    """One gateway: its own counts are the truth, so every primitive is trivially local."""

    shared = False

    async def start(self, instance: str) -> None:
        return None

    async def close(self) -> None:
        return None

    async def try_acquire(self, replica: str, cap: int, lease: str) -> bool:
        return True

    async def release(self, replica: str, lease: str) -> None:
        return None

    async def renew(self, leases: Iterable[tuple[str, str]]) -> None:
        return None

    async def counts(self, replicas: Iterable[str]) -> dict[str, int]:
        return {}

    async def get_session(self, key: str) -> str | None:
        return None

    async def set_session(self, key: str, replica: str, ttl_s: float) -> None:
        return None

    async def heartbeat(self, instance: str) -> int:
        return 1


# KEYS[1] = the replica's lease set; ARGV = cap, lease id, ttl
_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZSCORE', KEYS[1], ARGV[2]) then return 1 end
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[1]) then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[2])
  return 1
end
return 0
"""
# KEYS = lease sets; ARGV = ttl, then lease ids (one per key): push expiry, re-add if lost
_RENEW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
for i, key in ipairs(KEYS) do
  redis.call('ZADD', key, now + tonumber(ARGV[1]), ARGV[i + 1])
end
return #KEYS
"""
# KEYS = lease sets: count unexpired leases in each
_COUNTS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local out = {}
for i, key in ipairs(KEYS) do
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  out[i] = redis.call('ZCARD', key)
end
return out
"""
# KEYS[1] = the instance set; ARGV = instance id, ttl: count live instances
_HEARTBEAT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return redis.call('ZCARD', KEYS[1])
"""


class RedisState:
    """Redis (redis-py asyncio): lease sets `chatfleet:leases:{replica}` (sorted sets scored by
    expiry), sessions `chatfleet:session:{key}` (strings with a TTL), instances
    `chatfleet:instances`."""

    shared = True

    def __init__(self, url: str, *, timeout_s: float = 0.5, lease_ttl_s: float = LEASE_TTL_S,
                 prefix: str = "chatfleet") -> None:
        import redis.asyncio as aioredis

        self.url = url
        self.lease_ttl_s = lease_ttl_s
        self.prefix = prefix
        self._redis: Any = aioredis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
            retry_on_timeout=False, decode_responses=True, health_check_interval=0)
        self._acquire = self._redis.register_script(_ACQUIRE)
        self._renew = self._redis.register_script(_RENEW)
        self._counts = self._redis.register_script(_COUNTS)
        self._heartbeat = self._redis.register_script(_HEARTBEAT)

    def _lease_key(self, replica: str) -> str:
        return f"{self.prefix}:leases:{replica}"

    async def _call(self, coro: Any) -> Any:
        from redis.exceptions import RedisError

        try:
            return await coro
        except (RedisError, OSError, TimeoutError) as exc:
            raise StateUnavailable(f"redis at {self.url}: {type(exc).__name__}") from exc

    async def start(self, instance: str) -> None:
        await self._call(self._redis.ping())

    async def close(self) -> None:
        await self._redis.aclose()

    async def try_acquire(self, replica: str, cap: int, lease: str) -> bool:
        got = await self._call(self._acquire(keys=[self._lease_key(replica)],
                                             args=[cap, lease, self.lease_ttl_s]))
        return bool(got)

    async def release(self, replica: str, lease: str) -> None:
        await self._call(self._redis.zrem(self._lease_key(replica), lease))

    async def renew(self, leases: Iterable[tuple[str, str]]) -> None:
        pairs = list(leases)
        if pairs:
            await self._call(self._renew(keys=[self._lease_key(r) for r, _ in pairs],
                                         args=[self.lease_ttl_s, *(lease for _, lease in pairs)]))

    async def counts(self, replicas: Iterable[str]) -> dict[str, int]:
        names = list(replicas)
        if not names:
            return {}
        got = await self._call(self._counts(keys=[self._lease_key(r) for r in names]))
        return {r: int(n) for r, n in zip(names, got, strict=True)}

    async def get_session(self, key: str) -> str | None:
        value = await self._call(self._redis.get(f"{self.prefix}:session:{key}"))
        return value if isinstance(value, str) else None

    async def set_session(self, key: str, replica: str, ttl_s: float) -> None:
        await self._call(self._redis.set(f"{self.prefix}:session:{key}", replica,
                                         px=max(1, int(ttl_s * 1000))))

    async def heartbeat(self, instance: str) -> int:
        n = await self._call(self._heartbeat(keys=[f"{self.prefix}:instances"],
                                             args=[instance, INSTANCE_TTL_S]))
        return max(1, int(n))


def backend_from(spec: str, timeout_s: float = 0.5,
                 lease_ttl_s: float = LEASE_TTL_S) -> StateBackend:
    """`memory`, or `redis://HOST:PORT/DB`."""
    if spec == "memory":
        return MemoryState()
    if spec.startswith(("redis://", "rediss://", "unix://")):
        return RedisState(spec, timeout_s=timeout_s, lease_ttl_s=lease_ttl_s)
    raise ChatfleetError(f"--state must be memory or redis://HOST:PORT/DB, not {spec!r}")
