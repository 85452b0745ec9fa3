"""`chatfleet accuracy`'s shell: the dataset file, the HTTP client, the answers log, the result.

Every target gets the same questions, one chat request each (temperature 0, ``max_tokens``, no
retries), at most ``concurrency`` in flight per target, every target at once. A request that
fails (connection error, timeout, an HTTP error, a body without an answer) is recorded as
failed with its error, counts as a wrong answer and is reported in ``failed``: nothing is
dropped. Each finished answer is appended to a JSON Lines log as it comes, so an interrupted
run keeps what it finished, and ``resume`` reuses those rows. The statistics live in
:mod:`chatfleet.core.accuracy`; docs/accuracy.md describes the whole command.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import IO, Any, Literal

import aiohttp
import orjson

from chatfleet import __version__
from chatfleet.check.gsm8k import extract_model_answer, gsm8k_answer
from chatfleet.core.accuracy import (
    DIFF_METHOD,
    MCNEMAR_METHOD,
    Dataset,
    Item,
    compare,
    parse_dataset_lines,
    score_answer,
    select_indices,
    summarize_target,
)
from chatfleet.core.errors import ChatfleetError
from chatfleet.data.paths import gsm8k_test_path

SCHEMA = "chatfleet.accuracy/1"
PROBE_TIMEOUT_S = 10.0
GSM8K_ENV = "CHATFLEET_GSM8K"  # another copy of the split, instead of the one shipped
Thinking = Literal["off", "on", "server"]
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+/-]*")


class AccuracyInputError(ChatfleetError):
    """Bad input to `chatfleet accuracy` (a one-line message)."""


# --------------------------------------------------------------------------------------------
# Input
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Target:
    name: str
    url: str  # base URL, without a trailing "/" or "/v1"


def parse_target(text: str) -> Target:
    """``NAME=URL``: a name of letters, digits and ``_.+/-`` (``bf16``, ``fp8``, ``fp8/bf16``
    for weights/KV), an http(s) URL."""
    name, sep, url = text.partition("=")
    name, url = name.strip(), url.strip()
    if not sep or not name or not url:
        raise AccuracyInputError(f"--target {text!r}: expected NAME=URL, e.g. "
                                 "bf16=http://127.0.0.1:30000")
    if not _NAME_RE.fullmatch(name):
        raise AccuracyInputError(f"--target {text!r}: the name may hold letters, digits and "
                                 "_.+/- only")
    if not re.match(r"https?://[^/\s]+", url):
        raise AccuracyInputError(f"--target {text!r}: the URL must start with http:// or "
                                 "https:// and name a host")
    url = url.rstrip("/").removesuffix("/v1").rstrip("/")
    return Target(name, url)


def parse_targets(texts: Sequence[str]) -> list[Target]:
    if not texts:
        raise AccuracyInputError("give at least one --target NAME=URL")
    targets = [parse_target(t) for t in texts]
    seen: set[str] = set()
    for t in targets:
        if t.name in seen:
            raise AccuracyInputError(f"--target name {t.name!r} is given twice")
        seen.add(t.name)
    return targets


def parse_named_paths(texts: Sequence[str], names: Sequence[str], what: str) -> dict[str, Path]:
    """``NAME=PATH`` options (``--engine-log``); every NAME must be a target's."""
    out: dict[str, Path] = {}
    for text in texts:
        name, sep, path = text.partition("=")
        name, path = name.strip(), path.strip()
        if not sep or not name or not path:
            raise AccuracyInputError(f"{what} {text!r}: expected NAME=PATH")
        if name not in names:
            raise AccuracyInputError(f"{what} {text!r}: no --target is named {name!r}")
        if name in out:
            raise AccuracyInputError(f"{what}: {name!r} is given twice")
        out[name] = Path(path)
    return out


def gsm8k_split() -> Path:
    """The GSM8K test split: $CHATFLEET_GSM8K where set, else the copy shipped with chatfleet."""
    env = os.environ.get(GSM8K_ENV)
    path = Path(env) if env else gsm8k_test_path()
    if not path.is_file():
        where = f"${GSM8K_ENV} ({env})" if env else f"the package's copy ({path})"
        raise AccuracyInputError(f"the GSM8K test split is not at {where}")
    return path


def resolve_dataset(spec: str) -> tuple[str, Path]:
    """``gsm8k`` (the test split shipped with chatfleet, or $CHATFLEET_GSM8K where set) or the
    path of a GSM8K or prompts file: (name, path); the name never depends on the working
    directory."""
    if spec.strip().lower() == "gsm8k":
        try:
            return "gsm8k", gsm8k_split()
        except AccuracyInputError as exc:
            raise AccuracyInputError(f"--dataset gsm8k: {exc}; pass its path "
                                     "(--dataset PATH)") from None
    path = Path(spec)
    if not path.is_file():
        raise AccuracyInputError(f"--dataset {spec!r}: no such file (give gsm8k or the path of "
                                 "a GSM8K or prompts JSON Lines file)")
    return spec, path


def load_dataset(path: Path) -> Dataset:
    try:
        with path.open(encoding="utf-8") as f:
            return parse_dataset_lines(f, str(path), gsm8k_answer)
    except UnicodeDecodeError as exc:
        raise AccuracyInputError(f"{path}: not UTF-8 text ({exc.reason})") from None


def prompt_sha(prompt: str) -> str:
    return hashlib.sha256(prompt.encode("utf-8")).hexdigest()[:16]


# --------------------------------------------------------------------------------------------
# Asking
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AskConfig:
    concurrency: int = 16
    timeout_s: float = 600.0
    max_tokens: int = 1024
    thinking: Thinking = "off"
    model: str | None = None  # None: the first model the target's /v1/models lists


@dataclass(slots=True)
class AnswerRow:
    """One question asked of one target (a line of the answers log)."""

    target: str
    url: str
    index: int
    prompt_sha: str
    expected: str
    correct: bool
    failed: bool
    error: str | None = None
    extracted: str | None = None
    output: str | None = None
    finish_reason: str | None = None
    completion_tokens: int | None = None
    latency_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, row: Mapping[str, Any]) -> AnswerRow:
        return cls(**{f.name: row[f.name] for f in fields(cls) if f.name in row})


async def probe(session: aiohttp.ClientSession, target: Target) -> str | None:
    """GET /v1/models: the first model id (None if it lists none); unreachable, or a 404
    there (not an OpenAI-compatible server), raises."""
    status = 0
    try:
        async with session.get(target.url + "/v1/models",
                               timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S)) as resp:
            status = resp.status
            body = await resp.json(content_type=None) if status == 200 else None
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        why = str(exc) or type(exc).__name__
        raise AccuracyInputError(f"target {target.name} ({target.url}) is unreachable: "
                                 f"{why}") from None
    except ValueError:
        return None
    if status == 404:  # a wrong port or path: every question would fail
        raise AccuracyInputError(f"target {target.name} ({target.url}) answers 404 for "
                                 "/v1/models: not an OpenAI-compatible server (give its base "
                                 "URL, without /v1)")
    data = body.get("data") if isinstance(body, dict) else None
    if isinstance(data, list) and data and isinstance(data[0], dict):
        mid = data[0].get("id")
        return str(mid) if mid is not None else None
    return None


def _payload(item: Item, model: str | None, cfg: AskConfig) -> dict[str, Any]:
    body: dict[str, Any] = {"messages": [{"role": "user", "content": item.prompt}],
                            "temperature": 0, "max_tokens": cfg.max_tokens, "stream": False}
    if model is not None:
        body["model"] = model
    if cfg.thinking != "server":
        body["chat_template_kwargs"] = {"enable_thinking": cfg.thinking == "on"}
    return body


def answer_text(body: Any) -> tuple[str | None, str | None, int | None]:
    """(content without any <think> block, finish_reason, completion tokens) of a response."""
    if not isinstance(body, dict):
        return None, None, None
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None, None, None
    choice = choices[0]
    msg = choice.get("message")
    content = msg.get("content") if isinstance(msg, dict) else choice.get("text")
    if not isinstance(content, str):
        content = None
    elif "</think>" in content:
        content = content.rsplit("</think>", 1)[1]
    usage = body.get("usage")
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    reason = choice.get("finish_reason")
    return (content, str(reason) if reason is not None else None,
            int(tokens) if isinstance(tokens, int) else None)


async def ask_one(session: aiohttp.ClientSession, target: Target, model: str | None,
                  item: Item, cfg: AskConfig) -> AnswerRow:
    row = AnswerRow(target.name, target.url, item.index, prompt_sha(item.prompt), item.expected,
                    correct=False, failed=True)
    t0 = time.monotonic()
    try:
        async with session.post(target.url + "/v1/chat/completions",
                                json=_payload(item, model, cfg),
                                timeout=aiohttp.ClientTimeout(total=cfg.timeout_s)) as resp:
            raw = await resp.read()
            status = resp.status
    except TimeoutError:
        row.error = f"timeout after {cfg.timeout_s:g} s"
        return row
    except (aiohttp.ClientError, OSError) as exc:
        row.error = f"{type(exc).__name__}: {exc}"
        return row
    finally:
        row.latency_s = time.monotonic() - t0
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        body = None
    if status != 200:
        msg = body.get("error") if isinstance(body, dict) else None
        if isinstance(msg, dict):
            msg = msg.get("message")
        row.error = f"HTTP {status}: {msg or raw[:200].decode('utf-8', 'replace')}"
        return row
    content, reason, tokens = answer_text(body)
    row.finish_reason, row.completion_tokens = reason, tokens
    if content is None:
        row.error = "the response holds no answer text"
        return row
    score = score_answer(item.expected, content, extract_model_answer)
    row.failed = False
    row.correct, row.extracted, row.output = score.correct, score.extracted, content
    return row


async def ask_all(targets: Sequence[Target], items: Sequence[Item], cfg: AskConfig, *,
                  done: Mapping[tuple[str, int], AnswerRow] | None = None,
                  on_start: Callable[[], None] | None = None,
                  on_row: Callable[[AnswerRow], None] | None = None) -> AskResult:
    """Ask every target every item; ``done`` rows (resumed) are reused, not asked again.
    Every target is probed first (``/v1/models``): an unreachable one raises
    :class:`AccuracyInputError` before any question is asked. ``on_start`` is called after the
    probes, ``on_row`` after each answer (not for reused rows)."""
    done = done or {}
    connector = aiohttp.TCPConnector(limit=cfg.concurrency * len(targets) + len(targets))
    async with aiohttp.ClientSession(connector=connector) as session:
        found: dict[str, str | None] = {}
        for t in targets:
            model = await probe(session, t)
            found[t.name] = cfg.model or model
        if on_start is not None:
            on_start()
        results: dict[str, list[AnswerRow | None]] = {t.name: [None] * len(items)
                                                      for t in targets}

        async def worker(t: Target, queue: asyncio.Queue[tuple[int, Item]]) -> None:
            while True:
                try:
                    pos, item = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                row = await ask_one(session, t, found[t.name], item, cfg)
                results[t.name][pos] = row
                if on_row is not None:
                    on_row(row)

        tasks = []
        for t in targets:
            queue: asyncio.Queue[tuple[int, Item]] = asyncio.Queue()
            for pos, item in enumerate(items):
                old = done.get((t.name, item.index))
                if old is not None and old.prompt_sha == prompt_sha(item.prompt) \
                        and not old.failed:
                    results[t.name][pos] = old
                else:
                    queue.put_nowait((pos, item))
            tasks += [asyncio.create_task(worker(t, queue)) for _ in range(cfg.concurrency)]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
    out: dict[str, list[AnswerRow]] = {}
    for name, rows in results.items():
        assert all(r is not None for r in rows)
        out[name] = [r for r in rows if r is not None]
    return AskResult(out, found)


@dataclass(frozen=True, slots=True)
class AskResult:
    rows: dict[str, list[AnswerRow]]  # each target's answers, in the order of the items
    models: dict[str, str | None]  # the model name sent to each target


# --------------------------------------------------------------------------------------------
# The answers log and the result
# --------------------------------------------------------------------------------------------


def answers_path(out: Path) -> Path:
    """Where the per-question log of ``--out FILE`` goes: FILE's name with .answers.jsonl."""
    return out.with_name(out.stem + ".answers.jsonl") if out.suffix else \
        out.with_name(out.name + ".answers.jsonl")


class AnswerLog:
    """Appends one JSON line per finished answer, flushed at once."""

    def __init__(self, path: Path, resume: bool) -> None:
        self.path = path
        self.previous: dict[tuple[str, int], AnswerRow] = {}
        if resume and path.exists():
            for line in path.read_text(encoding="utf-8").splitlines():
                try:
                    row = AnswerRow.from_json(orjson.loads(line))
                except (orjson.JSONDecodeError, TypeError, KeyError):
                    continue  # a torn last line of an interrupted run
                if not row.failed:
                    self.previous[(row.target, row.index)] = row
        path.parent.mkdir(parents=True, exist_ok=True)
        self._f: IO[bytes] = path.open("ab" if resume else "wb")

    def write(self, row: AnswerRow) -> None:
        self._f.write(orjson.dumps(row.to_json()) + b"\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def build_result(*, dataset_name: str, dataset: Dataset, indices: Sequence[int], seed: int,
                 margin: float, targets: Sequence[Target], rows: Mapping[str, Sequence[AnswerRow]],
                 cfg: AskConfig, engine_logs: Mapping[str, dict[str, Any] | None] | None = None,
                 models: Mapping[str, str | None] | None = None) -> dict[str, Any]:
    """The result document (schema ``chatfleet.accuracy/1``, docs/accuracy.md)."""
    engine_logs = engine_logs or {}
    outcomes = {t.name: [r.correct and not r.failed for r in rows[t.name]] for t in targets}
    doc_targets: dict[str, Any] = {}
    for t in targets:
        summary = summarize_target(outcomes[t.name], sum(1 for r in rows[t.name] if r.failed))
        summary["url"] = t.url
        summary["model"] = (models or {}).get(t.name)
        summary["engine_log"] = engine_logs.get(t.name)
        doc_targets[t.name] = summary
    ref = targets[0].name
    comparisons = [compare(ref, outcomes[ref], t.name, outcomes[t.name], margin)
                   for t in targets[1:]]
    return {
        "schema": SCHEMA,
        "chatfleet_version": __version__,
        "dataset": {"name": dataset_name, "kind": dataset.kind, "path": dataset.source,
                    "n": len(indices), "total": len(dataset.items), "seed": seed,
                    "sampled": len(indices) < len(dataset.items)},
        "request": {"temperature": 0, "max_tokens": cfg.max_tokens, "thinking": cfg.thinking,
                    "concurrency": cfg.concurrency, "timeout_s": cfg.timeout_s,
                    "retries": 0},
        "margin": margin,
        "reference": ref,
        "methods": {"ci95": "wilson", "mcnemar": MCNEMAR_METHOD, "diff": DIFF_METHOD},
        "targets": doc_targets,
        "paired": comparisons[0] if comparisons else None,
        "comparisons": comparisons,
    }


def sample(dataset: Dataset, n: int | None, seed: int) -> list[Item]:
    """The questions to ask: all, or ``n`` drawn with ``random.Random(seed)``."""
    return [dataset.items[i] for i in select_indices(len(dataset.items), n, random.Random(seed))]
