"""A request as the engine model sees it."""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from chatfleet.core.engine.radix import TreeNode

ReqState = Literal["waiting", "prefilling", "running", "finished", "aborted"]


@dataclass(slots=True)
class Segment:
    """A stretch of a request's emitted tokens: the token a prefill sampled, then one token per
    decode step of the engine from `start_step` on, until `end_step` (exclusive; None while it
    still decodes). A retracted or preempted request starts a new segment when it is prefilled
    again."""

    first_token_time: float
    start_step: int
    end_step: int | None = None


@dataclass(slots=True, eq=False)
class EngineRequest:
    """`output_ids` are the tokens the request will produce, in order; its length is where it
    stops (the twin's workload or the simserver's sampler decides it; with ignore_eos it is
    max_new_tokens). Token ids only need to be consistent: the radix cache compares them."""

    rid: str
    prompt: Sequence[int]
    output_ids: Sequence[int]
    max_new_tokens: int
    priority: int = 0
    arrival_time: float = 0.0
    tag: Any = None  # owner's handle (workload spec, HTTP stream); the engine never reads it

    # --- state kept by the scheduler ---------------------------------------------------
    state: ReqState = "waiting"
    # tokens to prefill: the prompt, plus the outputs so far after a retraction
    fill: array[int] = field(default_factory=lambda: array("q"))
    num_computed: int = 0  # tokens of `fill` whose KV exists (cached prefix included)
    num_cached_tokens: int = 0  # prefix found in the cache at first admission (reported in usage)
    num_loaded_back_tokens: int = 0
    prefix_node: TreeNode | None = None  # locked radix node (SGLang)
    prefix_len: int = 0  # tokens of `fill` the locked node's path covers
    num_own_tokens: int = 0  # KV slots held outside the tree
    # tokens generated before the current decode segment (its prefill token included)
    gen_base: int = 0
    join_step: int = 0  # global decode step at which the current decode segment started
    num_retractions: int = 0
    first_token_time: float | None = None
    finish_time: float | None = None
    segments: list[Segment] = field(default_factory=list)  # its emitted tokens
    seen_by_admission: bool = False

    @property
    def prompt_len(self) -> int:
        return len(self.prompt)

    @property
    def output_len(self) -> int:
        return len(self.output_ids)

    def close_segment(self, step: int) -> None:
        """Its decoding stops before engine step `step` (finished, retracted or aborted)."""
        if self.segments and self.segments[-1].end_step is None:
            self.segments[-1].end_step = step

    def token_times(self, step_end_times: Sequence[float], num_steps: int) -> list[float]:
        """Every output token's emission time (the first included), from the end times of the
        engine's decode steps (`num_steps` of them have completed)."""
        out: list[float] = []
        for seg in self.segments:
            out.append(seg.first_token_time)
            stop = num_steps if seg.end_step is None else seg.end_step
            out.extend(step_end_times[seg.start_step:stop])
        return out
