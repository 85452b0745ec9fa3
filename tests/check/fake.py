"""A tiny OpenAI-shaped server whose answers the accuracy tests script by question."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from chatfleet.http.threads import running_in_thread

# question -> behaviour: "right", "wrong", "500", "slow", "empty", "think"
PLAN = {f"q{i}": "right" for i in range(6)} | {"q6": "wrong", "q7": "500", "q8": "slow",
                                               "q9": "empty", "q10": "think"}
ANSWERS = {f"q{i}": str(10 + i) for i in range(11)}


def write_prompts(path: Path, plan: dict[str, str] = PLAN) -> Path:
    path.write_text("".join(json.dumps({"prompt": q, "answer": ANSWERS.get(q, "1")}) + "\n"
                            for q in plan))
    return path


@dataclass
class Fake:
    plan: dict[str, str] = field(default_factory=lambda: dict(PLAN))
    delay_s: float = 0.0
    slow_s: float = 5.0
    url: str = ""
    bodies: list[dict[str, Any]] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0
    runner: web.AppRunner | None = None

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            q = body["messages"][-1]["content"]
            how = self.plan.get(q, "right")
            await asyncio.sleep(self.slow_s if how == "slow" else self.delay_s)
            if how == "500":
                return web.json_response({"error": {"message": "boom"}}, status=500)
            if how == "empty":
                return web.json_response({"id": "x", "choices": []})
            answer = ANSWERS.get(q, "1")
            text = {"right": f"Thinking. The answer is {answer}.",
                    "slow": f"The answer is {answer}.",
                    "wrong": "The answer is 7.",
                    "think": f"<think>The answer is 7.</think>\n\nThe answer is {answer}."}[how]
            return web.json_response({
                "id": "x", "object": "chat.completion",
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": text}}],
                "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}})
        finally:
            self.in_flight -= 1

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fake-model"}]})

    async def start(self) -> Fake:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/v1/models", self.models)
        self.runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1.0)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def close(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


@contextmanager
def fake_in_thread(**kw: Any) -> Iterator[Fake]:
    fake = Fake(**kw)
    with running_in_thread(fake.start, name="fake-openai") as srv:
        yield srv
