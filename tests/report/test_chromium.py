"""The report in a real browser: headless Chromium renders it, offline, with plots and tables."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from PIL import Image

from chatfleet.report import build_report

CHROMIUM = shutil.which("chromium")
TIMEOUT_S = 120

pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="headless Chromium is not installed (Debian: apt-get install -y chromium)",
)


def chromium(profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
           "--no-first-run", "--disable-background-networking", "--disable-component-update",
           "--disable-sync", f"--user-data-dir={profile}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)


def test_chromium_renders_the_report(sweep_dir: Callable[..., Path], tmp_path: Path) -> None:
    bf16 = sweep_dir("l4-bf16", "bf16", 1.0)
    fp8 = sweep_dir("l4-fp8", "fp8", 2.0)
    written = build_report([bf16, fp8], out_dir=tmp_path / "report")
    url = written.html.resolve().as_uri()
    profile = tmp_path / "profile"

    shot = tmp_path / "shot.png"
    res = chromium(profile, f"--screenshot={shot}", "--window-size=1400,3000", url)
    assert shot.is_file(), res.stderr[-2000:]
    assert shot.stat().st_size > 20_000  # a blank page is a few KB
    with Image.open(shot) as img:
        assert img.size == (1400, 3000)
        colors = img.convert("RGB").getcolors(maxcolors=1 << 20)
        assert colors is not None and len(colors) > 200  # text, tables and plots, not blank

    res = chromium(profile, "--dump-dom", url)
    dom = res.stdout
    assert res.returncode == 0, res.stderr[-2000:]
    figures = re.findall(r'<figure class="plot" id="plot-([a-z]+)">', dom)
    assert figures == ["goodput", "latency", "throughput", "telemetry", "cache", "engine"]
    assert len(re.findall(r"<svg\b", dom)) == len(figures)
    assert dom.count('<table class="points">') == 2
    assert '<table class="summary">' in dom
    assert "L4 BF16: closed-loop knee: meets 4 users, fails 8 users" in dom
    assert "L4 FP8: closed-loop knee: meets 8 users, fails 32 users" in dom
