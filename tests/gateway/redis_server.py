"""A throwaway redis-server on 127.0.0.1 for tests (Debian's redis-server; `make test`
installs it when missing and running as root, otherwise the tests that need it skip)."""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REDIS = shutil.which("redis-server")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_redis(workdir: Path, port: int,
                args: tuple[str, ...] = ()) -> subprocess.Popen[bytes]:
    """A fresh redis-server on 127.0.0.1:`port` with no persistence (and `args`, such as
    ("--maxmemory", "4mb")), once it accepts connections."""
    if REDIS is None:
        pytest.skip("redis-server is not installed (make test installs it as root)")
    proc = subprocess.Popen([REDIS, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(workdir), *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    end = time.monotonic() + 10
    while time.monotonic() < end:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return proc
        time.sleep(0.05)
    stop_redis(proc)
    raise RuntimeError("redis-server did not start")


def stop_redis(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGCONT)  # in case it was paused
        proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


@contextlib.contextmanager
def redis_server(workdir: Path, port: int | None = None, *,
                 args: tuple[str, ...] = ()) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """(url, process) of a fresh redis-server with no persistence (and `args`); stopped on
    exit."""
    port = port or free_port()
    proc = start_redis(workdir, port, args)
    try:
        yield f"redis://127.0.0.1:{port}/0", proc
    finally:
        stop_redis(proc)
