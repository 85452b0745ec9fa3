"""`chatfleet report`: an HTML report with plots and a Markdown summary of one or more sweeps."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from chatfleet.cli.common import clean_errors, console
from chatfleet.report.build import build_report


def report(
    sweeps: list[Path] = typer.Argument(
        ..., metavar="DIR...", help="Sweep directories (chatfleet sweep --out DIR) or sweep "
        "JSON files (chatfleet twin sweep --json FILE); several are overlaid on every plot.",
        show_default=False),
    out_dir: Path | None = typer.Option(
        None, "--out", help="Folder for report.html and report.md (default: the first sweep "
        "directory, or the sweep file's folder)."),
    title: str | None = typer.Option(None, "--title", help="Report title."),
    live_proof: Path | None = typer.Option(
        None, "--live-proof", metavar="FILE", help="A chatfleet.live-proof/1 file (chatfleet "
        "demo writes DIR/live/proof.json): a gateway run past the fleet's cap, reported in its "
        "own section (did the cap hold, shed, admitted attainment, each replica's peak in "
        "flight), not as a sweep."),
) -> None:
    """Write DIR/report.html (self-contained, inline SVG plots) and DIR/report.md."""
    with clean_errors():
        written = build_report(sweeps, out_dir=out_dir, title=title, live_proof=live_proof)
    for w in written.warnings:
        console.print(f"[yellow]warning:[/] {escape(w)}", highlight=False)
    print(written.html)
    print(written.markdown)
