"""`chatfleet simserver`: clean errors for bad input; a real process that serves and stops."""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import time
from pathlib import Path

import pytest
import requests
from typer.testing import CliRunner

from chatfleet.cli import app
from tests.processes import CHATFLEET, stop

from .conftest import HTTP_TIMEOUT, post
from .test_trace import check_trace_rows, read_trace

pytestmark = pytest.mark.timeout(60)

@pytest.mark.parametrize(("args", "message"), [
    (["--replicas", "0"], "--replicas"),
    (["--replicas", "-3"], "--replicas"),
    (["--time-scale", "0"], "--time-scale"),
    (["--time-scale", "-1"], "--time-scale"),
    (["--gpu", "t4"], "unknown GPU"),
    (["--weights", "int3"], "int3"),
    (["--model", "/no/such/config.json"], "config.json"),
])
def test_bad_input_exits_2_with_a_message(args: list[str], message: str) -> None:
    res = CliRunner().invoke(app, ["simserver", *args])
    assert res.exit_code == 2, res.output
    assert message in res.output
    assert "Traceback" not in res.output


def test_bad_option_type_exits_2() -> None:
    res = CliRunner().invoke(app, ["simserver", "--replicas", "two"])
    assert res.exit_code == 2


def read_urls(proc: subprocess.Popen[bytes], n: int, timeout: float) -> list[str]:
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    buf = b""
    end = time.monotonic() + timeout
    while buf.count(b"\n") < n and time.monotonic() < end:
        if sel.select(timeout=0.2):
            part = os.read(proc.stdout.fileno(), 4096)
            if not part:
                break
            buf += part
    sel.close()
    return [line.strip() for line in buf.decode().splitlines() if line.strip()]


def test_process_serves_two_replicas_and_stops_on_sigint(tmp_path: Path) -> None:
    assert CHATFLEET.exists()
    trace = tmp_path / "cli-trace.jsonl"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    proc = subprocess.Popen(
        [str(CHATFLEET), "simserver", "--port", "0", "--replicas", "2", "--time-scale", "10",
         "--trace", str(trace)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        urls = read_urls(proc, 2, 30)
        assert len(urls) == 2, (urls, proc.poll())
        assert len(set(urls)) == 2
        for u in urls:
            assert u.startswith("http://127.0.0.1:"), u
            assert requests.get(u + "/health", timeout=HTTP_TIMEOUT).status_code == 200
            info = requests.get(u + "/get_server_info", timeout=HTTP_TIMEOUT).json()
            assert info["time_scale"] == 10
            # the defaults: an L4 in BF16 (measured: 24,094 tokens)
            assert info["max_total_num_tokens"] == pytest.approx(24094, rel=0.005)
        r = post(urls[1], "/v1/completions", {"prompt": "hi", "max_tokens": 6,
                                              "ignore_eos": True, "rid": "cli-1"})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 6
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(20)
        assert rc == 0, proc.stderr.read().decode() if proc.stderr else rc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    stderr = proc.stderr.read().decode() if proc.stderr else ""
    assert "Traceback" not in stderr, stderr
    rows = read_trace(trace)
    check_trace_rows(rows, {"cli-1": 6})
    assert {r["replica"] for r in rows if r["type"] == "token"} == {"replica-1"}
    json.dumps(rows)  # plain JSON rows


def test_process_with_a_port_already_in_use_exits_cleanly() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        res = subprocess.run(
            [str(CHATFLEET), "simserver", "--port", str(port), "--time-scale", "10"],
            capture_output=True, timeout=30)
    assert res.returncode == 2, res
    assert b"Traceback" not in res.stderr
    assert b"cannot serve" in res.stderr


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_non_finite_time_scale_exits_2(value: str) -> None:
    proc = subprocess.Popen([str(CHATFLEET), "simserver", "--time-scale", value],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        served = read_urls(proc, 1, 15)  # a URL on stdout means it started serving
        rc = proc.poll()
        if rc is None and not served:
            rc = proc.wait(10)
    finally:
        stop(proc, 10)
    assert not served, f"--time-scale {value} was accepted: {served}"
    assert rc == 2


@pytest.mark.parametrize(("args", "message"), [
    (["--eviction", "xx"], "unknown eviction policy 'xx'"),
    (["--max-running-requests", "0"], "the engine cap must be at least 1"),
    (["--engine-model", "vllm", "--max-running-requests", "0"],
     "the engine cap must be at least 1"),
    (["--host-pool-tokens", "-1"], "host pool tokens must not be negative"),
    (["--pool-tokens", "0"], "the KV pool must hold at least one token"),
    (["--pool-tokens", "-1"], "the KV pool must hold at least one token"),
    (["--served-model-name", " "], "--served-model-name is empty"),
    (["--profile", "."], "is a folder: give the path of a file"),
])
def test_a_bad_engine_spec_fails_at_once_in_one_line(args: list[str], message: str) -> None:
    """The engine model is built once before the server starts: a flag it refuses is one
    line and exit 2 at once, never a traceback from inside the server's start, nor a server
    that serves (--pool-tokens 0 once served with the planned pool, until killed)."""
    proc = subprocess.Popen([str(CHATFLEET), "simserver", "--port", "0", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        served = read_urls(proc, 1, 15)
        rc = proc.wait(15) if not served else None
    finally:
        stop(proc, 10)
    stderr = proc.stderr.read().decode() if proc.stderr else ""
    assert not served, f"{args} was accepted: {served}"
    assert rc == 2, stderr
    assert "Traceback" not in stderr, stderr[-600:]
    text = " ".join(stderr.split())
    assert text.count("error:") == 1 and message in text, stderr


@pytest.mark.parametrize("args", [["--port", "70000"], ["--port", "-1"],
                                  ["--port", "65535", "--replicas", "2"]])
def test_port_out_of_range_exits_2(args: list[str]) -> None:
    res = subprocess.run([str(CHATFLEET), "simserver", *args], capture_output=True, timeout=30)
    assert b"Traceback" not in res.stderr, res.stderr.decode()[-400:]
    assert res.returncode == 2
