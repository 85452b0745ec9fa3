"""The simserver's oracle mode: the documented per-question draw, deterministic and independent."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import requests
from typer.testing import CliRunner

from chatfleet.check.gsm8k import gsm8k_answer, load_gsm8k
from chatfleet.core.accuracy import GSM8K_SUFFIX, parse_number
from chatfleet.simserver.oracle import oracle_draw
from tests.check.conftest import GSM8K_TEST, oracle

pytestmark = pytest.mark.timeout(120)
HTTP_TIMEOUT = 30


def draw(seed: int, i: int, p: float) -> bool:
    """The rule docs/accuracy.md states, written out again: correct iff the first draw < p."""
    return random.Random(f"{seed}:{i}").random() < p


def test_draw_follows_the_documented_rule() -> None:
    rows = load_gsm8k(GSM8K_TEST)
    for i in range(0, 1319, 7):
        expected = gsm8k_answer(rows[i]["answer"])
        assert expected is not None
        correct, stated = oracle_draw(3, i, 0.7, expected)
        assert correct == draw(3, i, 0.7)
        assert oracle_draw(3, i, 0.7, expected) == (correct, stated)  # the same twice
        if correct:
            assert stated == expected
        else:
            num = parse_number(stated)
            assert num is not None and num != parse_number(expected)
            assert 1 <= num - parse_number(expected) <= 9  # type: ignore[operator]
    assert oracle_draw(1, 0, 0.5, "Paris") in ((True, "Paris"), (False, "not Paris"))
    assert all(oracle_draw(s, i, 1.0, "4")[0] for s in range(3) for i in range(50))
    assert not any(oracle_draw(s, i, 0.0, "4")[0] for s in range(3) for i in range(50))


def test_two_seeds_draw_independently() -> None:
    a = [draw(1, i, 0.9) for i in range(1319)]
    b = [draw(2, i, 0.9) for i in range(1319)]
    agree = sum(x == y for x, y in zip(a, b, strict=True)) / 1319
    # independent draws agree with probability 0.9^2 + 0.1^2 = 0.82 (sd about 0.011)
    assert agree == pytest.approx(0.82, abs=0.045)
    assert a != b


def chat(url: str, content: str, **kw: object) -> dict:
    body = {"messages": [{"role": "user", "content": content}], "temperature": 0,
            "max_tokens": 64, **kw}
    r = requests.post(url + "/v1/chat/completions", json=body, timeout=HTTP_TIMEOUT)
    assert r.status_code == 200, r.text
    return r.json()


def test_oracle_server_answers_by_the_draw(tmp_path: Path) -> None:
    rows = load_gsm8k(GSM8K_TEST)[:40]
    ds = tmp_path / "gsm8k40.jsonl"
    ds.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with oracle(ds, 0.6, seed=9) as srv:
        url = srv.urls[0]
        for i, row in enumerate(rows):
            want = gsm8k_answer(row["answer"])
            assert want is not None
            first = chat(url, row["question"] + GSM8K_SUFFIX)["choices"][0]["message"]["content"]
            assert first.endswith(".") and "The answer is " in first
            stated = first.rsplit("The answer is ", 1)[1].rstrip(".")
            assert (stated == want) == draw(9, i, 0.6)
            if i % 5 == 0:  # the same answer again, verbatim question, and with thinking on
                again = chat(url, row["question"])["choices"][0]["message"]
                assert again["content"] == first
                msg = chat(url, "Please help. " + row["question"] + " Thanks.",
                           chat_template_kwargs={"enable_thinking": True})
                assert msg["choices"][0]["message"]["content"] == first
                assert msg["choices"][0]["message"].get("reasoning_content")
        # a question of no dataset gets the usual filler answer
        other = chat(url, "What is the capital of France?")["choices"][0]["message"]["content"]
        assert "The answer is" not in other
        # a short max_tokens cuts the answer
        cut = chat(url, rows[0]["question"], max_tokens=3)["choices"][0]
        assert cut["finish_reason"] == "length"
        # /v1/completions: the prompt text contains the question
        r = requests.post(url + "/v1/completions", json={
            "prompt": "Q: " + rows[1]["question"] + "\nA:", "max_tokens": 64},
            timeout=HTTP_TIMEOUT).json()
        assert "The answer is" in r["choices"][0]["text"]


def test_oracle_prompts_file_with_text_answers(tmp_path: Path) -> None:
    ds = tmp_path / "prompts.jsonl"
    ds.write_text('{"prompt": "Capital of France? One word.", "answer": "Paris"}\n'
                  '{"prompt": "Two plus two?", "answer": 4}\n')
    with oracle(ds, 1.0, seed=0) as srv:
        got = chat(srv.urls[0], "Capital of France? One word.")["choices"][0]["message"]
        assert got["content"].endswith("The answer is Paris.")
        got = chat(srv.urls[0], "Two plus two?")["choices"][0]["message"]
        assert got["content"].endswith("The answer is 4.")


def test_simserver_cli_rejects_bad_oracle_options(tmp_path: Path) -> None:
    from chatfleet.cli import app

    runner = CliRunner()
    res = runner.invoke(app, ["simserver", "--oracle-dataset", str(GSM8K_TEST),
                              "--oracle-accuracy", "1.5"])
    assert res.exit_code == 2 and "--oracle-accuracy must lie in [0, 1]" in res.output
    res = runner.invoke(app, ["simserver", "--oracle-dataset", str(tmp_path / "none.jsonl")])
    assert res.exit_code == 2 and "no file" in res.output
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "answer": "no key"}\n')
    res = runner.invoke(app, ["simserver", "--oracle-dataset", str(bad)])
    assert res.exit_code == 2 and "####" in res.output
    assert "Traceback" not in res.output
