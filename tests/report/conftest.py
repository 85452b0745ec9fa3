"""Fixtures: synthetic sweep directories in tmp_path."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.report.synth import write_sweep_dir


@pytest.fixture
def sweep_dir(tmp_path: Path) -> Callable[..., Path]:
    def make(name: str = "l4-bf16", weights: str = "bf16", speed: float = 1.0,
             **kw: Any) -> Path:
        root = tmp_path / name
        write_sweep_dir(root, weights, speed, **kw)
        return root

    return make
