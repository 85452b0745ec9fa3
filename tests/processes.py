"""`chatfleet` commands as real processes in tests: start one, stop it cleanly, find its
children and whether they are alive; and a server that is no engine at all, for the commands
that must refuse one."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

CHATFLEET = Path(sys.executable).with_name("chatfleet")


def spawn(*args: str, log: Path | None = None) -> subprocess.Popen[bytes]:
    """`chatfleet ARGS...` with stdout piped (servers print their URLs there) and stderr piped,
    or written to `log`."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    stderr = subprocess.PIPE if log is None else open(log, "wb")  # noqa: SIM115
    return subprocess.Popen([str(CHATFLEET), *args], stdout=subprocess.PIPE, stderr=stderr,
                            env=env)


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (from /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def alive(pid: int) -> bool:
    """Whether `pid` is a process that has not exited (a zombie counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def stop(proc: subprocess.Popen[bytes], timeout_s: float = 15.0) -> int:
    """SIGINT (after SIGCONT, in case it was stopped), then SIGKILL if it will not go; its
    exit status."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGCONT)
            proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    return proc.returncode


class _NotFound(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_error(404)

    do_POST = do_GET

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def not_an_engine() -> Iterator[str]:
    """The URL of a local HTTP server that answers 404 to everything (a port or path that is
    not an engine's), stopped on exit."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _NotFound)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(10)
