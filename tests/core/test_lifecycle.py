"""The lifecycle both engine models share (core/engine/base_scheduler.py): each engine overrides
its rules alone, and a request's way in is the same checks in both."""

from __future__ import annotations

import pytest
from tests.core import test_scheduler as sglang
from tests.core import test_vllm_scheduler as vllm

from chatfleet.core.engine.base_scheduler import BaseScheduler
from chatfleet.core.engine.protocol import EngineControls, EngineReadings
from chatfleet.core.engine.request import EngineRequest
from chatfleet.core.engine.scheduler import Scheduler
from chatfleet.core.engine.step import Step
from chatfleet.core.engine.vllm_scheduler import VLLMScheduler

# what an engine decides (base_scheduler.py's docstring), and what it holds and reports
RULES = {"_next_step", "_apply", "_enqueue", "_pool_refusal", "_prefill_share", "_step_ended",
         "is_running", "context_length", "next_ready_time"}


def engines() -> list[BaseScheduler]:
    return [sglang.make(4096), vllm.make(blocks=256, budget=512)]


@pytest.mark.parametrize("cls", [Scheduler, VLLMScheduler])
def test_an_engine_overrides_its_rules_and_nothing_of_the_lifecycle(cls: type) -> None:
    base = {name for name in vars(BaseScheduler) if not name.startswith("__")}
    overridden = {name for name in vars(cls) if name in base and not name.startswith("__")}
    assert overridden - {"engine_name", "context_name"} <= RULES
    assert {"_next_step", "_apply", "_enqueue", "_pool_refusal", "is_running"} <= overridden


def test_both_engines_offer_both_halves_of_the_protocol() -> None:
    controls = {n for n in vars(EngineControls) if not n.startswith("_")}
    readings = {n for n in vars(EngineReadings) if not n.startswith("_")}
    controls |= set(EngineControls.__annotations__)
    readings |= set(EngineReadings.__annotations__)
    assert not controls & readings
    for engine in engines():
        missing = [n for n in sorted(controls | readings) if not hasattr(engine, n)]
        assert missing == [], type(engine).__name__


@pytest.mark.parametrize("engine", engines(), ids=lambda e: e.engine_name)
def test_a_request_is_checked_the_same_way_and_left_as_it_was_when_refused(
        engine: BaseScheduler) -> None:
    assert engine.check_request(0, 10) == "the prompt is empty"
    assert engine.check_request(10, 0) == "max_new_tokens must be positive"
    too_long = engine.check_request(engine.context_length, 1) or ""
    assert too_long.endswith(f"exceeds the {engine.context_name} ({engine.context_length})")
    assert "fit" in (engine.check_request(10, 4090) or "")  # the KV pool's rule, its own words
    over = EngineRequest("x", list(range(10)), list(range(5)), 4)  # more outputs than max_new
    with pytest.raises(ValueError, match="between 1 and max_new_tokens"):
        engine.add_request(over, 0.0)
    assert over.state == "waiting" and isinstance(over.prompt, list)  # untouched


@pytest.mark.parametrize("engine", engines(), ids=lambda e: e.engine_name)
def test_a_request_id_that_is_running_is_refused(engine: BaseScheduler) -> None:
    first = EngineRequest("a", list(range(32)), list(range(100, 140)), 40)
    engine.add_request(first, 0.0)
    now = 0.0
    while first.state != "running":
        step = engine.schedule(now)
        assert step is not None
        now = step.end
        engine.complete(now)
    again = EngineRequest("a", list(range(8)), list(range(100, 104)), 4)
    with pytest.raises(ValueError, match="already running"):
        engine.add_request(again, now)
    assert again.state == "waiting" and isinstance(again.prompt, list)


@pytest.mark.parametrize("engine", engines(), ids=["sglang", "vllm"])
def test_a_truncated_decode_run_ends_at_its_last_steps_end_to_the_bit(
        engine: BaseScheduler) -> None:
    # the times hypothesis found through vLLM's decode runs: start + (end - start) is one unit
    # in the last place past the end, so a run whose end was start + duration ended a hair
    # after what single steps give
    start, cut, later = 0.05106961706739257, 0.12106969285405923, 0.19
    assert start + (cut - start) != cut
    engine.in_flight = Step("decode", start, later - start, num_decode=1,
                            decode_ends=[0.09, cut, later])
    assert engine.truncate_decode_run(0.1) == cut
    assert engine.in_flight.end == cut and engine.in_flight.decode_ends == [0.09, cut]
