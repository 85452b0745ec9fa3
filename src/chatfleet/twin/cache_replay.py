"""`chatfleet cache`'s replay: a multi-turn trace through the twin's scheduler, in virtual time.

The engine is the twin's (`core/engine/build.build_scheduler`, the recipe the twin and the
simserver share) with the configuration's pool, eviction policy and host tier; it is driven
exactly as `twin/run.py` drives it (`add_request`, `kick`, the same `EventLoop`), so the cache
analysis and `chatfleet twin` give the same cached tokens for the same trace and pool. Each turn
is a request whose answer is the trace's (max_new_tokens = its length). The bookkeeping the
engine does not do (the unbounded pool, the working set, the sessions' next turns) is
`core/cache/replay.ReplayLedger`'s, told what the scheduler did after every step.

When a turn is sent: at its trace time (a session's next turn not before its previous one
finished), or, given a `MultiturnConfig` (the shape of SGLang's bench_multiturn.py,
core/cache/multiturn.py), when that benchmark's request loop (`MultiturnSender`) sends it: the
replay wakes the loop when it asks to look at its queue, and tells it of every finish and
every client's next round.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Sequence

from chatfleet.core.cache.multiturn import MultiturnConfig, MultiturnSender
from chatfleet.core.cache.replay import CacheConfig, ReplayLedger, ReplayResult
from chatfleet.core.cache.trace import Turn
from chatfleet.core.engine.build import EngineSpec, build_scheduler
from chatfleet.core.engine.kv_pool import KVPool
from chatfleet.core.engine.protocol import EngineModel
from chatfleet.core.engine.radix import RadixCache
from chatfleet.core.engine.request import EngineRequest
from chatfleet.core.engine.scheduler import Scheduler
from chatfleet.core.engine.step import Step
from chatfleet.twin.events import StepKey, add_request, kick
from chatfleet.twin.loop import Event, EventLoop


class Replay:
    """One trace through one cache configuration on `engine`'s GPU, model and precision. Use
    `run`."""

    def __init__(self, trace: Sequence[Turn], cfg: CacheConfig, engine: EngineSpec,
                 multiturn: MultiturnConfig | None = None, seed: int = 1) -> None:
        self.ledger = ReplayLedger(trace, cfg)
        self.trace = self.ledger.trace
        self.scheduler: Scheduler = build_scheduler(cfg.engine_spec(engine))
        self.loop = EventLoop()
        self.sender = (None if multiturn is None else
                       MultiturnSender(multiturn, self.ledger.first_turns, random.Random(seed)))
        self._scheds: list[EngineModel] = [self.scheduler]
        self._step_gen = [0]
        self._look_gen = 0
        self._seen: Step | None = None

    @property
    def tree(self) -> RadixCache:
        return self.scheduler.tree

    @property
    def pool(self) -> KVPool:
        return self.scheduler.pool

    def run(self) -> ReplayResult:
        if self.sender is None:
            self.loop.push(self.loop.at(self.trace[i].time, self.arrive, i)
                           for i in self.ledger.first_turns)
        else:
            self.loop.push(self._next_look())
        self.loop.run()
        sched = self.scheduler
        if sched.has_work() or sched.in_flight is not None:
            raise RuntimeError("the replay's event loop stopped with work left")
        return self.ledger.result(sched.tree.num_evicted_tokens,
                                  sched.tree.num_loaded_back_tokens, sched.num_retractions)

    # --- handlers (each returns the events it creates) -----------------------------------
    def arrive(self, i: int, now: float) -> Iterable[Event]:
        t = self.trace[i]
        self.ledger.arrive(i, now)
        if self.scheduler.check_request(t.prompt_len, t.output_len) is not None:
            return self._send(self.ledger.refused(i, now), now)
        req = EngineRequest(f"t{i}", t.prompt, t.output, t.output_len, tag=i)
        out = add_request(self.loop, self._scheds, self._step_gen, 0, req, now, math.inf,
                          self.step_end)
        self._observe(now)
        return out

    def step_end(self, key: StepKey, now: float) -> Iterable[Event]:
        _, gen = key
        if gen != self._step_gen[0]:
            return []  # a decode run that was cut short since
        step = self.scheduler.in_flight
        res = self.scheduler.complete(now)
        if step is not None and step.kind == "prefill":
            for req, _ in step.batch:
                if req.state != "aborted":
                    self.ledger.computed(req.fill[: req.num_computed], now)
        out: list[Event] = []
        for req in res.finished:
            assert req.first_token_time is not None
            out.extend(self._send(self.ledger.finished(req.tag, now, req.first_token_time),
                                  now))
        out.extend(kick(self.loop, self._scheds, self._step_gen, 0, now, math.inf,
                        self.step_end))
        self._observe(now)
        return out

    def look(self, gen: int, now: float) -> Iterable[Event]:
        """The request loop looks at its queue (a look since superseded does nothing)."""
        if gen != self._look_gen or self.sender is None:
            return []
        out: list[Event] = []
        for i in self.sender.look(now):
            out.extend(self.arrive(i, now))
        return [*out, *self._next_look()]

    def _send(self, nxt: tuple[int, float] | None, now: float) -> list[Event]:
        """A turn finished or was refused; `nxt`: the session's next turn and its trace time."""
        if self.sender is None:
            if nxt is None:
                return []
            i, time = nxt
            return [self.loop.at(time, self.arrive, i)]
        self.sender.done(now)
        if nxt is not None:
            self.sender.release(nxt[0], now)
        return self._next_look()

    def _next_look(self) -> list[Event]:
        assert self.sender is not None
        t = self.sender.next_look()
        if t is None:
            return []
        self._look_gen += 1
        return [self.loop.at(t, self.look, self._look_gen)]

    def _observe(self, now: float) -> None:
        """Tell the ledger about the step the scheduler just chose: the turns it admits for
        the first time, or, for a decode step, the turns it left waiting for room."""
        step = self.scheduler.in_flight
        if step is None or step is self._seen:
            return
        self._seen = step
        if step.kind == "prefill":
            for req, _ in step.batch:
                if not self.ledger.is_admitted(req.tag):
                    self.ledger.admitted(req.tag, now, req.num_cached_tokens,
                                         req.num_loaded_back_tokens)
        else:
            for req in self.scheduler.waiting:
                self.ledger.waited(req.tag)


def replay(trace: Sequence[Turn], cfg: CacheConfig, engine: EngineSpec,
           multiturn: MultiturnConfig | None = None, seed: int = 1) -> ReplayResult:
    """`trace` through `cfg` on `engine`; with `multiturn`, sent by bench_multiturn.py's request
    loop (its Poisson gaps and random queue drawn from `seed`) instead of at the trace's times."""
    return Replay(trace, cfg, engine, multiturn, seed).run()
