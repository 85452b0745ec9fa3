"""Run one or more simulated replicas in one process, each on its own port."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from chatfleet.core.engine.build import EngineSpec
from chatfleet.core.errors import ChatfleetError
from chatfleet.data.tokenizer import load_qwen_tokenizer
from chatfleet.http.log import quiet_bad_requests
from chatfleet.http.threads import running_in_thread
from chatfleet.simserver.app import ReplicaApp
from chatfleet.simserver.generation import AnswerMaker
from chatfleet.simserver.oracle import Oracle
from chatfleet.simserver.replica import Replica, TraceWriter

GC_GEN0_THRESHOLD = 20_000


@dataclass(frozen=True, slots=True)
class ServerConfig:
    spec: EngineSpec
    host: str = "127.0.0.1"
    port: int = 0  # 0: any free port; with several replicas, port + i unless 0
    replicas: int = 1
    time_scale: float = 1.0
    seed: int = 0
    trace: Path | None = None
    served_model_name: str = "qwen3-8b"
    answer_median_tokens: float = 200.0
    # oracle mode (docs/accuracy.md): answer this dataset's questions right with this probability,
    # drawn per question from `seed` (the same for every replica of the server)
    oracle_dataset: Path | None = None
    oracle_accuracy: float = 1.0


@dataclass(slots=True)
class RunningServer:
    replicas: list[Replica] = field(default_factory=list)
    runners: list[web.AppRunner] = field(default_factory=list)
    urls: list[str] = field(default_factory=list)
    trace: TraceWriter | None = None

    async def close(self) -> None:
        for rep in self.replicas:
            await rep.stop()
        for runner in self.runners:
            await runner.cleanup()
        if self.trace is not None:
            self.trace.close()


async def start(cfg: ServerConfig) -> RunningServer:
    if cfg.replicas < 1:
        raise ChatfleetError("replicas must be at least 1")
    # a full collection in the middle of a step's write burst delays every stream behind it:
    # collect young objects less often (the server's garbage is short-lived request state)
    gc.set_threshold(GC_GEN0_THRESHOLD, 20, 20)
    quiet_bad_requests()
    tok = load_qwen_tokenizer()
    answers = AnswerMaker(tok, median_tokens=cfg.answer_median_tokens)
    oracle = (Oracle.load(cfg.oracle_dataset, cfg.oracle_accuracy, cfg.seed)
              if cfg.oracle_dataset is not None else None)
    trace = TraceWriter(cfg.trace) if cfg.trace is not None else None
    srv = RunningServer(trace=trace)
    try:
        for i in range(cfg.replicas):
            rep = Replica(f"replica-{i}", cfg.spec, time_scale=cfg.time_scale, seed=cfg.seed + i,
                          trace=trace, served_model_name=cfg.served_model_name)
            app = ReplicaApp(rep, tok, answers, oracle).app
            runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
            await runner.setup()
            port = cfg.port + i if cfg.port else 0
            site = web.TCPSite(runner, cfg.host, port, reuse_address=True)
            await site.start()
            srv.runners.append(runner)
            sock = site._server.sockets[0]  # type: ignore[union-attr]
            bound = sock.getsockname()[1]
            srv.urls.append(f"http://{cfg.host}:{bound}")
            rep.start()
            srv.replicas.append(rep)
    except BaseException:
        await srv.close()
        raise
    return srv


@contextlib.contextmanager
def serve_in_thread(cfg: ServerConfig) -> Iterator[RunningServer]:
    """Run the simserver on its own event loop in a background thread (tests, benchmarks)."""
    with running_in_thread(lambda: start(cfg), name="simserver") as srv:
        yield srv
