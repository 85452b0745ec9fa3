"""The Markdown summary: the knee lines and the same tables as the HTML, no images."""

from __future__ import annotations

from collections.abc import Sequence

from chatfleet import __version__
from chatfleet.report.load import Sweep
from chatfleet.report.proof import LiveProof, headline, outcome_table, replica_table, setup_line
from chatfleet.report.tables import Table, knee_lines, points_table, setup_table, summary_table


def _cell(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def md_table(t: Table) -> str:
    headers = [h or " " for h in t.headers]
    align = ["---" if i == 0 or not t.numeric else "---:" for i in range(len(headers))]
    lines = ["| " + " | ".join(_cell(h) for h in headers) + " |",
             "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in t.rows]
    out = "\n".join(lines) + "\n"
    if t.notes:
        out += "\n" + "\n".join(t.notes) + "\n"
    return out


def proof_markdown(proof: LiveProof) -> list[str]:
    return ["### Live proof: the gateway's cap", "", f"**{headline(proof)}**", "",
            setup_line(proof), "", md_table(outcome_table(proof)), md_table(replica_table(proof))]


def render_markdown(sweeps: Sequence[Sweep], title: str, proof: LiveProof | None = None) -> str:
    parts = [f"# {title}", "",
             f"chatfleet {__version__} sweep report: {', '.join(s.label for s in sweeps)}. "
             "All times are model times; the plots are in report.html.", "", "## Summary", ""]
    for s in sweeps:
        parts += [f"- {line}" for line in knee_lines(s)]
    parts.append("")
    warnings = [w for s in sweeps for w in s.warnings]
    if warnings:
        parts += ["**Input warnings**", ""] + [f"- {w}" for w in warnings] + [""]
    parts.append(md_table(summary_table(sweeps)))
    if proof is not None:
        parts += proof_markdown(proof)
    parts += ["### Target and workload", "", md_table(setup_table(sweeps)), "## Points", ""]
    for s in sweeps:
        parts += [f"### {s.label}", "", md_table(points_table(s))]
    return "\n".join(parts).rstrip() + "\n"
