"""Every text answer that prints figures for a card no measurement is behind (every card but
the L4) says "uncalibrated", as the JSON does; the L4's answers do not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from chatfleet.cli import app
from chatfleet.core.specs import GPUS
from tests.processes import spawn, stop

runner = CliRunner()
NOTE = "the twin and the pool sizing have no {gpu} measurement"
# a twin sweep says where its constants come from instead (calibration.provenance)
BORROWED = "borrowed: the L4 fit's efficiencies and fixed costs"


def run(*args: str) -> str:
    res = runner.invoke(app, list(args))
    assert res.exit_code == 0, res.output
    return " ".join(res.output.split())  # the console's line wrapping undone


@pytest.fixture(scope="module", params=["h200", "l4"])
def swept(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
          ) -> tuple[str, Path, str]:
    """(gpu, a short twin sweep's JSON file, the sweep's text answer)."""
    gpu = str(request.param)
    file = tmp_path_factory.mktemp(gpu) / "sweep.json"
    text = run("twin", "sweep", "--gpu", gpu, "--weights", "fp8", "--kv-cache", "fp8",
               "--concurrency", "1,4", "--duration", "20", "--warmup", "2",
               "--json", str(file))
    return gpu, file, text


def test_the_twin_sweep_text_says_so(swept: tuple[str, Path, str]) -> None:
    gpu, file, text = swept
    calibrated = gpu == "l4"
    assert json.loads(file.read_text())["target"]["calibration"] == (
        "calibrated" if calibrated else "uncalibrated")
    assert ("uncalibrated" in text) is not calibrated
    assert (BORROWED in text) is not calibrated
    assert ("fitted: SGLang v0.5 on an NVIDIA L4" in text) is calibrated


def test_the_plan_answer_says_so(swept: tuple[str, Path, str]) -> None:
    gpu, file, _ = swept
    calibrated = gpu == "l4"
    args = ("plan", "--gpu", gpu, "--users", "200", "--sweep", str(file),
            "--doubling-hours", "0.02")
    text = run(*args)
    assert "recommended: fp8" in text
    assert (f"qwen3-8b on {gpu} (uncalibrated)" in text) is not calibrated
    assert (NOTE.format(gpu=gpu) in text) is not calibrated
    assert json.loads(run(*args, "--json"))["calibrated"] is calibrated


@pytest.mark.parametrize("gpu", sorted(GPUS))
def test_the_pool_sizing_text_says_so_for_every_card_but_the_l4(gpu: str) -> None:
    text = run("plan", "--gpu", gpu)
    assert ("uncalibrated" in text) is (gpu != "l4")
    assert (NOTE.format(gpu=gpu) in text) is (gpu != "l4")


@pytest.mark.parametrize("gpu", ["h100-sxm", "l4"])
def test_the_cache_analysis_says_so(gpu: str) -> None:
    args = ("cache", "--gpu", gpu, "--sessions", "4", "--pool", "8192", "--policy", "lru")
    text = run(*args)
    assert ("uncalibrated" in text) is (gpu != "l4")
    assert json.loads(run(*args, "--json"))["target"]["calibrated"] is (gpu == "l4")


@pytest.fixture(scope="module")
def h200_profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A calibration profile for the H200, fitted on a short twin sweep of it."""
    base = tmp_path_factory.mktemp("profile")
    run("twin", "sweep", "--gpu", "h200", "--weights", "fp8", "--kv-cache", "fp8",
        "--concurrency", "1,4", "--duration", "20", "--warmup", "2", "--json",
        str(base / "sweep.json"))
    run("twin", "calibrate", "--from", str(base / "sweep.json"), "--out",
        str(base / "profile.json"))
    return base / "profile.json"


def test_a_fitted_profile_makes_the_twin_sweep_calibrated(h200_profile: Path) -> None:
    text = run("twin", "sweep", "--gpu", "h200", "--weights", "fp8", "--kv-cache", "fp8",
               "--concurrency", "1", "--duration", "10", "--warmup", "1",
               "--profile", str(h200_profile))
    assert "uncalibrated" not in text


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("gpu", "profiled"), [("h200", False), ("h200", True), ("l4", False)])
def test_the_simserver_says_so(gpu: str, profiled: bool, h200_profile: Path) -> None:
    args = ["simserver", "--gpu", gpu, "--weights", "fp8", "--kv-cache", "fp8", "--port", "0"]
    proc = spawn(*args, *(["--profile", str(h200_profile)] if profiled else []))
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith(b"http://127.0.0.1:")  # it is up
    finally:
        stop(proc)
    assert proc.stderr is not None
    text = " ".join(proc.stderr.read().decode().split())
    calibrated = gpu == "l4" or profiled
    assert f"simserver: qwen3-8b on {gpu}" in text
    assert ("(uncalibrated)" in text) is not calibrated
    assert (NOTE.format(gpu=gpu) in text) is not calibrated
