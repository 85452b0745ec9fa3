"""What one engine step is, what it produced, and the log row it leaves: shared by the engine
models (SGLang's prefill-first scheduler and vLLM's token-budget scheduler) and the shells that
drive them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, NamedTuple

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


class StepRow(NamedTuple):
    """One log row per step, as the engines log them (SGLang per batch, vLLM per engine step;
    a decode run leaves one row per step it ran). A tuple, so that appending one per step stays
    cheap; readers unpack it or read it by name."""

    time: float  # the step's end
    kind: StepKind
    batch: int  # requests in the step (SGLang prefill: its batch; decode: the running batch)
    prefill_tokens: int
    decode_tokens: int
    running: int  # running requests as the step leaves the engine
    queue: int  # waiting requests when the step was scheduled
    token_usage: float
    cache_hit_rate: float  # prompt tokens found in the prefix cache, since the start
    sm_clock_mhz: float | None  # the thermal model's figures (None: the model is off)
    temp_c: float | None
    power_w: float | None
    thermal_slowdown: bool
    step_s: float  # the step's duration


LOG_FIELDS = StepRow._fields
