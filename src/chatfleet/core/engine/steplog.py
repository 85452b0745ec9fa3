"""The engine's step log: one entry per step, as the engines log them (SGLang per batch, vLLM
per engine step; a decode run leaves one entry per step it ran). Shared by both engine models.

The log is kept by column (lists of numbers), so that a decode run appends its steps at once
and a shell reads a window of it as numpy arrays (`floats`, `ints`). Lists, not `array`s: the
compiled engine (chatfleet/_native.py) appends to a list natively, where an array's append is
a method call through the interpreter, about 25 times the cost; a float column holds 8 bytes
of pointer plus its float per step. `StepRow` is one entry, read by name.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from typing import NamedTuple, overload

import numpy as np
import numpy.typing as npt

from chatfleet.core.engine.step import StepKind

KINDS: tuple[StepKind, ...] = ("prefill", "decode", "mixed")  # `kind` column: index here
KIND_CODES: dict[str, int] = {k: i for i, k in enumerate(KINDS)}

# what a step's entry reads from the thermal state once the step ran (clock, temperature,
# power, throttled); None for the first three when the thermal model is off
ThermalFigures = tuple[float | None, float | None, float | None, bool]
NO_THERMAL: ThermalFigures = (None, None, None, False)


class StepRow(NamedTuple):
    """One step of the log."""

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
_FLOAT_COLUMNS = ("time", "token_usage", "cache_hit_rate", "sm_clock_mhz", "temp_c", "power_w",
                  "step_s")


def _figure(value: float) -> float | None:
    return None if math.isnan(value) else value


class StepLog(Sequence[StepRow]):
    __slots__ = LOG_FIELDS

    def __init__(self, rows: Sequence[StepRow] = ()) -> None:
        self.time: list[float] = []
        self.kind: list[int] = []
        self.batch: list[int] = []
        self.prefill_tokens: list[int] = []
        self.decode_tokens: list[int] = []
        self.running: list[int] = []
        self.queue: list[int] = []
        self.token_usage: list[float] = []
        self.cache_hit_rate: list[float] = []
        self.sm_clock_mhz: list[float] = []  # NaN: the thermal model is off
        self.temp_c: list[float] = []
        self.power_w: list[float] = []
        self.thermal_slowdown: list[int] = []
        self.step_s: list[float] = []
        for row in rows:
            self.add(row.time, row.kind, row.batch, row.prefill_tokens, row.decode_tokens,
                     row.running, row.queue, row.token_usage, row.cache_hit_rate,
                     (row.sm_clock_mhz, row.temp_c, row.power_w, row.thermal_slowdown),
                     row.step_s)

    def add(self, t: float, kind: StepKind, batch: int, prefill_tokens: int,
            decode_tokens: int, running: int, queue: int, token_usage: float,
            cache_hit_rate: float, thermal: ThermalFigures, step_s: float) -> None:
        """One step. The float columns hold floats whatever number comes in (float(): an int
        stays an int in a list, as it did not in the arrays before, and compiled code turns it
        into a float at the call, so both would write it differently)."""
        sm, temp, power, slowdown = thermal
        self.time.append(float(t))
        self.kind.append(KIND_CODES[kind])
        self.batch.append(batch)
        self.prefill_tokens.append(prefill_tokens)
        self.decode_tokens.append(decode_tokens)
        self.running.append(running)
        self.queue.append(queue)
        self.token_usage.append(float(token_usage))
        self.cache_hit_rate.append(float(cache_hit_rate))
        self.sm_clock_mhz.append(math.nan if sm is None else float(sm))
        self.temp_c.append(math.nan if temp is None else float(temp))
        self.power_w.append(math.nan if power is None else float(power))
        self.thermal_slowdown.append(int(slowdown))
        self.step_s.append(float(step_s))

    def extend(self, other: StepLog) -> None:
        """Append every step of `other`."""
        for name in LOG_FIELDS:
            getattr(self, name).extend(getattr(other, name))

    def add_run(self, start: float, ends: list[float], kind: StepKind, batch: int,
                prefill_tokens: int, num_decode: int, running: int, queue: int,
                token_usage: list[float], cache_hit_rate: float,
                thermal: list[ThermalFigures]) -> None:
        """The steps of a run that began at `start`, one entry per end time: the first is
        `kind` with `batch` requests and `prefill_tokens`, the later ones decode steps of
        `num_decode` (`token_usage` and `thermal`: one per step)."""
        k = len(ends)
        self.add(ends[0], kind, batch, prefill_tokens, num_decode, running, queue,
                 token_usage[0], cache_hit_rate, thermal[0], ends[0] - start)
        if k == 1:
            return
        more = k - 1
        self.time.extend(ends[1:])
        self.kind.extend([KIND_CODES["decode"]] * more)
        self.batch.extend([num_decode] * more)
        self.prefill_tokens.extend([0] * more)
        self.decode_tokens.extend([num_decode] * more)
        self.running.extend([running] * more)
        self.queue.extend([queue] * more)
        self.token_usage.extend(token_usage[1:])
        self.cache_hit_rate.extend([cache_hit_rate] * more)
        if thermal[0][0] is None:
            self.sm_clock_mhz.extend([math.nan] * more)
            self.temp_c.extend([math.nan] * more)
            self.power_w.extend([math.nan] * more)
            self.thermal_slowdown.extend([0] * more)
        else:
            for sm, temp, power, slowdown in thermal[1:]:
                self.sm_clock_mhz.append(math.nan if sm is None else float(sm))
                self.temp_c.append(math.nan if temp is None else float(temp))
                self.power_w.append(math.nan if power is None else float(power))
                self.thermal_slowdown.append(int(slowdown))
        self.step_s.extend([t - prev for prev, t in itertools.pairwise(ends)])

    def floats(self, name: str) -> npt.NDArray[np.float64]:
        """A float field of every step, as a new array (the thermal figures are NaN where the
        model is off)."""
        if name not in _FLOAT_COLUMNS:
            raise KeyError(f"{name!r} is not a float field of the step log")
        values: list[float] = getattr(self, name)
        return np.array(values, dtype=np.float64)

    def ints(self, name: str) -> npt.NDArray[np.int64]:
        """An integer field of every step, as a new array (`kind`: its index in KINDS,
        `thermal_slowdown`: 0 or 1)."""
        if name not in LOG_FIELDS or name in _FLOAT_COLUMNS:
            raise KeyError(f"{name!r} is not an integer field of the step log")
        values: list[int] = getattr(self, name)
        return np.array(values, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.time)

    @overload
    def __getitem__(self, i: int) -> StepRow: ...

    @overload
    def __getitem__(self, i: slice) -> list[StepRow]: ...

    def __getitem__(self, i: int | slice) -> StepRow | list[StepRow]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return StepRow(self.time[i], KINDS[self.kind[i]], self.batch[i], self.prefill_tokens[i],
                       self.decode_tokens[i], self.running[i], self.queue[i],
                       self.token_usage[i], self.cache_hit_rate[i],
                       _figure(self.sm_clock_mhz[i]), _figure(self.temp_c[i]),
                       _figure(self.power_w[i]), bool(self.thermal_slowdown[i]),
                       self.step_s[i])

    def __iter__(self) -> Iterator[StepRow]:
        for i in range(len(self)):
            yield self[i]
