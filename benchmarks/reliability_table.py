"""Render docs/reliability.md's table from the reliability suite's own output.

    .venv/bin/pytest tests/reliability            # writes out/reliability.json
    .venv/bin/python benchmarks/reliability_table.py out/reliability.json > table.md
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

KINDS = {"load": "load held", "fault": "fault survived", "fairness": "fairness",
         "input": "bad input", "harness": "harness"}


def render(doc: dict[str, object]) -> str:
    rows = doc["rows"]
    assert isinstance(rows, list)
    lines = [f"Suite run of {doc['date']}: {len(rows)} checks, "
             f"{sum(int(r['requests']) for r in rows)} requests, "
             f"**{sum(int(r['lost']) for r in rows)} lost**.", "",
             "| what | check | expected | observed | requests | lost |",
             "|---|---|---|---|---:|---:|"]
    order = list(KINDS)
    for r in sorted(rows, key=lambda r: order.index(r["kind"]) if r["kind"] in order else 9):
        cells = [KINDS.get(r["kind"], r["kind"]), r["check"], r["expected"], r["observed"],
                 str(r["requests"]), str(r["lost"])]
        lines.append("| " + " | ".join(str(c).replace("|", "/") for c in cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render(json.loads(Path(sys.argv[1]).read_text())))
