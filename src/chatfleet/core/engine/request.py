"""A request as the engine model sees it."""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from chatfleet.core.engine.tree_node import TreeNode

ReqState = Literal["waiting", "prefilling", "running", "finished", "aborted"]


def as_tokens(tokens: Sequence[int]) -> array[int]:
    """Token ids as array('q') (int64: slices and comparisons run in C, memcmp-like), the form
    the engines keep a request's tokens in and the radix cache compares. An array('q') is
    returned as it is: pass arrays to skip this copy."""
    if type(tokens) is array and tokens.typecode == "q":
        return tokens
    return array("q", tokens)


# Segment and EngineRequest are plain classes, not dataclasses: chatfleet/_native.py says why
# (the twin makes one a request).


class Segment:
    """A stretch of a request's emitted tokens: the token a prefill sampled, then one token per
    decode step of the engine from `start_step` on, until `end_step` (exclusive; None while it
    still decodes). A retracted or preempted request starts a new segment when it is prefilled
    again."""

    __slots__ = ("end_step", "first_token_time", "start_step")

    def __init__(self, first_token_time: float, start_step: int,
                 end_step: int | None = None) -> None:
        self.first_token_time = first_token_time
        self.start_step = start_step
        self.end_step = end_step

    def __repr__(self) -> str:
        return f"Segment({self.first_token_time}, {self.start_step}, {self.end_step})"


class EngineRequest:
    """`output_ids` are the tokens the request will produce, in order; its length is where it
    stops (the twin's workload or the simserver's sampler decides it; with ignore_eos it is
    max_new_tokens). Token ids only need to be consistent: the radix cache compares them.
    Compared by identity."""

    __slots__ = ("arrival_time", "fill", "finish_time", "first_token_time", "gen_base",
                 "join_step", "max_new_tokens", "num_cached_tokens", "num_computed",
                 "num_loaded_back_tokens", "num_own_tokens", "num_retractions", "output_ids",
                 "prefix_len", "prefix_node", "priority", "prompt", "rid", "seen_by_admission",
                 "segments", "state", "tag")

    def __init__(self, rid: str, prompt: Sequence[int], output_ids: Sequence[int],
                 max_new_tokens: int, priority: int = 0, arrival_time: float = 0.0,
                 tag: Any = None) -> None:
        self.rid = rid
        self.prompt = prompt
        self.output_ids = output_ids
        self.max_new_tokens = max_new_tokens
        self.priority = priority
        self.arrival_time = arrival_time
        self.tag = tag  # owner's handle (workload spec, HTTP stream); the engine never reads it

        # --- state kept by the scheduler -----------------------------------------------
        self.state: ReqState = "waiting"
        # tokens to prefill: the prompt, plus the outputs so far after a retraction
        self.fill: array[int] = array("q")
        self.num_computed = 0  # tokens of `fill` whose KV exists (cached prefix included)
        # prefix found in the cache at first admission (reported in usage)
        self.num_cached_tokens = 0
        self.num_loaded_back_tokens = 0
        self.prefix_node: TreeNode | None = None  # locked radix node (SGLang)
        self.prefix_len = 0  # tokens of `fill` the locked node's path covers
        self.num_own_tokens = 0  # KV slots held outside the tree
        # tokens generated before the current decode segment (its prefill token included)
        self.gen_base = 0
        self.join_step = 0  # global decode step at which the current decode segment started
        self.num_retractions = 0
        self.first_token_time: float | None = None
        self.finish_time: float | None = None
        self.segments: list[Segment] = []  # its emitted tokens
        self.seen_by_admission = False

    def __repr__(self) -> str:
        return (f"EngineRequest({self.rid!r}, prompt={len(self.prompt)}, "
                f"output={len(self.output_ids)}, state={self.state!r})")

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

    def token_times(self, step_end_times: array[float], num_steps: int) -> array[float]:
        """Every output token's emission time (the first included), from the end times of the
        engine's decode steps (`num_steps` of them have completed), as array('d'): a slice of
        the steps' array is one copy of bytes, and a point's figures read every request's
        times as one buffer (a list's floats are read one by one)."""
        out = array("d")
        for seg in self.segments:
            out.append(seg.first_token_time)
            stop = num_steps if seg.end_step is None else seg.end_step
            out.extend(step_end_times[seg.start_step:stop])
        return out
