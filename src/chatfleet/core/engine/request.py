"""A request as the engine model sees it."""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

ReqState = Literal["waiting", "prefilling", "running", "finished", "aborted"]


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
    prefix_node: Any = None  # locked radix node
    prefix_len: int = 0  # tokens of `fill` the locked node's path covers
    num_own_tokens: int = 0  # KV slots held outside the tree
    # tokens generated before the current decode segment (its prefill token included)
    gen_base: int = 0
    join_step: int = 0  # global decode step at which the current decode segment started
    num_retractions: int = 0
    first_token_time: float | None = None
    finish_time: float | None = None
    # emitted tokens as segments: [time of the token a prefill sampled, first decode step,
    # end step (None while decoding)]
    segments: list[list[Any]] = field(default_factory=list)
    seen_by_admission: bool = False

    @property
    def prompt_len(self) -> int:
        return len(self.prompt)

    @property
    def output_len(self) -> int:
        return len(self.output_ids)
