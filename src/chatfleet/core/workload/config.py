"""What a workload is made of: the length distributions (`LengthSpec`) and the workload's
parameters (`WorkloadConfig`: shared system prompts, prompt groups, turns, think time, reasoning
share, ramp-up), with their checks (`WorkloadError`); and `SessionProfile`, what one user does,
as `chatfleet plan` and the demo describe it."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Literal

from chatfleet.core.defaults import SYSTEM_PROMPT_TOKENS
from chatfleet.core.errors import ChatfleetError
from chatfleet.core.workload.lengths import LengthSampler, uniform_bounds

LengthKind = Literal["fixed", "uniform", "sharegpt", "file"]
RangeConvention = Literal["sglang", "vllm"]
GroupDraw = Literal["round-robin", "user", "request"]
GROUP_DRAWS: tuple[GroupDraw, ...] = ("round-robin", "user", "request")


class WorkloadError(ChatfleetError):
    """A workload parameter that cannot describe real traffic."""


@dataclass(frozen=True, slots=True)
class LengthSpec:
    """How long each user message (input) and answer (output) is.

    - fixed: every request `input_len` in, `output_len` out.
    - uniform, sglang convention (bench_serving --random-range-ratio r): uniform integers in
      [max(int(len * r), 1), len].
    - uniform, vllm convention (vllm bench serve --random-range-ratio r): uniform integers in
      [floor(len * (1 - r)), ceil(len * (1 + r))].
    - sharegpt / file: (input, output) pairs drawn uniformly from `pairs` (ShareGPT-derived or a
      user's file; loaded by the shell and passed in).
    """

    kind: LengthKind = "fixed"
    input_len: int = 512
    output_len: int = 128
    range_ratio: float = 0.0
    convention: RangeConvention = "sglang"
    pairs: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        if self.kind in ("fixed", "uniform") and (self.input_len <= 0 or self.output_len <= 0):
            raise WorkloadError("input and output lengths must be positive")
        if self.kind == "uniform":
            if self.convention not in ("sglang", "vllm"):
                raise WorkloadError(f"unknown range convention {self.convention!r}")
            top_ok = self.range_ratio <= 1.0 if self.convention == "sglang" else (
                self.range_ratio < 1.0)
            if not (self.range_ratio >= 0.0 and top_ok):
                raise WorkloadError(
                    f"range ratio {self.range_ratio} is outside [0, 1] (sglang) / [0, 1) (vllm)")
        if self.kind in ("sharegpt", "file"):
            if not self.pairs:
                raise WorkloadError(f"{self.kind} lengths need at least one (input, output) pair")
            if any(i <= 0 or o <= 0 for i, o in self.pairs):
                raise WorkloadError("every length pair must be positive")

    def sampler(self) -> LengthSampler:
        """What draws the lengths, once a request (compiled: core/workload/lengths.py)."""
        return LengthSampler(self.kind, self.input_len, self.output_len, self.range_ratio,
                             self.convention, self.pairs)

    def sample(self, rng: random.Random) -> tuple[int, int]:
        return self.sampler().sample(rng)

    def max_lengths(self) -> tuple[int, int]:
        if self.kind == "fixed":
            return self.input_len, self.output_len
        if self.kind == "uniform":
            return (uniform_bounds(self.input_len, self.range_ratio, self.convention)[1],
                    uniform_bounds(self.output_len, self.range_ratio, self.convention)[1])
        return max(i for i, _ in self.pairs), max(o for _, o in self.pairs)

    def to_json(self) -> dict[str, object]:
        d: dict[str, object] = {"kind": self.kind}
        if self.kind in ("fixed", "uniform"):
            d.update(input_len=self.input_len, output_len=self.output_len)
        if self.kind == "uniform":
            d.update(range_ratio=self.range_ratio, convention=self.convention)
        if self.kind in ("sharegpt", "file"):
            ins = [i for i, _ in self.pairs]
            outs = [o for _, o in self.pairs]
            d.update(num_pairs=len(self.pairs), mean_input_len=round(sum(ins) / len(ins), 1),
                     mean_output_len=round(sum(outs) / len(outs), 1))
        return d


@dataclass(frozen=True, slots=True)
class WorkloadConfig:
    system_prompt_tokens: int = SYSTEM_PROMPT_TOKENS
    prompt_groups: int = 1
    # how a session gets its prompt group (Workload.new_session): round-robin over sessions in
    # creation order; "user": user u's sessions are all in group u mod G; "request": each
    # session draws its group uniformly from all G with its own generator (with one turn per
    # session, each request: SGLang's generated-shared-prefix workload)
    group_draw: GroupDraw = "round-robin"
    lengths: LengthSpec = field(default_factory=LengthSpec)
    turns: int = 1
    think_time_s: float = 0.0  # mean pause between a turn's last token and the next turn
    think_dist: Literal["fixed", "exp"] = "exp"
    reasoning_share: float = 0.0  # 0: thinking off; else share of each answer that is reasoning
    ignore_eos: bool = True  # the answer runs to its sampled length; max_tokens = that length
    ramp_up_s: float = 0.0  # closed loop: user i starts at i / users * ramp_up_s

    def __post_init__(self) -> None:
        if self.system_prompt_tokens < 0:
            raise WorkloadError("system prompt tokens must not be negative")
        if self.prompt_groups <= 0:
            raise WorkloadError("prompt groups must be at least 1")
        if self.group_draw not in GROUP_DRAWS:
            raise WorkloadError(f"unknown group draw {self.group_draw!r}; choose "
                                f"{', '.join(GROUP_DRAWS)}")
        if self.turns <= 0:
            raise WorkloadError("turns must be at least 1")
        if self.think_time_s < 0 or self.ramp_up_s < 0:
            raise WorkloadError("think time and ramp-up must not be negative")
        if not 0.0 <= self.reasoning_share < 1.0:
            raise WorkloadError("reasoning share must be in [0, 1)")

    def max_context_tokens(self) -> int:
        """The longest prompt plus answer a session can reach."""
        i, o = self.lengths.max_lengths()
        return self.system_prompt_tokens + self.turns * i + (self.turns - 1) * o + o

    def to_json(self) -> dict[str, object]:
        return {
            "system_prompt_tokens": self.system_prompt_tokens,
            "prompt_groups": self.prompt_groups,
            "group_draw": self.group_draw,
            "lengths": self.lengths.to_json(),
            "turns": self.turns,
            "think_time_s": self.think_time_s,
            "think_dist": self.think_dist,
            "thinking": self.reasoning_share > 0,
            "reasoning_share": self.reasoning_share,
            "ignore_eos": self.ignore_eos,
            "ramp_up_s": self.ramp_up_s,
        }


@dataclass(frozen=True, slots=True)
class SessionProfile:
    """What one user does: a session of `turns` turns of `input_len` user tokens (uniform
    within +-range_ratio, vLLM's convention) and `output_len` answer tokens, `think_time_s`
    apart, every prompt starting with the shared system prompt."""

    input_len: int = LengthSpec().input_len
    output_len: int = LengthSpec().output_len
    range_ratio: float = 0.5
    turns: int = 1
    think_time_s: float = 0.0
    system_prompt_tokens: int = SYSTEM_PROMPT_TOKENS
    prompt_groups: int = 1

    def workload(self) -> WorkloadConfig:
        return WorkloadConfig(
            system_prompt_tokens=self.system_prompt_tokens, prompt_groups=self.prompt_groups,
            lengths=LengthSpec("uniform", self.input_len, self.output_len, self.range_ratio,
                               "vllm"),
            turns=self.turns, think_time_s=self.think_time_s)

    def history_tokens(self) -> float:
        """A session's own tokens at its last turn (its history beyond the shared prompt)."""
        return float(self.turns * (self.input_len + self.output_len))
