"""`chatfleet report`: files, self-containment, plots, knee lines, overlays, bad input."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

from chatfleet.cli.render import sweep_table
from chatfleet.cli.report import report
from chatfleet.core.documents.sweep import ClosedLoad, SweepDoc, SweepPoint
from chatfleet.core.engine.build import EngineSpec
from chatfleet.core.measure.knee import sweep_document
from chatfleet.core.slo import SLO
from chatfleet.core.specs import builtin_model, get_gpu, precision
from chatfleet.core.workload import WorkloadConfig
from chatfleet.report.build import ReportInputError, build_report, load_sweep, load_sweeps
from chatfleet.twin.sweep import TwinSweep
from tests.report.synth import INVALID_REASON, build_points, target

MakeDir = Callable[..., Path]
PLOTS_WITH_RUN_FILES = ("goodput", "latency", "throughput", "telemetry", "cache", "engine")

app = typer.Typer()


@app.callback()
def _root() -> None:
    """Test root: `report` as a sub-command, as `chatfleet report`."""


app.command("report")(report)
runner = CliRunner()


def invoke(*args: str | Path) -> tuple[int, str]:
    res = runner.invoke(app, ["report", *[str(a) for a in args]])
    return res.exit_code, res.output


def svgs(html: str) -> list[str]:
    return re.findall(r"<svg\b.*?</svg>", html, flags=re.S)


def plot_svg(html: str, key: str) -> str:
    m = re.search(rf'<figure class="plot" id="plot-{key}">(.*?)</figure>', html, flags=re.S)
    assert m, f"no {key} plot"
    return m.group(1)


def assert_self_contained(html: str) -> None:
    # nothing fetched: no external src/href, no script file, stylesheet link, import or font
    assert not re.search(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", html, flags=re.I)
    assert not re.search(r"<script\b[^>]*\bsrc\s*=", html, flags=re.I)
    assert not re.search(r"<link\b", html, flags=re.I)
    assert not re.search(r"<img\b", html, flags=re.I)
    assert "@import" not in html
    assert not re.search(r"url\(\s*['\"]?\s*(?:https?:)?//", html, flags=re.I)
    assert "@font-face" not in html


# --------------------------------------------------------------------------------------------


def test_one_dir_writes_both_files_next_to_it_and_prints_their_paths(sweep_dir: MakeDir) -> None:
    d = sweep_dir()
    code, out = invoke(d)
    assert code == 0, out
    html_path, md_path = d / "report.html", d / "report.md"
    assert html_path.is_file() and md_path.is_file()
    assert str(html_path) in out and str(md_path) in out
    html = html_path.read_text()
    assert html.startswith("<!DOCTYPE html>")
    assert_self_contained(html)
    # one inline SVG per plot, every plot present (run files give the two timelines)
    figures = re.findall(r'<figure class="plot" id="plot-([a-z]+)">', html)
    assert figures == list(PLOTS_WITH_RUN_FILES)
    assert len(svgs(html)) == len(figures)
    for key in figures:
        assert "<svg" in plot_svg(html, key)


def test_html_holds_the_knee_cap_peak_and_tables(sweep_dir: MakeDir) -> None:
    d = sweep_dir()
    doc = json.loads((d / "sweep.json").read_text())
    assert doc["knee"] == {"meets": 4, "fails": 8}
    assert doc["knee_rate"] == {"meets": 0.5, "fails": 1.0}
    html = build_report([d]).html.read_text()
    assert "closed-loop knee: meets 4 users, fails 8 users; recommended gateway cap: 4" in html
    assert "open-loop knee: meets 0.5 rps, fails 1 rps" in html
    assert f"{doc['throughput_peak']['output_tok_s']:,.0f} output tok/s at 32 users" in html
    assert "(never the limit)" in html
    assert "per-token (mean) ≤ 100 ms" in html
    # the points table: every point, the invalid one with its reason
    table = re.search(r'<table class="points">(.*?)</table>', html, flags=re.S)
    assert table
    assert table.group(1).count("<tr") == 1 + len(doc["points"])
    assert f"invalid: {INVALID_REASON}" in table.group(1)
    assert 'class="invalid"' in table.group(1)
    # the invalid point's reason is written in the attainment plot too (SVG text)
    assert "under the floor 1,200 MHz" in plot_svg(html, "goodput")
    # target and workload
    assert "target.engine_version" in html and "workload.system_prompt_tokens" in html
    # the clock floor is drawn on the telemetry timeline
    assert "clock floor 1,200 MHz" in plot_svg(html, "telemetry")


def test_markdown_has_the_knee_lines_and_tables_but_no_images(sweep_dir: MakeDir) -> None:
    d = sweep_dir()
    md = build_report([d]).markdown.read_text()
    assert "- L4 BF16: closed-loop knee: meets 4 users, fails 8 users; recommended gateway " \
           "cap: 4" in md
    assert "- L4 BF16: open-loop knee: meets 0.5 rps, fails 1 rps" in md
    assert "| closed-loop knee | meets 4 users, fails 8 users |" in md
    assert "| 16 users | 4 | invalid: GPU clock p50 1,100 MHz" in md
    assert "<svg" not in md and "![" not in md and "<img" not in md


def test_two_dirs_are_overlaid_with_a_legend_per_sweep(sweep_dir: MakeDir,
                                                       tmp_path: Path) -> None:
    bf16 = sweep_dir("l4-bf16", "bf16", 1.0)
    fp8 = sweep_dir("l4-fp8", "fp8", 2.0)
    out = tmp_path / "cmp"
    code, text = invoke(bf16, fp8, "--out", out, "--title", "BF16 against FP8")
    assert code == 0, text
    html = (out / "report.html").read_text()
    assert "<title>BF16 against FP8</title>" in html
    for key in ("goodput", "latency", "throughput", "cache"):
        svg = plot_svg(html, key)
        assert "L4 BF16" in svg and "L4 FP8" in svg, key
    # timelines side by side: one column per sweep
    tele = plot_svg(html, "telemetry")
    assert "L4 BF16: SM clock" in tele and "L4 FP8: SM clock" in tele
    # both knees, both points tables
    assert "L4 BF16: closed-loop knee: meets 4 users" in html
    assert "L4 FP8: closed-loop knee: meets 8 users" in html
    assert html.count('<table class="points">') == 2
    md = (out / "report.md").read_text()
    assert "### L4 BF16" in md and "### L4 FP8" in md
    # ids stay unique across the inline SVGs
    ids = re.findall(r'\bid="([^"]+)"', html)
    assert len(ids) == len(set(ids))
    # and every reference inside an SVG points at an id of the page
    refs = re.findall(r'url\(#([^)]+)\)|href="#([^"]+)"', html)
    assert refs and all((a or b) in set(ids) for a, b in refs)


def test_same_labels_are_told_apart_by_folder(sweep_dir: MakeDir) -> None:
    a = sweep_dir("run-a", "fp8")
    b = sweep_dir("run-b", "fp8")
    labels = [s.label for s in load_sweeps([a, b])]
    assert labels == ["L4 FP8 (run-a)", "L4 FP8 (run-b)"]


def test_interrupted_dir_rebuilds_from_runs_jsonl(sweep_dir: MakeDir) -> None:
    d = sweep_dir(sweep_json=False, truncate_last=True)
    sweep = load_sweep(d)
    assert sweep.rebuilt
    points = build_points(1.0)[:-1]  # the last line was cut short
    expected = sweep_document(target("bf16"), {}, SLO(),
                              [SweepPoint.from_json(p) for p in points])
    assert len(sweep.points) == len(points)
    assert sweep.doc.knee == expected.knee
    assert sweep.doc.knee_rate == expected.knee_rate
    assert sweep.doc.target.gpu == "l4"  # from meta.json
    assert any("truncated last line" in w for w in sweep.warnings)
    code, out = invoke(d)
    assert code == 0, out
    assert "truncated last line" in out  # the warning reaches the user
    html = (d / "report.html").read_text()
    assert "rebuilt from runs.jsonl" in html
    assert "closed-loop knee: meets 4 users, fails 8 users" in html


def test_interrupted_dir_without_meta_is_labelled_by_its_folder(sweep_dir: MakeDir) -> None:
    d = sweep_dir("night-run", sweep_json=False, meta=False)
    sweep = load_sweeps([d])[0]
    assert sweep.label == "night-run"
    assert sweep.doc.target.to_json() == {}
    assert any("no meta.json" in w for w in sweep.warnings)
    build_report([d])
    assert (d / "report.html").is_file()


def test_a_bare_twin_sweep_file_from_run_sweep(tmp_path: Path) -> None:
    spec = EngineSpec(get_gpu("l4"), builtin_model("qwen3-8b"), precision("fp8", "fp8"))
    doc = TwinSweep(spec, WorkloadConfig(), SLO(), duration_s=60, warmup_s=5).run(
        [ClosedLoad(c) for c in (1, 8, 32)])
    f = tmp_path / "twin" / "fp8.json"
    f.parent.mkdir()
    f.write_text(json.dumps(doc.to_json()))
    written = build_report([f])
    assert written.html.parent == f.parent  # default: the sweep file's folder
    html = written.html.read_text()
    assert_self_contained(html)
    k = doc.knee
    meets = "none" if k.meets is None else f"{k.meets} users"
    fails = "none tested" if k.fails is None else f"{k.fails} users"
    assert f"L4 FP8: closed-loop knee: meets {meets}, fails {fails}" in html
    # closed loop only: no open-loop panel, no run files: no timelines
    figures = re.findall(r'<figure class="plot" id="plot-([a-z]+)">', html)
    assert figures == ["goodput", "latency", "throughput", "cache"]
    assert "open loop" not in plot_svg(html, "goodput")


def test_time_scale_is_shown(sweep_dir: MakeDir) -> None:
    d = sweep_dir(time_scale=10.0)
    html = build_report([d]).html.read_text()
    assert "points ran at time scale 10×" in html
    assert "<th>time scale</th>" in html
    assert "All times are model times" in html


# --------------------------------------------------------------------------------------------
# bad input: a ReportInputError (a ValueError), exit status 2 from the command


def _bad_inputs(tmp_path: Path, make: MakeDir) -> dict[str, tuple[Path, str]]:
    cases: dict[str, tuple[Path, str]] = {}
    cases["missing"] = (tmp_path / "nowhere", "no such sweep directory or file")
    empty = tmp_path / "empty"
    empty.mkdir()
    cases["not a sweep dir"] = (empty, "not a sweep directory")
    wrong = make("wrong-schema")
    doc = json.loads((wrong / "sweep.json").read_text())
    (wrong / "sweep.json").write_text(json.dumps({**doc, "schema": "chatfleet.sweep/9"}))
    cases["wrong schema"] = (wrong, "unsupported schema")
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"hello": 1}))
    cases["not a sweep file"] = (other, "not a sweep")
    broken = make("broken-json")
    (broken / "sweep.json").write_text('{"schema": "chatfleet.sweep/1", "points": [')
    cases["invalid JSON"] = (broken, "not valid JSON")
    middle = make("bad-middle", sweep_json=False)
    lines = (middle / "runs.jsonl").read_text().splitlines(keepends=True)
    lines[2] = '{"load": {"mode": "closed", "concurr\n'
    (middle / "runs.jsonl").write_text("".join(lines))
    cases["malformed line"] = (middle, "line 3: malformed JSON")
    noload = make("no-load")
    doc = json.loads((noload / "sweep.json").read_text())
    del doc["points"][1]["load"]
    (noload / "sweep.json").write_text(json.dumps(doc))
    cases["point without load"] = (noload, "point 1")
    only_cut = make("only-cut", sweep_json=False)
    (only_cut / "runs.jsonl").write_text('{"load": {"mode": "clo')
    cases["no whole run"] = (only_cut, "no finished run")
    return cases


def test_bad_input_raises_a_value_error(tmp_path: Path, sweep_dir: MakeDir) -> None:
    for name, (path, message) in _bad_inputs(tmp_path, sweep_dir).items():
        with pytest.raises(ReportInputError, match=re.escape(message)) as info:
            build_report([path], out_dir=tmp_path / "out")
        assert isinstance(info.value, ValueError), name


def test_bad_input_exits_2_with_a_clear_message(tmp_path: Path, sweep_dir: MakeDir) -> None:
    for name, (path, message) in _bad_inputs(tmp_path, sweep_dir).items():
        code, out = invoke(path, "--out", tmp_path / "out")
        assert code == 2, (name, out)
        assert "error:" in out and message in " ".join(out.split()), (name, out)
        assert "Traceback" not in out
    code, out = invoke()
    assert code == 2  # no sweep given: typer's usage error


def test_a_missing_telemetry_file_is_a_warning_not_an_error(sweep_dir: MakeDir) -> None:
    d = sweep_dir()
    (d / "runs" / "002" / "telemetry.jsonl").unlink()
    with (d / "runs" / "003" / "telemetry.jsonl").open("a") as f:
        f.write('{"t": 999, "sm_clo')  # cut short
    sweep = load_sweep(d)
    assert 2 not in sweep.telemetry and 3 in sweep.telemetry
    assert any("002/telemetry.jsonl" in w and "missing" in w for w in sweep.warnings)
    assert any("003/telemetry.jsonl" in w and "truncated" in w for w in sweep.warnings)
    html = build_report([d]).html.read_text()
    assert "Input warnings" in html


def test_rates_of_a_window_of_few_cycles_are_marked(sweep_dir: MakeDir) -> None:
    """A closed-loop point whose window held fewer than 10 cycles has its goodput and tok/s
    marked `~` with a note, in the report and in the sweep's table."""
    d = sweep_dir()
    doc = json.loads((d / "sweep.json").read_text())
    doc["points"][0].update(window_cycles=3.2, few_cycles=True)
    doc["points"][1].update(window_cycles=40.0, few_cycles=False)
    (d / "sweep.json").write_text(json.dumps(doc))
    md = build_report([d]).markdown.read_text()
    assert "~ few cycles: the window held fewer than 10" in md
    assert "1 of few cycles)" in md
    marked = [line for line in md.splitlines() if "~ |" in line]
    assert len(marked) == 1 and marked[0].count("~") == 2
    console = Console(width=250, record=True)
    console.print(sweep_table(SweepDoc.from_json(doc), "t"))
    text = console.export_text()
    assert "~ few cycles" in text
    assert sum(line.count("~") for line in text.splitlines() if "│" in line) == 2
