"""Figures for people: rates rounded, users and ms whole, in the report's text; raw in the JSON."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from chatfleet.report import human
from chatfleet.report.build import build_report
from tests.report.test_ticks import bisected_sweep


@pytest.mark.parametrize(("x", "text"), [
    (0.296875, "0.3"), (0.3125, "0.31"), (1.375, "1.4"), (0.125, "0.125"), (1.25, "1.25"),
    (12.34, "12"), (4.1333, "4.1"), (0.0123, "0.0123"), (1234.5, "1,234"), (0.0, "0"),
    (None, "–"), (float("nan"), "–"),
])
def test_a_rate_has_two_significant_figures_or_three_when_exact(x: float | None,
                                                                text: str) -> None:
    assert human.rate(x) == text


def test_rates_of_one_bracket_are_told_apart() -> None:
    assert human.rates([1.375, 1.4375]) == {1.375: "1.38", 1.4375: "1.44"}
    assert human.rates([0.296875, 0.3125]) == {0.296875: "0.3", 0.3125: "0.31"}
    assert human.rates([1.375, 1.5]) == {1.375: "1.4", 1.5: "1.5"}


def test_users_and_ms_are_whole_numbers() -> None:
    assert human.users(24.0) == "24"
    assert human.ms(1013.79) == "1,014"
    assert human.share(0.99598) == "0.996"
    assert human.load("closed", 96) == "96" and human.load("open", 0.296875) == "0.3"


def _text(html: str) -> str:
    """The page's text outside the inline SVGs (whose paths are coordinates)."""
    return re.sub(r"<svg\b.*?</svg>", "", html, flags=re.S)


def test_the_report_prints_rates_rounded_and_the_json_keeps_them_raw(tmp_path: Path) -> None:
    src = bisected_sweep(tmp_path, speed=0.58)  # its open-loop knee between 0.296875 and 0.3125
    doc = json.loads(src.read_text())
    assert doc["knee_rate"] == {"meets": 0.296875, "fails": 0.3125}  # raw in the JSON
    written = build_report([src], out_dir=tmp_path / "out")
    html, md = written.html.read_text(), written.markdown.read_text()
    for text in (_text(html), md):
        assert "open-loop knee: meets 0.3 rps, fails 0.31 rps" in text
        assert "0.296875" not in text and "0.28125" not in text and "0.3125" not in text
        assert "0.28 rps" in text  # the points table's load column
    # the legend and the axes of the plots too
    assert "meets 0.3, fails 0.31 rps" in html
    assert not re.search(r">\s*0\.296875\s*<", html)
    # goodput in the points table: two significant figures, not 0.0123456...
    row = re.search(r"<tr><td>0.3 rps</td>.*?</tr>", html)
    assert row
    goodput = next(p["goodput_rps"] for p in doc["points"]
                   if p["load"].get("rate_rps") == 0.296875)
    assert f"<td>{human.rate(goodput)}</td>" in row.group(0)
    assert f"{goodput:.4f}" not in row.group(0)
