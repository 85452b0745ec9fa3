"""The gateway benchmark's processes (benchmarks/gateway.py): each target in its own session,
stopped by its own id, and the checks every target passes before the load: one full stream,
and streams dropped by the client that the engine must see aborted."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from relay_engine import HOST, MODEL

CHAT_PATH = "/v1/chat/completions"
API_KEY = "sk-" + os.urandom(24).hex()  # LiteLLM refuses to start without a strong master key


class Proc:
    """A child process in its own session, stopped by its own id."""

    def __init__(self, name: str, argv: list[str], log: Path,
                 env: dict[str, str] | None = None) -> None:
        self.name, self.argv, self.log = name, argv, log
        self.fh = open(log, "ab")  # noqa: SIM115 (kept open for the child's lifetime)
        self.p = subprocess.Popen(argv, stdout=self.fh, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, start_new_session=True,
                                  env={**os.environ, **(env or {})})

    @property
    def pid(self) -> int:
        return self.p.pid

    def alive(self) -> bool:
        return self.p.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.p.pid, sig)

    def stop(self) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.p.pid, signal.SIGCONT)
                os.killpg(self.p.pid, signal.SIGINT)
            try:
                self.p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.p.pid, signal.SIGKILL)
                self.p.wait(timeout=5)
        self.fh.close()

    def tail(self, n: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def http_get(port: int, path: str, timeout: float = 2.0) -> bytes:
    with urllib.request.urlopen(f"http://{HOST}:{port}{path}", timeout=timeout) as r:
        return bytes(r.read())


def raw_stream(port: int, keep_events: int | None, timeout: float) -> tuple[int, bool]:
    """POST one streaming chat request; read `keep_events` events then hang up (None: all).
    Returns (data events seen, [DONE] seen)."""
    body = json.dumps({"model": MODEL, "stream": True, "max_tokens": 64,
                       "messages": [{"role": "user", "content": "hello"}]}).encode()
    req = (b"POST %s HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"
           b"Authorization: Bearer %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
           % (CHAT_PATH.encode(), HOST.encode(), port, API_KEY.encode(), len(body), body))
    got = b""
    with socket.create_connection((HOST, port), timeout=timeout) as s:
        s.sendall(req)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            data = s.recv(65536)
            if not data:
                break
            got += data
            events = got.count(b"data:") - got.count(b"[DONE]")
            if keep_events is not None and events >= keep_events:
                return events, False
            if b"[DONE]" in got and got.endswith(b"\r\n\r\n"):
                break
    return got.count(b"data:") - got.count(b"[DONE]"), b"[DONE]" in got


def wait_ready(port: int, proc: Proc, timeout: float) -> str | None:
    """None when one full stream goes through, else the last error."""
    deadline = time.monotonic() + timeout
    err = "not tried"
    while time.monotonic() < deadline:
        if not proc.alive():
            return f"exited with {proc.p.returncode}: {proc.tail()}"
        try:
            events, done = raw_stream(port, None, 10.0)
            if events >= 1 and done:
                return None
            err = f"stream ended after {events} events, [DONE]={done}"
        except OSError as e:
            err = f"{type(e).__name__}: {e}"
        time.sleep(0.5)
    return f"not ready after {timeout:.0f} s: {err}"


def abort_check(port: int, engine_port: int, streams: int = 4) -> dict[str, Any]:
    """Drop `streams` streams after 3 events each; how many does the engine see aborted?"""
    before = json.loads(http_get(engine_port, "/stats"))
    t = time.monotonic()
    for _ in range(streams):
        with contextlib.suppress(OSError):
            raw_stream(port, 3, 5.0)
    seen, waited = 0, 0.0
    while time.monotonic() - t < 2.0 + 5.0 * streams:
        seen = json.loads(http_get(engine_port, "/stats"))["aborted"] - before["aborted"]
        waited = time.monotonic() - t
        if seen >= streams:
            break
        time.sleep(0.05)
    return {"dropped": streams, "aborted_at_engine": seen, "within_s": round(waited, 2)}
