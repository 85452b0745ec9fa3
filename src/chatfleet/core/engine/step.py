"""What one engine step is and what it produced (the log it leaves: steplog.py): shared by the
engine models (SGLang's prefill-first scheduler and vLLM's token-budget scheduler) and the
shells that drive them."""

from __future__ import annotations

from typing import Literal

from chatfleet.core.engine.request import EngineRequest

StepKind = Literal["prefill", "decode", "mixed"]


class Step:
    """One scheduled step. SGLang's steps are `prefill` or `decode`; vLLM's are `decode`
    (decodes only), `prefill` (prefill chunks only) or `mixed` (both, under one token budget).

    Step and StepResult are plain classes, not dataclasses (one of each per engine step):
    chatfleet/_native.py says why."""

    __slots__ = ("batch", "decode_ends", "duration", "end", "kind", "num_cached_tokens",
                 "num_decode", "num_prefill_tokens", "num_waiting", "start")

    def __init__(self, kind: StepKind, start: float, duration: float, *,
                 batch: list[tuple[EngineRequest, int]] | None = None, num_decode: int = 0,
                 num_prefill_tokens: int = 0, num_cached_tokens: int = 0, num_waiting: int = 0,
                 decode_ends: list[float] | None = None) -> None:
        self.kind = kind
        self.start = start
        self.duration = duration
        # stored, not start + duration: a truncated decode run ends at its last step's end to
        # the bit, which start + (end - start) may miss by one unit in the last place
        self.end = start + duration
        self.batch = [] if batch is None else batch  # prefill: (req, extend)
        self.num_decode = num_decode
        self.num_prefill_tokens = num_prefill_tokens
        self.num_cached_tokens = num_cached_tokens
        self.num_waiting = num_waiting  # queue at scheduling time: what could not be admitted
        # end times of consecutive decode steps run as one (see the schedulers' `schedule`)
        self.decode_ends = [] if decode_ends is None else decode_ends

    def __repr__(self) -> str:
        return (f"Step({self.kind!r}, start={self.start}, duration={self.duration}, "
                f"batch={len(self.batch)}, num_decode={self.num_decode}, "
                f"decode_ends={len(self.decode_ends)})")


class StepResult:
    __slots__ = ("finished", "first_tokens", "retracted", "step")

    def __init__(self, step: Step) -> None:
        self.step = step
        self.first_tokens: list[EngineRequest] = []  # a prefill sampled a token
        self.finished: list[EngineRequest] = []
        self.retracted: list[EngineRequest] = []  # SGLang retracted, vLLM preempted
