"""What the HTTP servers (gateway, simserver) write to their logs: every line stamped
(`setup_logging`), and a client's mistakes in one short line, never a traceback or the client's
bytes.

aiohttp answers a malformed request (bad framing, a header too long, a bare LF) with 400 and
logs it as an error with a traceback, its message quoting the offending line whole (a 4 MiB
body sent past its Content-Length is read as one 4 MiB request line); it does the same when it
drains a body that does not decode (a bad gzip) after the answer. `QuietBadRequests` turns
each into one warning line of at most `MAX_LOGGED_CHARS` characters.
"""

from __future__ import annotations

import logging
import time

from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

MAX_LOGGED_CHARS = 200
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class StampedFormatter(logging.Formatter):
    """Local time, ISO 8601 with milliseconds and the UTC offset:
    2026-12-01T10:37:57.123+0000 WARNING chatfleet.gateway: replica b ejected ..."""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        t = time.localtime(record.created)
        return (time.strftime("%Y-%m-%dT%H:%M:%S", t) + f".{int(record.msecs):03d}"
                + time.strftime("%z", t))


def setup_logging(level: int = logging.INFO) -> None:
    """One stamped handler on stderr for the process (a server's CLI calls it once)."""
    handler = logging.StreamHandler()
    handler.setFormatter(StampedFormatter(LOG_FORMAT))
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(level)


def clip(text: str, limit: int = MAX_LOGGED_CHARS) -> str:
    """`text` on one line, cut to `limit` characters (an ellipsis says it was cut)."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit - 1] + "…"


class QuietBadRequests(logging.Filter):
    """A client's malformed request or body: one warning line (module docstring)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            record.msg = "bad request answered %s: %s"
            record.args = (exc.code, clip(str(exc.message)))
        elif isinstance(exc, RequestPayloadError):
            record.msg = "bad request body: %s"
            record.args = (clip(str(exc)),)
        else:
            return True
        record.exc_info = None
        record.exc_text = None
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def quiet_bad_requests() -> None:
    """Install the filter on aiohttp's server logger (once)."""
    logger = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, QuietBadRequests) for f in logger.filters):
        logger.addFilter(QuietBadRequests())
