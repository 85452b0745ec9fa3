"""The harness: a sweep killed (SIGKILL) in the middle of a run resumes without losing a
finished run."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
import requests

from tests.processes import CHATFLEET, spawn, stop
from tests.reliability.conftest import metric, record
from tests.simserver.test_cli_simserver import read_urls
from tests.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def sweep(url: str, out: Path, *extra: str) -> list[str]:
    return [str(CHATFLEET), "sweep", "--target", url, "--engine", "simserver", "--model",
            "qwen3-8b", "--concurrency", "1,2,4", "--duration", "20", "--warmup", "2",
            "--lengths", "fixed", "--input-len", "64", "--output-len", "32",
            "--system-prompt-tokens", "128", "--out", str(out), *extra]


def runs(out: Path) -> list[dict[str, object]]:
    path = out / "runs.jsonl"
    if not path.exists():
        return []
    rows = []
    for line in path.read_bytes().splitlines():
        with contextlib.suppress(json.JSONDecodeError):  # a line cut by the kill
            rows.append(json.loads(line))
    return rows


def running(url: str) -> float:
    """Requests the simserver is decoding now."""
    return metric(requests.get(url + "/metrics", timeout=5).text, "sglang:num_running_reqs")


def test_a_sweep_killed_mid_run_resumes_without_losing_a_finished_run(tmp_path: Path) -> None:
    sim = spawn("simserver", "--weights", "fp8", "--kv-cache", "fp8", "--port", "0",
                "--time-scale", "10", log=tmp_path / "sim.log")
    try:
        [url] = read_urls(sim, 1, 30)
        out = tmp_path / "sweep"
        env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
        first = subprocess.Popen(sweep(url, out), stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, env=env)
        assert wait_for(lambda: len(runs(out)) >= 1 or first.poll() is not None, 120)
        # into the second run: its requests reach the replica (the first's were all done)
        assert wait_for(lambda: running(url) >= 1 or first.poll() is not None, 60)
        assert first.poll() is None and len(runs(out)) == 1
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        kept = runs(out)
        assert len(kept) == 1, kept
        again = subprocess.run(sweep(url, out, "--resume"), capture_output=True, env=env,
                               timeout=240)
        assert again.returncode == 0, again.stderr.decode()[-2000:]
        final = runs(out)
    finally:
        stop(sim)
    record("harness", "a sweep killed (SIGKILL) in its second run, then run with --resume",
           "the finished run is kept as it was; the rest run; nothing is lost",
           f"{len(kept)} run kept at the kill; {len(final)} runs after --resume; the kept one "
           f"{'unchanged' if final[:1] == kept else 'CHANGED'}",
           requests_sent=0, lost=0 if final[:1] == kept and len(final) == 3 else 1)
    assert [r["load"]["concurrency"] for r in final] == [1, 2, 4]  # type: ignore[index]
    assert final[0] == kept[0]
