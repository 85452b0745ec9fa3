"""`chatfleet accuracy` on the command line: the JSON contract, engine logs, clean errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from chatfleet.cli import app
from tests.check.conftest import GSM8K_TEST
from tests.check.fake import PLAN, fake_in_thread, write_prompts

pytestmark = pytest.mark.timeout(120)
runner = CliRunner()

SGLANG_FP8_LOG = """\
[2025-11-30 10:02:16 TP0] Detected fp8 checkpoint.
[2025-11-30 10:02:24 TP0] Using FP8 KV cache but no scaling factors provided. Defaulting to \
scaling factors of 1.0. This may lead to less accurate results!
[2025-11-30 10:02:24 TP0] KV Cache is allocated. #tokens: 142369, K size: 4.89 GB, V size: \
4.89 GB
"""


def invoke(*args: str) -> tuple[int, str, str]:
    res = runner.invoke(app, ["accuracy", *args])
    return res.exit_code, res.stdout, res.stderr


@pytest.mark.parametrize(("args", "message"), [
    (["--target", "bf16"], "expected NAME=URL"),
    (["--target", "a=http://x", "--target", "a=http://y"], "given twice"),
    (["--target", "a=gopher://x"], "must start with http"),
    ([], "at least one --target"),
    (["--target", "a=http://127.0.0.1:9", "--dataset", "/no/such/file.jsonl"], "no such file"),
    (["--target", "a=http://127.0.0.1:9", "--n", "0"], "--n must be at least 1"),
    (["--target", "a=http://127.0.0.1:9", "--margin", "-0.1"], "--margin"),
    (["--target", "a=http://127.0.0.1:9", "--concurrency", "0"], "--concurrency"),
    (["--target", "a=http://127.0.0.1:9", "--thinking", "maybe"], "--thinking"),
    (["--target", "a=http://127.0.0.1:9", "--resume"], "--resume needs --out"),
    (["--target", "a=http://127.0.0.1:9", "--engine", "tgi"], "--engine must be"),
    (["--target", "a=http://127.0.0.1:9", "--engine-log", "b=/tmp/x"], "no --target is named"),
    (["--target", "a=http://127.0.0.1:9", "--engine-log", "a=/no/such.log"], "no such file"),
    (["--target", "a=http://127.0.0.1:9", "--dataset", str(GSM8K_TEST)], "unreachable"),
])
def test_bad_input_is_one_clean_error(args: list[str], message: str) -> None:
    code, out, err = invoke(*args)
    assert code == 2
    assert err.startswith("error:") and message in " ".join(err.split())
    assert "Traceback" not in out + err and out == ""


def test_a_target_that_is_not_an_engine_is_refused_before_any_question() -> None:
    """A 404 for /v1/models (a wrong port or path) once asked every question, each failing,
    and exited 1; it is bad input, one line, exit 2."""
    from tests.processes import not_an_engine

    with not_an_engine() as url:
        code, out, err = invoke("--target", f"bf16={url}", "--dataset", str(GSM8K_TEST),
                                "--n", "3")
    assert code == 2, err
    assert err.startswith("error:") and "answers 404 for /v1/models" in " ".join(err.split())
    assert "Traceback" not in out + err


def test_bad_dataset_file_is_one_clean_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "p", "answer": "a"}\nnot json\n')
    code, _, err = invoke("--target", "a=http://127.0.0.1:9", "--dataset", str(bad))
    assert code == 2 and "line 2: bad JSON" in err


def test_json_contract_engine_log_and_failures(tmp_path: Path) -> None:
    ds = write_prompts(tmp_path / "prompts.jsonl")
    log = tmp_path / "fp8.log"
    log.write_text(SGLANG_FP8_LOG)
    out_file = tmp_path / "res" / "acc.json"
    with fake_in_thread(slow_s=3.0) as a, fake_in_thread(slow_s=3.0) as b:
        code, out, err = invoke("--target", f"bf16={a.url}", "--target", f"fp8={b.url}/v1",
                                "--dataset", str(ds), "--timeout", "1", "--json",
                                "--engine-log", f"fp8={log}", "--out", str(out_file))
    assert code == 1, err  # failed requests: the result is still written, the exit says so
    assert "failed requests (counted as wrong): bf16 3, fp8 3" in " ".join(err.split())
    assert "FP8 KV cache has no scales" in " ".join(err.split())
    doc = json.loads(out)
    assert doc == json.loads(out_file.read_text())
    assert doc["schema"] == "chatfleet.accuracy/1" and doc["reference"] == "bf16"
    assert doc["margin"] == 0.02
    assert doc["dataset"] == {"name": str(ds), "kind": "prompts", "path": str(ds),
                              "n": len(PLAN), "total": len(PLAN), "seed": 0, "sampled": False}
    for name in ("bf16", "fp8"):
        t = doc["targets"][name]
        assert t["n"] == 11 and t["correct"] == 7 and t["failed"] == 3
        assert t["accuracy"] == pytest.approx(7 / 11) and len(t["ci95"]) == 2
        assert t["model"] == "fake-model"
    assert doc["targets"]["fp8"]["url"] == b.url
    assert doc["targets"]["bf16"]["engine_log"] is None
    facts = doc["targets"]["fp8"]["engine_log"]
    assert facts["kv_scale_fallback"] is True and facts["engine"] == "sglang"
    p = doc["paired"]
    assert p == doc["comparisons"][0] and len(doc["comparisons"]) == 1
    assert (p["a"], p["b"], p["both"], p["a_only"], p["b_only"], p["neither"]) == \
        ("bf16", "fp8", 7, 0, 0, 4)
    assert p["mcnemar_p"] == 1.0 and p["diff"] == 0.0 and p["within_margin"] is False
    assert p["diff_ci95"][0] < 0 < p["diff_ci95"][1] and "newcombe" in p["diff_method"]
    rows = [json.loads(x) for x in (tmp_path / "res" / "acc.answers.jsonl").read_text()
            .splitlines()]
    assert len(rows) == 22 and sum(r["failed"] for r in rows) == 6
    assert all(r["error"] for r in rows if r["failed"])


def test_one_target_sample_and_table(tmp_path: Path) -> None:
    plan = {f"x{i}": "right" for i in range(30)}
    ds = write_prompts(tmp_path / "prompts.jsonl", plan)
    with fake_in_thread(plan=plan) as a:
        code, out, err = invoke("--target", f"solo={a.url}", "--dataset", str(ds), "--n", "12",
                                "--seed", "4", "--json")
        assert code == 0, err
        doc = json.loads(out)
        assert doc["paired"] is None and doc["comparisons"] == []
        assert doc["dataset"]["n"] == 12 and doc["dataset"]["sampled"] is True
        assert doc["targets"]["solo"]["accuracy"] == 1.0
        assert len(a.bodies) == 12
        code, out, err = invoke("--target", f"solo={a.url}", "--target", f"two={a.url}",
                                "--dataset", str(ds))
        assert code == 0, err
        assert "Accuracy on" in out and "100.00%" in out and "Paired against solo" in out
