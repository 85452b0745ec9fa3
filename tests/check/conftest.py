"""Shared pieces of the accuracy tests: the GSM8K file, oracle simservers in a thread."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from chatfleet.core.engine.build import EngineSpec
from chatfleet.core.specs import builtin_model, get_gpu, precision
from chatfleet.data.paths import gsm8k_test_path
from chatfleet.simserver.server import RunningServer, ServerConfig, serve_in_thread

os.environ.setdefault("HF_HUB_OFFLINE", "1")

GSM8K_TEST = gsm8k_test_path()  # the split shipped with the package
TIME_SCALE = 100.0


def oracle_config(dataset: Path, accuracy: float, seed: int, *, weights: str = "bf16",
                  time_scale: float = TIME_SCALE) -> ServerConfig:
    spec = EngineSpec(get_gpu("l4"), builtin_model("qwen3-8b"), precision(weights, weights))
    return ServerConfig(spec=spec, host="127.0.0.1", time_scale=time_scale, seed=seed,
                        oracle_dataset=dataset, oracle_accuracy=accuracy)


@contextmanager
def oracle(dataset: Path, accuracy: float, seed: int, **kw: object) -> Iterator[RunningServer]:
    with serve_in_thread(oracle_config(dataset, accuracy, seed, **kw)) as srv:  # type: ignore[arg-type]
        yield srv
