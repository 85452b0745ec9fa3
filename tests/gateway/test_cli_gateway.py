"""`chatfleet gateway`: clean errors; a real process in front of a real simserver process,
hot reload on SIGHUP, and a clean stop on SIGINT."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest
import requests
import yaml
from typer.testing import CliRunner

from chatfleet.cli import app
from tests.gateway.conftest import Fake
from tests.processes import spawn, stop
from tests.simserver.test_cli_simserver import read_urls
from tests.waiting import wait_for

pytestmark = pytest.mark.timeout(90)


@pytest.mark.parametrize(("args", "message"), [
    ([], "no replicas"),
    (["--replica", "https://x:1"], "not an http://host:port"),
    (["--replica", "http://127.0.0.1:1", "--cap", "-2"], "--cap"),
    (["--replica", "http://127.0.0.1:1", "--port", "70000"], "--port"),
    (["--replica", "http://127.0.0.1:1", "--config", "/no/such.yaml"], "cannot read"),
    (["--replica", "http://127.0.0.1:1", "--cap-from", "/no/such.json"], "sweep"),
])
def test_bad_input_exits_2_with_a_message(args: list[str], message: str) -> None:
    res = CliRunner().invoke(app, ["gateway", *args])
    assert res.exit_code == 2, res.output
    assert message in res.output
    assert "Traceback" not in res.output


def test_hash_key_reads_stdin() -> None:
    res = CliRunner().invoke(app, ["gateway", "--hash-key"], input="password\n")
    assert res.exit_code == 0
    assert res.output.strip() == ("sha256:5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a1"
                                  "1ef721d1542d8")


def test_the_gateway_process_serves_reloads_and_stops(tmp_path: Path) -> None:
    sim = spawn("simserver", "--port", "0", "--replicas", "2", "--time-scale", "10")
    gw = None
    try:
        urls = read_urls(sim, 2, 30)
        assert len(urls) == 2
        cfg = tmp_path / "gateway.yaml"
        cfg.write_text(yaml.safe_dump({"replicas": [{"name": "a", "url": urls[0]},
                                                    {"name": "b", "url": urls[1]}],
                                       "cap": 4, "debug_headers": True}))
        gw = spawn("gateway", "--config", str(cfg), "--port", "0")
        [url] = read_urls(gw, 1, 30)
        assert url.startswith("http://127.0.0.1:")
        r = requests.post(url + "/v1/chat/completions", timeout=30, json={
            "model": "qwen3-8b", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 5, "stream": True})
        assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n")
        assert r.headers["x-chatfleet-replica"] in ("a", "b")
        # a new cap in the file, applied on SIGHUP (the file watch would too)
        cfg.write_text(yaml.safe_dump({"replicas": [{"name": "a", "url": urls[0]}],
                                       "cap": 2}))
        gw.send_signal(signal.SIGHUP)

        def reloaded() -> bool:
            m = requests.get(url + "/metrics", timeout=5).text
            return 'chatfleet_gateway_cap{replica="a"} 2.0' in m and 'replica="b"' not in m

        assert wait_for(reloaded, 10)
        assert stop(gw, 20) == 0
        stderr = gw.stderr.read().decode() if gw.stderr else ""
        assert "Traceback" not in stderr, stderr
    finally:
        if gw is not None:
            stop(gw)
        assert stop(sim, 20) == 0


def test_the_log_has_timestamps_and_a_line_per_ejection_and_readmission(
        fakes2: list[Fake], tmp_path: Path) -> None:
    cfg = tmp_path / "gateway.yaml"
    cfg.write_text(yaml.safe_dump({
        "replicas": [{"name": "a", "url": fakes2[0].url}, {"name": "b", "url": fakes2[1].url}],
        "health": {"probe_interval_s": 0.2, "eject_after_failures": 2,
                   "readmit_after_successes": 2}}))
    log = tmp_path / "gateway.log"
    gw = spawn("gateway", "--config", str(cfg), "--port", "0", log=log)
    try:
        [url] = read_urls(gw, 1, 30)
        fakes2[1].mode = "fail"  # /health answers 503
        assert wait_for(lambda: "ejected" in log.read_text(), 10)
        fakes2[1].mode = "ok"
        assert wait_for(lambda: "readmitted" in log.read_text(), 10)
        assert requests.get(url + "/health", timeout=5).status_code == 200
    finally:
        stop(gw)
    lines = [line for line in log.read_text().splitlines() if "replica b" in line]
    ejected = [line for line in lines if "ejected" in line]
    readmitted = [line for line in lines if "readmitted" in line]
    assert len(ejected) == 1 and len(readmitted) == 1, lines
    assert "2 consecutive failures" in ejected[0] and "HTTP 503" in ejected[0], ejected
    assert "2 successful probes" in readmitted[0], readmitted
    stamp = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d{4} (INFO|WARNING|ERROR) ")
    logged = [line for line in log.read_text().splitlines() if "chatfleet.gateway" in line]
    assert logged and all(stamp.match(line) for line in logged), logged
