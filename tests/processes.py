"""`chatfleet` commands as real processes in tests: start one, stop it cleanly."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

CHATFLEET = Path(sys.executable).with_name("chatfleet")


def spawn(*args: str, log: Path | None = None) -> subprocess.Popen[bytes]:
    """`chatfleet ARGS...` with stdout piped (servers print their URLs there) and stderr piped,
    or written to `log`."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    stderr = subprocess.PIPE if log is None else open(log, "wb")  # noqa: SIM115
    return subprocess.Popen([str(CHATFLEET), *args], stdout=subprocess.PIPE, stderr=stderr,
                            env=env)


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
