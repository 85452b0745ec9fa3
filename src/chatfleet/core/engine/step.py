"""What one engine step is and what it produced (the log it leaves: steplog.py): shared by the
engine models (SGLang's prefill-first scheduler and vLLM's token-budget scheduler) and the
shells that drive them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from chatfleet.core.engine.request import EngineRequest

StepKind = Literal["prefill", "decode", "mixed"]


@dataclass(slots=True)
class Step:
    """One scheduled step. SGLang's steps are `prefill` or `decode`; vLLM's are `decode`
    (decodes only), `prefill` (prefill chunks only) or `mixed` (both, under one token budget)."""

    kind: StepKind
    start: float
    duration: float
    batch: list[tuple[EngineRequest, int]] = field(default_factory=list)  # prefill: (req, extend)
    num_decode: int = 0
    num_prefill_tokens: int = 0
    num_cached_tokens: int = 0
    num_waiting: int = 0  # queue at scheduling time: what the scheduler could not admit
    # end times of consecutive decode steps run as one (see the schedulers' `schedule`)
    decode_ends: list[float] = field(default_factory=list)
    # vLLM: the requests that decode in this step (SGLang: empty, its decode batch is `running`)
    decode_reqs: list[EngineRequest] = field(default_factory=list)

    @property
    def end(self) -> float:
        return self.start + self.duration


@dataclass(slots=True)
class StepResult:
    step: Step
    first_tokens: list[EngineRequest] = field(default_factory=list)  # a prefill sampled a token
    finished: list[EngineRequest] = field(default_factory=list)
    retracted: list[EngineRequest] = field(default_factory=list)  # SGLang retracted, vLLM preempted
