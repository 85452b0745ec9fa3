"""`--dist loadgroup` keeps a group on one worker with the pinned pytest and pytest-xdist (the
reliability suite and the image build rely on it): a pytest 9.2 with pytest-xdist 3.8 spread
every group over both workers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

GROUPED = '''
import os, pathlib, pytest
@pytest.mark.xdist_group("g")
@pytest.mark.parametrize("i", range(6))
def test_member(i):
    out = pathlib.Path(os.environ["GROUP_OUT"]) / f"worker-{i}"
    out.write_text(os.environ.get("PYTEST_XDIST_WORKER", "none"))
'''


@pytest.mark.timeout(120)
def test_a_group_runs_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    out = tmp_path / "out"
    out.mkdir()
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup",
         "-p", "no:cacheprovider", str(tmp_path / "test_grouped.py")],
        cwd=tmp_path, capture_output=True, text=True, timeout=110,
        env={**os.environ, "GROUP_OUT": str(out)})
    assert res.returncode == 0, res.stdout + res.stderr
    files = list(out.glob("worker-*"))
    workers = {p.read_text() for p in files}
    assert len(files) == 6
    assert len(workers) == 1 and workers != {"none"}, workers
