"""A sweep's directory: runs appended as they finish, the document rewritten after each.

```
DIR/meta.json                 target, workload, slo and the sweep's settings (written first)
DIR/runs.jsonl                one finished run per line (a chatfleet.sweep/1 point), fsync'd
DIR/sweep.json                the chatfleet.sweep/1 document, rewritten atomically per run
DIR/runs/NNN/telemetry.jsonl  GPU samples of run NNN
DIR/runs/NNN/engine.jsonl     engine metric scrapes of run NNN
DIR/runs/NNN/records.jsonl    every request of run NNN (token times and the engine's
                              response id included)
```

An interrupted sweep loses nothing that finished: `--resume` reads runs.jsonl and skips every
(load, seed) already there; a truncated last line (a crash mid-write) is ignored.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson

from chatfleet.core.documents.fields import DocumentError
from chatfleet.core.documents.sweep import SweepDoc, SweepPoint
from chatfleet.core.errors import ChatfleetError
from chatfleet.core.measure.knee import sweep_document
from chatfleet.core.records import RequestRecord, record_to_json
from chatfleet.core.slo import SLO
from chatfleet.io import write_json


class ResultsError(ChatfleetError):
    pass


class SweepDir:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.runs_path = root / "runs.jsonl"
        self.meta_path = root / "meta.json"
        self.doc_path = root / "sweep.json"

    def run_dir(self, index: int) -> Path:
        d = self.root / "runs" / f"{index:03d}"
        d.mkdir(parents=True, exist_ok=True)
        return d

    def start(self, meta: dict[str, Any], resume: bool) -> list[SweepPoint]:
        """Prepare the directory; return the runs already finished (resume) or none."""
        if self.root.exists() and not self.root.is_dir():
            raise ResultsError(f"{self.root} exists and is not a directory")
        self.root.mkdir(parents=True, exist_ok=True)
        done = self.finished_runs()
        if done and not resume:
            raise ResultsError(
                f"{self.root} already holds {len(done)} finished runs: pass --resume to "
                "continue that sweep, or choose another --out")
        if resume and self.meta_path.exists():
            old = orjson.loads(self.meta_path.read_bytes())
            for key in ("target_url", "workload", "slo"):
                if key in old and old[key] != meta.get(key):
                    raise ResultsError(
                        f"--resume: the sweep in {self.root} was run with a different {key} "
                        f"({old[key]!r}); start a new --out")
        write_json(self.meta_path, meta)
        return done

    def finished_runs(self) -> list[SweepPoint]:
        if not self.runs_path.exists():
            return []
        runs = []
        lines = self.runs_path.read_bytes().splitlines()
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                row = orjson.loads(line)
            except orjson.JSONDecodeError:
                if i == len(lines) - 1:
                    continue  # a run cut off mid-write: it did not finish
                raise ResultsError(f"{self.runs_path}: line {i + 1} is not JSON") from None
            try:
                runs.append(SweepPoint.from_json(row, f"{self.runs_path}, line {i + 1}"))
            except DocumentError as exc:
                raise ResultsError(str(exc)) from None
        return runs

    def append_run(self, point: SweepPoint) -> None:
        with open(self.runs_path, "ab") as f:
            f.write(orjson.dumps(point.to_json(), option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")
            f.flush()
            os.fsync(f.fileno())

    def write_doc(self, target: dict[str, Any], workload: dict[str, Any], slo: SLO,
                  points: list[SweepPoint], cap_margin: int) -> SweepDoc:
        doc = sweep_document(target, workload, slo, points, cap_margin=cap_margin)
        write_json(self.doc_path, doc.to_json())
        return doc

    def write_records(self, index: int, records: Iterable[RequestRecord]) -> Path:
        path = self.run_dir(index) / "records.jsonl"
        with open(path, "wb") as f:
            for r in records:
                f.write(orjson.dumps(record_to_json(r), option=orjson.OPT_SERIALIZE_NUMPY)
                        + b"\n")
        return path
