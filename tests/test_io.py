"""chatfleet.io: the one atomic write and the one JSON shape of chatfleet's documents."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import numpy as np
import pytest

from chatfleet import io


def test_write_atomic_writes_bytes_and_text_and_makes_the_folders(tmp_path: Path) -> None:
    raw = tmp_path / "a" / "b" / "raw.bin"
    io.write_atomic(raw, b"\x00\xff")
    assert raw.read_bytes() == b"\x00\xff"
    text = tmp_path / "report.md"
    io.write_atomic(text, "knee: 8 users \u2264 1 s\n")
    assert text.read_bytes() == "knee: 8 users \u2264 1 s\n".encode()


def test_write_atomic_replaces_a_file_and_leaves_no_temporary_behind(tmp_path: Path) -> None:
    path = tmp_path / "sweep.json"
    io.write_atomic(path, "old")
    io.write_atomic(path, "new")
    assert path.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep.json"]


def test_a_failed_write_keeps_the_old_file_whole(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "plan.json"
    io.write_atomic(path, "whole")

    def full_disk(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space"):
        io.write_atomic(path, "half")
    assert path.read_text() == "whole"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]


def test_the_file_mode_is_a_plain_opens_not_a_temporary_files(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        io.write_atomic(tmp_path / "report.html", "<html/>")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "report.html").stat().st_mode) == 0o644


def test_dumps_indents_and_writes_numpy_values_as_numbers(tmp_path: Path) -> None:
    doc = {"knee": {"meets": np.int64(8)}, "p99": np.float64(0.5), "grid": np.arange(3)}
    text = io.dumps(doc).decode()
    assert json.loads(text) == {"knee": {"meets": 8}, "p99": 0.5, "grid": [0, 1, 2]}
    assert '\n  "knee": {\n    "meets": 8' in text
    io.write_json(tmp_path / "doc.json", doc)
    assert (tmp_path / "doc.json").read_bytes() == io.dumps(doc)
