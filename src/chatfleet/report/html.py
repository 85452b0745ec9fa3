"""The self-contained HTML report: inline CSS, inline SVG plots, no script, font or image
fetched from anywhere."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from chatfleet import __version__
from chatfleet.report.load import Sweep
from chatfleet.report.plots import Plot
from chatfleet.report.proof import LiveProof, headline, outcome_table, replica_table, setup_line
from chatfleet.report.tables import Table, knee_lines, points_table, setup_table, summary_table

CSS = """
:root { --ink: #1d2430; --muted: #5b6573; --line: #d8dde4; --bad: #b3261e; --bg: #ffffff;
        --band: #f5f7fa; --accent: #1f5fa8; }
* { box-sizing: border-box; }
body { margin: 0; background: var(--bg); color: var(--ink);
       font: 15px/1.45 "DejaVu Sans", "Liberation Sans", Arial, sans-serif; }
main { max-width: 1320px; margin: 0 auto; padding: 24px 28px 48px; }
h1 { font-size: 26px; margin: 0 0 4px; }
h2 { font-size: 20px; margin: 36px 0 12px; padding-bottom: 4px;
     border-bottom: 2px solid var(--line); }
h3 { font-size: 16px; margin: 22px 0 8px; }
p.meta { color: var(--muted); margin: 0 0 12px; }
nav { margin: 8px 0 0; font-size: 14px; }
nav a { color: var(--accent); margin-right: 14px; text-decoration: none; }
ul.knees { margin: 8px 0 14px; padding-left: 20px; }
ul.knees li { margin: 2px 0; font-weight: 600; }
.warnings { border-left: 4px solid #e0a100; background: #fff8e1; padding: 8px 14px;
            margin: 12px 0; font-size: 14px; }
.warnings ul { margin: 4px 0; padding-left: 18px; }
.scroll { overflow-x: auto; max-width: 100%; }
table { border-collapse: collapse; font-size: 13px; margin: 6px 0; }
table.points { font-size: 12.5px; }
th, td { border: 1px solid var(--line); padding: 4px 7px; text-align: right;
         vertical-align: top; }
th { background: var(--band); font-weight: 600; position: sticky; top: 0; }
td:first-child, th:first-child { text-align: left; white-space: nowrap; }
table.summary td, table.summary th { text-align: left; }
table.summary td:first-child { font-weight: 600; }
table.setup td { font-family: "DejaVu Sans Mono", "Liberation Mono", monospace; font-size: 12px;
                 text-align: left; }
table.points td.valid { text-align: left; min-width: 15em; max-width: 24em; }
table.points tr.invalid td { background: #fdecea; }
table.points tr.invalid td.valid { color: var(--bad); font-weight: 600; }
p.notes { color: var(--muted); font-size: 13px; margin: 4px 0 16px; }
figure.plot { margin: 18px 0 30px; padding: 12px 14px; border: 1px solid var(--line);
              border-radius: 6px; }
figure.plot h3 { margin-top: 0; }
figure.plot svg { display: block; width: 100%; max-width: 1260px; height: auto; margin: 0 auto; }
figcaption { color: var(--muted); font-size: 14px; margin-top: 6px; }
section.proof { border: 1px solid var(--line); border-left: 5px solid #2e7d32; border-radius: 6px;
                padding: 4px 18px 10px; margin: 24px 0; }
section.proof.broken { border-left-color: var(--bad); }
section.proof h3 { font-size: 18px; margin-top: 14px; }
p.headline { font-size: 17px; font-weight: 600; margin: 4px 0 10px; }
.cards { display: flex; flex-wrap: wrap; gap: 18px; align-items: flex-start; }
footer { color: var(--muted); font-size: 13px; margin-top: 36px; border-top: 1px solid var(--line);
         padding-top: 10px; }
"""


def _table(t: Table, css_class: str) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in t.headers)
    body = []
    for i, row in enumerate(t.rows):
        cls = ' class="invalid"' if i in t.invalid_rows else ""
        cells = []
        for j, cell in enumerate(row):
            td_cls = ' class="valid"' if t.headers[j] == "valid" else ""
            cells.append(f"<td{td_cls}>{escape(cell)}</td>")
        body.append(f"<tr{cls}>{''.join(cells)}</tr>")
    notes = "".join(f"<p class=\"notes\">{escape(n)}</p>" for n in t.notes)
    return (f'<div class="scroll"><table class="{css_class}"><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table></div>{notes}")


def _anchor(i: int) -> str:
    return f"sweep-{i + 1}"


def _proof_section(proof: LiveProof) -> str:
    cls = "proof" if proof.held else "proof broken"
    return (f'<section id="live-proof" class="{cls}"><h3>Live proof: the gateway\'s cap</h3>'
            f'<p class="headline">{escape(headline(proof))}</p>'
            f'<p class="meta">{escape(setup_line(proof))}</p><div class="cards">'
            f'<div>{_table(outcome_table(proof), "summary proof-outcomes")}</div>'
            f'<div>{_table(replica_table(proof), "proof-replicas")}</div></div></section>')


def render_html(sweeps: Sequence[Sweep], plots: Sequence[Plot], title: str,
                proof: LiveProof | None = None) -> str:
    """The whole report as one HTML document (with the live proof's section when given)."""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{escape(title)}</title><style>{CSS}</style></head><body><main>",
        f"<header><h1>{escape(title)}</h1>",
        f'<p class="meta">chatfleet {escape(__version__)} sweep report: '
        f"{escape(', '.join(s.label for s in sweeps))}. All times are model times.</p>",
        "<nav>" + '<a href="#summary">Summary</a>'
        + ('<a href="#live-proof">Live proof</a>' if proof is not None else "")
        + "".join(f'<a href="#plot-{escape(p.key)}">{escape(p.title)}</a>' for p in plots)
        + "".join(f'<a href="#{_anchor(i)}">Points: {escape(s.label)}</a>'
                  for i, s in enumerate(sweeps))
        + "</nav></header>",
        '<section id="summary"><h2>Summary</h2><ul class="knees">',
    ]
    for s in sweeps:
        parts += [f"<li>{escape(line)}</li>" for line in knee_lines(s)]
    parts.append("</ul>")
    warnings = [w for s in sweeps for w in s.warnings]
    if warnings:
        parts.append('<div class="warnings"><strong>Input warnings</strong><ul>'
                     + "".join(f"<li>{escape(w)}</li>" for w in warnings) + "</ul></div>")
    parts.append(_table(summary_table(sweeps), "summary"))
    if proof is not None:  # the live run beside the sweeps' answer, before the detail
        parts.append(_proof_section(proof))
    parts.append("<h3>Target and workload</h3>")
    parts.append(_table(setup_table(sweeps), "summary setup"))
    parts.append('</section><section id="plots"><h2>Plots</h2>')
    for p in plots:
        parts.append(f'<figure class="plot" id="plot-{escape(p.key)}">'
                     f"<h3>{escape(p.title)}</h3>{p.svg}"
                     f"<figcaption>{escape(p.caption)}</figcaption></figure>")
    parts.append('</section><section id="points"><h2>Points</h2>')
    for i, s in enumerate(sweeps):
        parts.append(f'<h3 id="{_anchor(i)}">{escape(s.label)}</h3>')
        parts.append(_table(points_table(s), "points"))
    parts.append(
        "</section><footer>Goodput: requests of the measurement window that meet the target, "
        "per second of the window. Attainment: their share of all the window's requests. "
        "The knee (per load mode) is the highest tested load that meets the target attainment "
        "together with every lower load; the recommended gateway cap is the requests in "
        "flight at the closed-loop knee. Invalid runs (cache not flushed, client behind, GPU "
        "clock under the floor) stay in the tables with their reason and are left out of the "
        "knee. See docs/report.md and docs/metrics.md.</footer></main></body></html>")
    return "\n".join(parts) + "\n"
