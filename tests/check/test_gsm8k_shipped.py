"""The GSM8K test split ships with chatfleet: `--dataset gsm8k` and `--oracle-dataset gsm8k` find
it from any folder, with nothing beside the clone, and its licence notice travels with it."""

from __future__ import annotations

import fnmatch
import json
import os
import subprocess
import tomllib
from pathlib import Path

import pytest

import chatfleet
from chatfleet.data.paths import gsm8k_test_path
from tests.processes import CHATFLEET, stop

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[2]
PACKAGE = Path(chatfleet.__file__).resolve().parent


def test_the_split_and_its_licence_are_package_data() -> None:
    split = gsm8k_test_path()
    assert split.is_relative_to(PACKAGE)
    assert sum(1 for _ in split.open(encoding="utf-8")) == 1319
    notice = (split.parent / "LICENSE").read_text(encoding="utf-8")
    assert notice.startswith("MIT License") and "Copyright (c) 2021 OpenAI" in notice
    # a wheel carries them only if pyproject's package-data names them
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())[
        "tool"]["setuptools"]["package-data"]["chatfleet"]
    for file in (split, split.parent / "LICENSE"):
        rel = file.relative_to(PACKAGE).as_posix()
        assert any(fnmatch.fnmatch(rel, p) for p in patterns), (rel, patterns)


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items()
            if k not in ("CHATFLEET_GSM8K", "PYTHONUNBUFFERED")}


def test_simserver_and_accuracy_find_gsm8k_from_an_empty_folder(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {**clean_env(), "HF_HUB_OFFLINE": "1"}
    server = subprocess.Popen(
        [str(CHATFLEET), "simserver", "--oracle-dataset", "gsm8k", "--oracle-accuracy", "1",
         "--time-scale", "100", "--port", "0", "--host", "127.0.0.1"],
        cwd=empty, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert server.stdout is not None
        url = server.stdout.readline().decode().strip()
        assert url.startswith("http://127.0.0.1:"), url
        res = subprocess.run(
            [str(CHATFLEET), "accuracy", "--target", f"bf16={url}", "--dataset", "gsm8k",
             "--n", "5", "--json"],
            cwd=empty, env=env, capture_output=True, text=True, timeout=90)
    finally:
        stop(server)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["dataset"]["kind"] == "gsm8k" and doc["dataset"]["total"] == 1319
    assert Path(doc["dataset"]["path"]) == gsm8k_test_path()
    assert doc["targets"]["bf16"]["correct"] == 5  # the oracle answered from the same split
    assert list(empty.iterdir()) == []


def test_a_missing_override_is_one_clean_error(tmp_path: Path) -> None:
    env = {**clean_env(), "CHATFLEET_GSM8K": str(tmp_path / "none.jsonl")}
    for args in (["accuracy", "--target", "a=http://127.0.0.1:9", "--dataset", "gsm8k"],
                 ["simserver", "--oracle-dataset", "gsm8k"]):
        res = subprocess.run([str(CHATFLEET), *args], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=60)
        err = " ".join(res.stderr.split())
        assert res.returncode == 2 and "GSM8K test split is not at $CHATFLEET_GSM8K" in err, err
        assert "Traceback" not in res.stderr
