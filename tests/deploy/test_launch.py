"""`chatfleet launch`: Redis, simserver replicas and gateways as real processes; requests
through every gateway; SIGTERM stops them all in reverse order; a dying child stops the rest;
bad options are one clear line."""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import requests
from typer.testing import CliRunner

from chatfleet.cli import app
from chatfleet.deploy.launcher import LaunchSpec, plan_children
from tests.gateway.redis_server import REDIS
from tests.processes import CHATFLEET
from tests.waiting import wait_for

pytestmark = pytest.mark.timeout(120)

FAST = ["--weights", "fp8", "--kv-cache", "fp8", "--time-scale", "20", "--port", "0",
        "--replica-port", "0"]


def launch(tmp: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([str(CHATFLEET), "launch", *args, "--log-dir", str(tmp / "logs")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def read_json(proc: subprocess.Popen[str], timeout: float = 90.0) -> dict[str, Any]:
    """The endpoints document `launch --json` prints once everything is ready."""
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    buf = ""
    end = time.monotonic() + timeout
    try:
        while time.monotonic() < end:
            if sel.select(timeout=0.2):
                part = os.read(proc.stdout.fileno(), 65536)  # not readline: no hidden buffer
                if not part:
                    break
                buf += part.decode()
                try:
                    doc: dict[str, Any] = json.loads(buf)
                    return doc
                except json.JSONDecodeError:
                    continue
    finally:
        sel.close()
    proc.kill()
    raise AssertionError(f"no endpoints document; stdout {buf!r}, stderr "
                         f"{proc.communicate(timeout=10)[1][-3000:]}")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for our purpose (its parent reaps it)
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(") ")[-1].startswith("Z"))


def chat(url: str, session: str) -> dict[str, Any]:
    r = requests.post(url + "/v1/chat/completions", timeout=30,
                      headers={"X-Session-ID": session},
                      json={"model": "qwen3-8b", "max_tokens": 8,
                            "messages": [{"role": "user", "content": "hello"}]})
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def stopped_names(stderr: str) -> list[str]:
    return [line.split()[1] for line in stderr.splitlines() if line.startswith("stopped ")]


@pytest.mark.timeout(180)
def test_two_gateways_share_redis_in_front_of_two_replicas_and_sigterm_stops_all(
        tmp_path: Path) -> None:
    if REDIS is None:
        pytest.skip("redis-server is not installed (make system-deps installs it as root)")
    proc = launch(tmp_path, "--gateways", "2", "--replicas", "2", "--cap", "4", "--json", *FAST)
    try:
        doc = read_json(proc)
        assert doc["state"].startswith("redis://127.0.0.1:") and doc["redis"]["managed"]
        assert len(doc["gateways"]) == 2 and len(doc["replicas"]) == 2
        for i, gw in enumerate(doc["gateways"]):
            body = chat(gw["url"], f"user-{i}")
            assert body["usage"]["completion_tokens"] == 8
            ready = requests.get(gw["url"] + "/ready", timeout=5).json()
            assert sorted(ready["serving"]) == ["replica-0", "replica-1"]
        # both gateways count against one Redis: the fleet-wide cap is what each reports
        page = requests.get(doc["gateways"][1]["url"] + "/metrics", timeout=5).text
        assert 'chatfleet_gateway_cap{replica="replica-0"} 4.0' in page
        assert "chatfleet_gateway_state_up 1.0" in page
        pids = {r["pid"] for r in [*doc["gateways"], *doc["replicas"], doc["redis"]]}
        assert len(pids) == 4  # two gateways, one simserver hosting both replicas, Redis
        assert all(alive(p) for p in pids)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0, err
    assert stopped_names(err) == ["gateway-1", "gateway-0", "simserver", "redis"], err
    assert wait_for(lambda: not any(alive(p) for p in pids), 5), "children left behind"
    for log in (tmp_path / "logs").glob("*.log"):
        assert "Traceback" not in log.read_text(), log


def test_a_child_that_dies_stops_the_rest_with_a_nonzero_exit(tmp_path: Path) -> None:
    proc = launch(tmp_path, "--gateways", "1", "--replicas", "1", "--redis", "none", "--json",
                  *FAST)
    try:
        doc = read_json(proc)
        assert doc["state"] == "memory" and doc["redis"] is None
        sim = doc["replicas"][0]["pid"]
        gw = doc["gateways"][0]["pid"]
        os.kill(sim, signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 1, err
    assert "simserver (replica, pid" in err and "exited with status -9" in err, err
    assert stopped_names(err) == ["gateway-0", "simserver"], err
    assert not alive(gw)


def test_a_replica_that_fails_to_start_is_named_with_its_log(tmp_path: Path) -> None:
    cmd = "sh -c 'echo engine-out-of-memory on {port}; exit 3'"
    proc = launch(tmp_path, "--engine", "command", "--engine-cmd", cmd, "--redis", "none",
                  "--port", "0", "--replica-port", "0")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    assert "replica-0 (replica, pid" in err and "exited with status 3" in err, err
    assert "engine-out-of-memory" in err  # the tail of its log
    assert "Traceback" not in err
    assert not (tmp_path / "logs" / "gateway-0.log").exists()  # no gateway was started


def test_an_engine_that_never_gets_ready_times_out_with_a_clear_error(tmp_path: Path) -> None:
    cmd = f"{sys.executable} -c 'import time; print(\"loading {{port}}\", flush=True); " \
          "time.sleep(60)'"
    proc = launch(tmp_path, "--engine", "command", "--engine-cmd", cmd, "--redis", "none",
                  "--port", "0", "--replica-port", "0", "--ready-timeout", "2")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    assert "replica-0" in err and "not ready after 2 s" in err and "loading" in err, err


@pytest.mark.parametrize(("args", "message"), [
    (["--gateways", "0"], "--gateways must be at least 1"),
    (["--replicas", "0"], "--replicas must be at least 1"),
    (["--engine", "vllm"], "--engine 'vllm'"),
    (["--engine", "command"], "--engine-cmd"),
    (["--engine", "command", "--engine-cmd", "python -m sglang.launch_server"], "{port}"),
    (["--engine", "command", "--engine-cmd", "no-such-engine-xyz --port {port}"],
     "no-such-engine-xyz"),
    (["--engine", "command", "--engine-cmd", "x --port {port} {gpu}"], "placeholders"),
    (["--engine-cmd", "x {port}"], "--engine-cmd needs --engine command"),
    (["--gateways", "2", "--redis", "none"], "need a shared state"),
    (["--redis", "localhost:6379"], "redis://HOST:PORT/DB"),
    (["--cap", "4", "--cap-from", "sweep.json"], "not both"),
    (["--cap", "0"], "--cap must be at least 1"),
    (["--cap-from", "/no/such/sweep.json"], "/no/such/sweep.json"),
    (["--port", "8100", "--replica-port", "8100"], "overlap"),
    (["--port", "70000"], "--port 70000"),
    (["--time-scale", "0"], "--time-scale"),
    (["--weights", "int3"], "int3"),
    (["--gpu", "t4"], "unknown GPU"),
    (["--config", "/no/such/gateway.yaml"], "--config"),
])
def test_bad_options_exit_2_with_one_clear_line(args: list[str], message: str) -> None:
    res = CliRunner().invoke(app, ["launch", *args])
    assert res.exit_code == 2, res.output
    assert message in " ".join(res.output.split()), res.output
    assert "Traceback" not in res.output


@pytest.mark.parametrize(("args", "message"), [
    (["--cap-from", "{tmp}/binary.dat"], "not UTF-8 text"),
    (["--config", "{tmp}/binary.dat"], "not UTF-8 text"),
    (["--log-dir", "{tmp}/binary.dat"], "is a file, not a folder"),
    (["--host", "no-such-host.invalid"], "--host 'no-such-host.invalid' is not an address"),
])
def test_unusable_files_and_hosts_exit_2_with_one_line_before_anything_starts(
        tmp_path: Path, args: list[str], message: str) -> None:
    """Each was a traceback (UnicodeDecodeError, FileExistsError, socket.gaierror)."""
    (tmp_path / "binary.dat").write_bytes(b"\x7fELF\x02\x01\x01\x00\xd0\x9f\xff")
    res = CliRunner().invoke(app, ["launch", "--redis", "none", *FAST,
                                   *[a.replace("{tmp}", str(tmp_path)) for a in args]])
    assert res.exit_code == 2, (res.output, res.exception)
    text = " ".join(res.output.split())
    assert text.count("error:") == 1 and message in text, text
    assert "Traceback" not in res.output and "stopped" not in text


def test_many_gateways_without_redis_server_is_a_clear_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no redis-server on it
    res = CliRunner().invoke(app, ["launch", "--gateways", "2"])
    assert res.exit_code == 2, res.output
    assert "redis-server is not installed" in " ".join(res.output.split())


def test_the_children_and_their_command_lines(tmp_path: Path) -> None:
    spec = LaunchSpec(gateways=2, replicas=3, cap=6, queue_depth=10, weights="fp8",
                      kv_cache="fp8", time_scale=5.0, host="0.0.0.0")
    kids = plan_children(spec, log_dir=tmp_path, gateway_ports=[8080, 8081],
                         replica_ports=[8100, 8101, 8102], state="redis://127.0.0.1:7/0",
                         redis=None)
    assert [k.name for k in kids] == ["simserver", "gateway-0", "gateway-1"]
    sim, gw0, _ = kids
    assert sim.urls == ["http://127.0.0.1:8100", "http://127.0.0.1:8101",
                        "http://127.0.0.1:8102"]
    argv = " ".join(sim.argv)
    assert "simserver" in argv and "--replicas 3" in argv and "--port 8100" in argv
    assert "--host 0.0.0.0" in argv and "--time-scale 5" in argv
    g = " ".join(gw0.argv)
    for part in ("--replica replica-0=http://127.0.0.1:8100",
                 "--replica replica-2=http://127.0.0.1:8102", "--cap 6", "--queue-depth 10",
                 "--state redis://127.0.0.1:7/0", "--host 0.0.0.0", "--port 8080"):
        assert part in g
    assert gw0.probe == "/ready"
    spec = LaunchSpec(replicas=2, engine="command",
                      engine_cmd="env CUDA_VISIBLE_DEVICES={index} sleep {port}")
    kids = plan_children(spec, log_dir=tmp_path, gateway_ports=[1], replica_ports=[5, 6],
                         state="memory", redis=None)
    assert [k.argv for k in kids[:2]] == [["env", "CUDA_VISIBLE_DEVICES=0", "sleep", "5"],
                                          ["env", "CUDA_VISIBLE_DEVICES=1", "sleep", "6"]]
