"""The accuracy client against a scripted server: scoring, failures kept, bounded concurrency."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from chatfleet.check.accuracy import (
    AccuracyInputError,
    AnswerLog,
    AnswerRow,
    AskConfig,
    Target,
    answers_path,
    ask_all,
    load_dataset,
    parse_named_paths,
    parse_target,
    parse_targets,
)
from tests.check.fake import PLAN, Fake, write_prompts

pytestmark = pytest.mark.timeout(60)


def test_ask_all_scores_and_keeps_every_failure(tmp_path: Path) -> None:
    ds = load_dataset(write_prompts(tmp_path / "p.jsonl"))
    seen: list[AnswerRow] = []

    async def main() -> tuple[Fake, dict[str, list[AnswerRow]], dict[str, str | None]]:
        fake = await Fake().start()
        try:
            res = await ask_all([Target("t", fake.url)], ds.items,
                                AskConfig(concurrency=4, timeout_s=0.5, max_tokens=77),
                                on_row=seen.append)
        finally:
            await fake.close()
        return fake, res.rows, res.models

    fake, rows, models = asyncio.run(main())
    got = {ds.items[r.index].prompt: r for r in rows["t"]}
    assert len(rows["t"]) == len(PLAN) == len(seen)
    assert [r.index for r in rows["t"]] == list(range(len(PLAN)))  # in item order
    for q in ("q0", "q5", "q10"):
        assert got[q].correct and not got[q].failed and got[q].error is None
    assert got["q10"].output == "\n\nThe answer is 20."  # the <think> block is not scored
    assert not got["q6"].correct and not got["q6"].failed and got["q6"].extracted == "7"
    assert got["q7"].failed and got["q7"].error == "HTTP 500: boom"
    assert got["q8"].failed and got["q8"].error is not None and "timeout" in got["q8"].error
    assert got["q9"].failed and got["q9"].error == "the response holds no answer text"
    assert models == {"t": "fake-model"}
    body = fake.bodies[0]
    assert body["temperature"] == 0 and body["max_tokens"] == 77
    assert body["model"] == "fake-model" and body["stream"] is False
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert len(fake.bodies) == len(PLAN)  # no retries


def test_concurrency_is_bounded_per_target(tmp_path: Path) -> None:
    plan = {f"x{i}": "right" for i in range(40)}
    ds = load_dataset(write_prompts(tmp_path / "p.jsonl", plan))

    async def main() -> tuple[Fake, Fake]:
        a, b = await Fake(plan=plan, delay_s=0.02).start(), await Fake(plan=plan,
                                                                       delay_s=0.02).start()
        try:
            await ask_all([Target("a", a.url), Target("b", b.url)], ds.items,
                          AskConfig(concurrency=5, thinking="server"))
        finally:
            await a.close()
            await b.close()
        return a, b

    a, b = asyncio.run(main())
    for fake in (a, b):
        assert fake.max_in_flight == 5
        assert len(fake.bodies) == 40
        assert "chat_template_kwargs" not in fake.bodies[0]


def test_unreachable_target_is_an_input_error(tmp_path: Path) -> None:
    ds = load_dataset(write_prompts(tmp_path / "p.jsonl"))
    with pytest.raises(AccuracyInputError, match=r"target down \(http://127.0.0.1:9\) is "
                                                 "unreachable"):
        asyncio.run(ask_all([Target("down", "http://127.0.0.1:9")], ds.items, AskConfig()))


def test_resumed_rows_are_not_asked_again(tmp_path: Path) -> None:
    ds = load_dataset(write_prompts(tmp_path / "p.jsonl"))
    log_path = answers_path(tmp_path / "acc.json")
    assert log_path == tmp_path / "acc.answers.jsonl"

    async def run(resume: bool) -> tuple[Fake, list[AnswerRow]]:
        fake = await Fake(slow_s=0.0).start()
        log = AnswerLog(log_path, resume)
        try:
            res = await ask_all([Target("t", fake.url)], ds.items, AskConfig(),
                                done=log.previous, on_row=log.write)
        finally:
            log.close()
            await fake.close()
        return fake, res.rows["t"]

    first, rows1 = asyncio.run(run(False))
    assert len(first.bodies) == len(PLAN)
    second, rows2 = asyncio.run(run(True))
    # only the failed ones (HTTP 500 and the empty body) are asked again
    assert sorted(b["messages"][0]["content"] for b in second.bodies) == ["q7", "q9"]
    assert [r.correct for r in rows2] == [r.correct for r in rows1]
    assert len(log_path.read_text().splitlines()) == len(PLAN) + 2


def test_parse_targets_and_named_paths() -> None:
    assert parse_target("bf16=http://127.0.0.1:30000/v1/") == Target("bf16",
                                                                     "http://127.0.0.1:30000")
    assert parse_target("fp8/bf16=https://h/").name == "fp8/bf16"
    for bad in ("bf16", "=http://x", "bf16=", "a b=http://x", "a=ftp://x", "a=http://"):
        with pytest.raises(AccuracyInputError):
            parse_target(bad)
    with pytest.raises(AccuracyInputError, match="given twice"):
        parse_targets(["a=http://x", "a=http://y"])
    with pytest.raises(AccuracyInputError, match="at least one"):
        parse_targets([])
    assert parse_named_paths(["a=/tmp/x"], ["a"], "--engine-log") == {"a": Path("/tmp/x")}
    with pytest.raises(AccuracyInputError, match="no --target is named"):
        parse_named_paths(["b=/tmp/x"], ["a"], "--engine-log")
