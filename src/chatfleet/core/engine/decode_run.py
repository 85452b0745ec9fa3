"""Decode runs: consecutive decode-only steps that a virtual-time shell runs as one event.

While nothing waits to be admitted, no request finishes and the KV fits, nothing inside the
engine can change between two decode steps: the batch stays, each step's context grows by one
token per request, and so every step's cost follows from the first. The schedulers decide how
many steps a run may take (they know the first finish and the free KV); this module times the
steps. With the thermal model on, a copy of the card's thermal state steps along the run: each
step runs at the clock the previous one left, as single steps do. When the run completes,
`advance_thermal` steps the real state over the steps that were kept (a run cut short by an
arrival keeps fewer) with the same intervals, so a run leaves what single steps leave.
"""

from __future__ import annotations

from collections.abc import Callable

from chatfleet.core.engine.step import Step
from chatfleet.core.engine.steplog import ThermalFigures
from chatfleet.core.engine.thermal import ThermalState

# (batch, context tokens, sm_factor, mem_factor) -> seconds: StepTimeModel/MixedStepModel.decode_s
DecodeTime = Callable[[int, int, float, float], float]


def run_ends(decode_s: DecodeTime, batch: int, kv_tokens: int, now: float, max_steps: int,
             horizon: float, thermal: ThermalState | None,
             until: float = float("inf")) -> list[float]:
    """The end times of up to `max_steps` decode steps of `batch` requests from `now`, whose
    contexts hold `kv_tokens` (this step's token included) at the first.

    The run never takes a step that would end after `horizon` (the shell's stop time: a
    single step ending there would never complete), bar its first, and it stops at the first
    step that ends at or after `until` (where single steps would let the scheduler look
    again: vLLM's next hand-over from the API server)."""
    ends: list[float] = []
    t = now
    if thermal is None:
        for _ in range(max_steps):
            t += decode_s(batch, kv_tokens, 1.0, 1.0)
            if t > horizon and ends:
                break
            ends.append(t)
            if t >= until or t >= horizon:
                break
            kv_tokens += batch
        return ends
    ahead = thermal.copy() if max_steps > 1 else thermal
    for j in range(max_steps):
        prev = t
        t += decode_s(batch, kv_tokens, ahead.sm_factor, ahead.mem_factor)
        if t > horizon and ends:
            break
        ends.append(t)
        if t >= until or t >= horizon or j + 1 == max_steps:
            break
        kv_tokens += batch
        ahead.advance(t - prev, 1.0, "decode")
    return ends


def advance_thermal(thermal: ThermalState, step: Step, now: float,
                    prefill_share: float | None = None) -> list[ThermalFigures]:
    """Step the card's state over a completed step (ending at `now`), a decode run step by
    step, and return what each of its steps leaves for the log. The last interval ends at
    `now`, as a single step's does; the earlier ones at their recorded ends."""
    ends = step.decode_ends
    out: list[ThermalFigures] = []
    prev = step.start
    kind = step.kind
    for t in ends[:-1]:
        thermal.advance(t - prev, 1.0, kind, prefill_share)
        out.append((thermal.sm_mhz, thermal.temp_c, thermal.power_w, thermal.slowdown))
        prev = t
        kind, prefill_share = "decode", None
    thermal.advance(now - prev, 1.0, kind, prefill_share)
    out.append((thermal.sm_mhz, thermal.temp_c, thermal.power_w, thermal.slowdown))
    return out
