"""Render docs/reliability.md's table from the reliability suite's own output.

    .venv/bin/pytest tests/reliability            # writes out/reliability.json
    .venv/bin/python benchmarks/reliability_table.py out/reliability.json > table.md

Several files (the suite run one file at a time, each with its own
CHATFLEET_RELIABILITY_OUT) are rendered as one run: their rows together, the latest date.
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


def merged(docs: list[dict[str, object]]) -> dict[str, object]:
    rows: list[object] = []
    for d in docs:
        part = d["rows"]
        assert isinstance(part, list)
        rows += part
    return {"date": max(str(d["date"]) for d in docs), "rows": rows}


if __name__ == "__main__":
    sys.stdout.write(render(merged([json.loads(Path(p).read_text()) for p in sys.argv[1:]])))
