"""The harness's HTTP client: OpenAI streaming with every token's arrival recorded.

aiohttp's defaults have distorted other harnesses' results: its connector allows 100
connections (the rest queue inside the client, invisible to the measurement) and its read
buffer is 64 KB. Here the connection limit is off and the read buffer is 1 MiB.

Token counts per chunk come from `usage.completion_tokens` with
`stream_options.continuous_usage_stats` (SGLang, vLLM and the simserver honour it); a chunk
that carries k tokens has its gap split evenly over them (metrics.expand_chunks). Where an
engine does not send running usage, each chunk with text counts as one token and the record is
marked `itl_estimated`.
"""

from __future__ import annotations

import asyncio
import email.utils
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from chatfleet.bench import arrivals
from chatfleet.core.measure.itl import expand_chunks
from chatfleet.core.records import RequestRecord

READ_BUFSIZE = 1 << 20


@dataclass(slots=True)
class Clock:
    """Model time: wall seconds since `t0`, times the target's time scale."""

    scale: float = 1.0
    t0: float = field(default_factory=time.monotonic)

    def now(self) -> float:
        return (time.monotonic() - self.t0) * self.scale

    def wall_at(self, model_t: float) -> float:
        return self.t0 + model_t / self.scale

    async def sleep_until(self, model_t: float) -> None:
        delay = self.wall_at(model_t) - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)


def make_session(read_timeout_s: float = 600.0) -> aiohttp.ClientSession:
    arrivals.install()
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, ttl_dns_cache=300)
    timeout = aiohttp.ClientTimeout(total=None, connect=30.0, sock_read=read_timeout_s)
    return aiohttp.ClientSession(connector=connector, timeout=timeout,
                                 read_bufsize=READ_BUFSIZE, json_serialize=lambda o:
                                 orjson.dumps(o).decode())


@dataclass(slots=True)
class StreamOutcome:
    record: RequestRecord
    chunk_times: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    asked_tokens: int | None = None
    finish_reason: str | None = None
    text_parts: list[str] = field(default_factory=list)  # the answer's content (no reasoning)
    cached_reported: bool = False  # usage carried prompt_tokens_details.cached_tokens
    retry_after_s: float | None = None  # a 429's wait, wall seconds (see retry_after_s)

    @property
    def text(self) -> str:
        return "".join(self.text_parts)


def _delta_has_text(choice: dict[str, Any]) -> bool:
    delta = choice.get("delta")
    if isinstance(delta, dict):
        return bool(delta.get("content") or delta.get("reasoning_content")
                    or delta.get("reasoning") or delta.get("tool_calls"))
    return bool(choice.get("text"))


def _reasoning(choice: dict[str, Any]) -> str | None:
    delta = choice.get("delta")
    if isinstance(delta, dict):
        r = delta.get("reasoning_content") or delta.get("reasoning")
        return r if isinstance(r, str) else None
    return None


def _content(choice: dict[str, Any]) -> str | None:
    delta = choice.get("delta")
    if isinstance(delta, dict):
        c = delta.get("content")
        return c if isinstance(c, str) else None
    t = choice.get("text")
    return t if isinstance(t, str) else None


def _seconds(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        s = float(value.strip())
    except ValueError:
        return None
    return s if math.isfinite(s) and s >= 0 else None


def retry_after_s(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """How long a 429 asks the client to wait, in (wall) seconds: `retry-after-ms` / 1000
    when present and valid (what openai-python reads first), else `Retry-After` as seconds
    (integer or decimal) or as an HTTP date (`now`: Unix time, default the system clock);
    None when neither gives a usable value. Header names are matched case-insensitively
    when `headers` is aiohttp's (a CIMultiDict)."""
    ms = _seconds(headers.get("retry-after-ms"))
    if ms is not None:
        return ms / 1000.0
    value = headers.get("retry-after")
    if value is None:
        return None
    s = _seconds(value)
    if s is not None:
        return s
    try:
        when = email.utils.parsedate_to_datetime(value.strip())
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


async def stream(session: aiohttp.ClientSession, url: str, payload: dict[str, Any],
                 record: RequestRecord, clock: Clock,
                 headers: dict[str, str] | None = None,
                 on_chunk: Callable[[float, int], None] | None = None,
                 count_text: Callable[[str], int] | None = None) -> StreamOutcome:
    """POST a streaming request and record it. Never raises for HTTP or stream errors: they
    become the record's outcome (shed for 429, error otherwise); a 429's wait goes to the
    outcome's `retry_after_s`.

    Without running usage, a chunk's tokens are counted with `count_text` (the tokenizer), at
    least one per chunk with text; when the final usage gives the true total, the difference
    goes to the last chunk. Either way the record is marked `itl_estimated`."""
    out = StreamOutcome(record, asked_tokens=payload.get("max_tokens"))
    loop = asyncio.get_running_loop()
    arrivals.stamp_selects(loop)
    record.send_time = clock.now()
    last_t = record.send_time
    prev_tokens = 0
    estimated = False
    try:
        async with session.post(url, json=payload, headers=headers) as resp:
            if resp.status != 200:
                body = (await resp.read())[:500].decode("utf-8", "replace")
                record.outcome = "shed" if resp.status == 429 else "error"
                record.error = f"HTTP {resp.status}: {body}"
                if resp.status == 429:
                    record.error += f" (retry-after {resp.headers.get('retry-after')})"
                    out.retry_after_s = retry_after_s(resp.headers)
                return out
            stamps = arrivals.StreamStamps(resp, loop)
            try:
                async for line in resp.content:
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        break
                    arrivals.poll(loop)
                    t = clock.now()
                    stamp = stamps.next()
                    if stamp is not None:
                        arrived = (stamp - clock.t0) * clock.scale
                        # a stamp is only taken if it lies after what this stream has seen
                        # (its send, its last chunk): an earlier one is not these bytes'
                        if last_t <= arrived <= t:
                            t = arrived
                    last_t = t
                    try:
                        obj = orjson.loads(data)
                    except orjson.JSONDecodeError:
                        record.outcome = "error"
                        record.error = f"malformed stream chunk: {data[:200]!r}"
                        return out
                    if record.response_id is None and isinstance(obj.get("id"), str):
                        record.response_id = obj["id"]  # the engine's own id for the request
                    if "error" in obj and not obj.get("choices"):
                        record.outcome = "error"
                        record.error = str(obj["error"])[:500]
                        return out
                    usage = obj.get("usage")
                    choices = obj.get("choices") or []
                    n = 0
                    if isinstance(usage, dict):
                        details = usage.get("prompt_tokens_details") or {}
                        if details.get("cached_tokens") is not None:
                            out.cached_reported = True
                        record.cached_tokens = int(details.get("cached_tokens") or 0)
                        record.prompt_tokens = int(usage.get("prompt_tokens") or 0)
                        total = int(usage.get("completion_tokens") or 0)
                        if estimated or not choices or not _delta_has_text(choices[0]):
                            # a closing usage block: reconcile the estimate with the true total
                            if out.chunk_tokens and total > prev_tokens:
                                out.chunk_tokens[-1] += total - prev_tokens
                                prev_tokens = total
                        else:
                            n = total - prev_tokens
                            prev_tokens = total
                    elif choices and _delta_has_text(choices[0]):
                        text = _content(choices[0]) or _reasoning(choices[0]) or ""
                        n = max(1, count_text(text)) if count_text and text else 1
                        prev_tokens += n
                        estimated = True
                    content = _content(choices[0]) if choices else None
                    if content:
                        out.text_parts.append(content)
                    if choices and choices[0].get("finish_reason"):
                        out.finish_reason = choices[0]["finish_reason"]
                    if n > 0:
                        out.chunk_times.append(t)
                        out.chunk_tokens.append(n)
                        if on_chunk is not None:
                            on_chunk(t, n)
            finally:
                stamps.close()  # before the connection goes back to the pool
    except (TimeoutError, aiohttp.ClientError, ConnectionError) as exc:
        record.outcome = "error"
        record.error = f"{type(exc).__name__}: {exc}"[:500]
    except asyncio.CancelledError:
        _keep_tokens(out, estimated)  # cut off (a drain limit): the tokens that came count
        raise
    _keep_tokens(out, estimated)
    if record.outcome == "ok" and not out.chunk_times:
        record.outcome = "error"
        record.error = record.error or "the stream ended without a token"
    return out


def _keep_tokens(out: StreamOutcome, estimated: bool) -> None:
    """The chunks read so far become the record's per-token times and counts."""
    record = out.record
    if out.chunk_times:
        record.token_times = expand_chunks(None, out.chunk_times, out.chunk_tokens)
        record.first_token_time = out.chunk_times[0]
    record.output_tokens = sum(out.chunk_tokens)
    record.itl_estimated = estimated
