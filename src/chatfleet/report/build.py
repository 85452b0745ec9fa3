"""`chatfleet report`'s whole job: read the sweeps (and a live proof), render the HTML report
(inline SVG plots) and the Markdown summary, and write them (see the package docstring)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from chatfleet.io import write_atomic
from chatfleet.report.html import render_html
from chatfleet.report.load import ReportInputError, Sweep, load_sweep, load_sweeps
from chatfleet.report.markdown import render_markdown
from chatfleet.report.plots import all_plots
from chatfleet.report.proof import PROOF_SCHEMA, LiveProof, load_live_proof

__all__ = [
    "PROOF_SCHEMA",
    "LiveProof",
    "ReportInputError",
    "ReportPaths",
    "Sweep",
    "build_report",
    "default_out_dir",
    "default_title",
    "load_live_proof",
    "load_sweep",
    "load_sweeps",
    "render_report",
]

HTML_NAME = "report.html"
MARKDOWN_NAME = "report.md"


@dataclass(frozen=True, slots=True)
class ReportPaths:
    html: Path
    markdown: Path
    warnings: list[str] = field(default_factory=list)


def default_out_dir(first: str | Path) -> Path:
    """The first sweep directory, or the folder of a bare sweep file."""
    p = Path(first)
    return p if p.is_dir() else p.parent


def default_title(sweeps: Sequence[Sweep]) -> str:
    return "chatfleet sweep report: " + " vs ".join(s.label for s in sweeps)


def render_report(sweeps: Sequence[Sweep], title: str | None = None,
                  proof: LiveProof | None = None) -> tuple[str, str]:
    """(HTML, Markdown) of the report over loaded sweeps, with the live proof when given."""
    title = title or default_title(sweeps)
    return (render_html(sweeps, all_plots(sweeps), title, proof),
            render_markdown(sweeps, title, proof))


def build_report(
    sources: Sequence[str | Path],
    out_dir: str | Path | None = None,
    title: str | None = None,
    live_proof: str | Path | None = None,
) -> ReportPaths:
    """Read the sweeps (and the chatfleet.live-proof/1 file `live_proof`, when given) and write
    OUT/report.html and OUT/report.md (OUT defaults to the first sweep's directory, or a bare
    sweep file's folder). Raises ReportInputError on bad input."""
    sweeps = load_sweeps(list(sources))
    proof = load_live_proof(live_proof) if live_proof is not None else None
    html_text, md_text = render_report(sweeps, title, proof)
    out = Path(out_dir) if out_dir is not None else default_out_dir(sources[0])
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ReportInputError(f"cannot create the output folder {out}: {exc}") from exc
    html_path, md_path = out / HTML_NAME, out / MARKDOWN_NAME
    _write(html_path, html_text)
    _write(md_path, md_text)
    return ReportPaths(html_path, md_path, [w for s in sweeps for w in s.warnings])


def _write(path: Path, text: str) -> None:
    try:
        write_atomic(path, text)
    except OSError as exc:
        raise ReportInputError(f"cannot write {path}: {exc}") from exc
