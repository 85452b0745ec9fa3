"""The live proof: its own section of the report (did the cap hold, shed, admitted attainment,
each replica's own peak in flight, the twin beside it), never a sweep with a knee."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from html import unescape
from pathlib import Path

import pytest
from typer.testing import CliRunner

from chatfleet.cli import app
from chatfleet.report.build import ReportInputError, build_report, load_live_proof
from tests.report.synth import write_live_proof

MakeDir = Callable[..., Path]


def section(html: str) -> str:
    m = re.search(r'<section id="live-proof"[^>]*>(.*?)</section>', html, flags=re.S)
    assert m, "no live-proof section"
    return unescape(m.group(1))


def test_the_proof_is_its_own_section_with_the_cap_held(sweep_dir: MakeDir,
                                                        tmp_path: Path) -> None:
    proof = tmp_path / "live" / "proof.json"
    write_live_proof(proof, peaks=(24, 23))
    written = build_report([sweep_dir()], out_dir=tmp_path / "out", live_proof=proof)
    html, md = written.html.read_text(), written.markdown.read_text()
    text = section(html)
    headline = ("The cap held with 2× the fleet's cap offered: 96 users on 2 replicas at cap 24 "
                "each (48 in all); peak in flight per replica (its own trace): replica-0 24/24, "
                "replica-1 23/24.")
    assert headline in text and f"**{headline}**" in md
    assert '<a href="#live-proof">Live proof</a>' in html
    for cell in ("1,265", "1,144", "1,013 (1,013 with Retry-After, median 1 s)", "0.996",
                 "922 ms", "1,014 ms", "98 ms", "4.2"):
        assert f"<td>{cell}</td>" in text, cell
        assert f"| {cell} |" in md, cell
    assert "<td>replica-1</td><td>23</td>" not in text  # the cap column comes first
    assert "<td>replica-1</td><td>24</td><td>23</td><td>24</td><td>held</td>" in text
    # raw figures stay in the file, rounded in the report
    assert "921.92293274" not in html and "0.995967741935" not in html
    # beside the sweeps' summary, not one of the sweeps: one knee line per mode of the one sweep
    assert html.count("closed-loop knee: meets") == 1 and "96 users" not in html.split(
        'id="live-proof"')[0]
    assert html.index('id="live-proof"') < html.index('id="plots"')


def test_a_replica_over_its_cap_is_said_so(sweep_dir: MakeDir, tmp_path: Path) -> None:
    proof = tmp_path / "proof.json"
    write_live_proof(proof, peaks=(24, 26))
    html = build_report([sweep_dir()], out_dir=tmp_path / "out",
                        live_proof=proof).html.read_text()
    assert '<section id="live-proof" class="proof broken">' in html
    text = section(html)
    assert "The cap did NOT hold" in text and "replica-1 26/24" in text
    assert "<td>over the cap</td>" in text
    assert not load_live_proof(proof).held


def test_without_a_proof_there_is_no_section(sweep_dir: MakeDir, tmp_path: Path) -> None:
    html = build_report([sweep_dir()], out_dir=tmp_path / "out").html.read_text()
    assert 'id="live-proof"' not in html and "Live proof" not in html


def test_the_command_takes_the_proof(sweep_dir: MakeDir, tmp_path: Path) -> None:
    proof = tmp_path / "proof.json"
    write_live_proof(proof)
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["report", str(sweep_dir()), "--out", str(out),
                                   "--live-proof", str(proof)])
    assert res.exit_code == 0, res.output
    assert "The cap held" in (out / "report.html").read_text()
    assert "### Live proof: the gateway's cap" in (out / "report.md").read_text()


def _bad_proofs(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    good = write_live_proof(tmp_path / "good.json")
    cases: dict[str, tuple[Path, str]] = {"missing": (tmp_path / "nowhere.json",
                                                      "no such live proof file")}

    def case(name: str, doc: object, message: str) -> None:
        path = tmp_path / f"{name.replace(' ', '-')}.json"
        path.write_text(json.dumps(doc))
        cases[name] = (path, message)

    case("a sweep", {"schema": "chatfleet.sweep/1", "points": []}, "is not 'chatfleet.live")
    case("not an object", [1, 2], "expected a JSON object")
    case("no cap", {**good, "cap_per_replica": 0}, "'cap_per_replica' must be a whole number")
    case("no peaks", {**good, "live": {**good["live"], "peak_in_flight": {}}},
         "'live.peak_in_flight' must map each replica")
    case("text peak", {**good, "live": {**good["live"], "peak_in_flight": {"r": "24"}}},
         "'live.peak_in_flight' must map each replica")
    broken = tmp_path / "broken.json"
    broken.write_text('{"schema": "chatfleet.live-proof/1", ')
    cases["invalid JSON"] = (broken, "not valid JSON")
    return cases


def test_a_bad_proof_is_a_clear_error(sweep_dir: MakeDir, tmp_path: Path) -> None:
    d = sweep_dir()
    for name, (path, message) in _bad_proofs(tmp_path).items():
        with pytest.raises(ReportInputError, match=re.escape(message)):
            build_report([d], out_dir=tmp_path / "out", live_proof=path)
        res = CliRunner().invoke(app, ["report", str(d), "--out", str(tmp_path / "out"),
                                       "--live-proof", str(path)])
        assert res.exit_code == 2, (name, res.output)
        assert message in " ".join(res.output.split()), (name, res.output)
        assert "Traceback" not in res.output
