"""Drawing a request's lengths, the part of `LengthSpec` that runs once a request: compiled with
the workload (chatfleet/_native.py), where config.py, whose frozen dataclasses travel to worker
processes by pickle, runs interpreted. `LengthSpec.sampler()` makes one."""

from __future__ import annotations

import math
import random


def uniform_bounds(n: int, range_ratio: float, convention: str) -> tuple[int, int]:
    """The closed range of a uniform length around `n` (LengthSpec's docstring: the two
    benchmarks' conventions)."""
    if convention == "sglang":
        return max(int(n * range_ratio), 1), n
    return max(1, math.floor(n * (1 - range_ratio))), math.ceil(n * (1 + range_ratio))


class LengthSampler:
    """(input, output) lengths drawn from a generator: fixed ones draw nothing, uniform ones
    one `random()` each (input first), pairs one `randrange`."""

    __slots__ = ("_in_hi", "_in_lo", "_kind", "_out_hi", "_out_lo", "_pairs")

    def __init__(self, kind: str, input_len: int, output_len: int, range_ratio: float,
                 convention: str, pairs: tuple[tuple[int, int], ...]) -> None:
        self._kind = kind
        self._in_lo, self._in_hi = input_len, input_len
        self._out_lo, self._out_hi = output_len, output_len
        if kind == "uniform":
            self._in_lo, self._in_hi = uniform_bounds(input_len, range_ratio, convention)
            self._out_lo, self._out_hi = uniform_bounds(output_len, range_ratio, convention)
        self._pairs = pairs

    def sample(self, rng: random.Random) -> tuple[int, int]:
        if self._kind == "fixed":
            return self._in_lo, self._out_lo
        if self._kind == "uniform":
            i = self._in_lo + int(rng.random() * (self._in_hi - self._in_lo + 1))
            o = self._out_lo + int(rng.random() * (self._out_hi - self._out_lo + 1))
            return i, o
        return self._pairs[rng.randrange(len(self._pairs))]
