"""The report in a real browser: headless Chromium renders it, offline, with plots, tables and
the live proof; the test looks at the screenshot (not blank, the proof card and the plots'
colours drawn) and at the rendered DOM."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from chatfleet.report.build import build_report
from chatfleet.report.plots import COLORS
from tests.report.synth import write_live_proof

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


def _rgb(hex_color: str) -> tuple[int, int, int]:
    return (int(hex_color[1:3], 16), int(hex_color[3:5], 16), int(hex_color[5:7], 16))


def pixels_of(img: np.ndarray, hex_color: str, tolerance: int = 6) -> int:
    """How many pixels of the screenshot are (within `tolerance` per channel) this colour."""
    target = np.array(_rgb(hex_color), dtype=np.int16)
    return int((np.abs(img.astype(np.int16) - target) <= tolerance).all(axis=2).sum())


PROOF_BORDER = "#2e7d32"  # the live-proof card's left border (html.CSS)


def test_chromium_renders_the_report(sweep_dir: Callable[..., Path], tmp_path: Path) -> None:
    bf16 = sweep_dir("l4-bf16", "bf16", 1.0)
    fp8 = sweep_dir("l4-fp8", "fp8", 2.0)
    proof = tmp_path / "live" / "proof.json"
    write_live_proof(proof)
    written = build_report([bf16, fp8], out_dir=tmp_path / "report", live_proof=proof)
    url = written.html.resolve().as_uri()
    profile = tmp_path / "profile"

    shot = tmp_path / "shot.png"
    res = chromium(profile, f"--screenshot={shot}", "--window-size=1400,5000", url)
    assert shot.is_file(), res.stderr[-2000:]
    with Image.open(shot) as png:
        assert png.size == (1400, 5000)
        img = np.asarray(png.convert("RGB"))
    # not blank: the page varies, in every band of 1,000 pixels down to the plots
    gray = img.mean(axis=2)
    assert gray.std() > 20
    for top in range(0, 4000, 1000):
        assert gray[top:top + 1000].std() > 5, f"a blank band at {top} px"
    # the live-proof card is drawn (its green border, down the card's height), and so are
    # the plots' sweep colours (lines and markers of both sweeps)
    assert pixels_of(img, PROOF_BORDER) > 5 * 300
    assert pixels_of(img, COLORS[0]) > 2000 and pixels_of(img, COLORS[1]) > 2000

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
    m = re.search(r'<section id="live-proof" class="proof">(.*?)</section>', dom, flags=re.S)
    assert m, "no live-proof section in the rendered page"
    assert "The cap held with 2× the fleet" in m.group(1)
    assert "<td>replica-1</td><td>24</td><td>23</td>" in m.group(1)
