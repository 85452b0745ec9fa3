"""A plan that does not contradict its thermal rows (issue 25 item 5): the engine at the clock a
throttled card holds, and the fleet sized at that clock beside the recommended one."""

from __future__ import annotations

import json
from typing import Any

import pytest
from typer.testing import CliRunner

from chatfleet.cli import app
from chatfleet.core.engine.build import EngineSpec, step_time_model, thermal_profile_of
from chatfleet.core.errors import ChatfleetError
from chatfleet.core.held_clock import at_clock
from chatfleet.core.specs import builtin_model, get_gpu, precision

SPEC = EngineSpec(get_gpu("l4"), builtin_model("qwen3-8b"), precision("fp8", "fp8"))
FAST = ("--grid", "1,4,8,16,32", "--rates", "0.5,1,2", "--duration", "120", "--warmup", "10",
        "--doubling-hours", "0.1", "--precisions", "fp8")


@pytest.mark.parametrize("fraction", [1.0, 0.8, 0.5, 0.35])
def test_every_step_at_a_held_clock_is_the_thermal_models_step_at_that_clock(
        fraction: float) -> None:
    profile = thermal_profile_of(SPEC)
    mhz = profile.loaded_mhz * fraction
    sm, mem = profile.loaded_mhz / mhz, max(1.0, profile.mem_bound_floor_mhz / mhz)
    loaded, held = step_time_model(SPEC), step_time_model(at_clock(SPEC, mhz))
    for batch, kv in ((1, 3000), (8, 30_000), (64, 200_000), (200, 100_000)):
        assert held.decode_s(batch, kv) == pytest.approx(
            loaded.decode_s(batch, kv, sm_factor=sm, mem_factor=mem), rel=1e-9)
    for new, pairs, cached, logits in ((512, 5e5, 2048, 1), (2048, 4e6, 0, 4),
                                       (8192, 3e7, 16_000, 8)):
        assert held.prefill_s(new, pairs, cached, logits) == pytest.approx(
            loaded.prefill_s(new, pairs, cached, logits, sm_factor=sm, mem_factor=mem),
            rel=1e-9)
    assert not at_clock(SPEC, mhz).thermal


def test_a_clock_outside_the_cards_range_is_refused() -> None:
    loaded = thermal_profile_of(SPEC).loaded_mhz
    for mhz in (0.0, -5.0, loaded + 1.0):
        with pytest.raises(ChatfleetError, match="a held clock must lie in"):
            at_clock(SPEC, mhz)


@pytest.fixture(scope="module")
def answer() -> tuple[dict[str, Any], str]:
    runner = CliRunner()
    res = runner.invoke(app, ["plan", "--users", "100", *FAST, "--json"])
    assert res.exit_code == 0, res.output
    text = runner.invoke(app, ["plan", "--users", "100", *FAST])
    assert text.exit_code == 0, text.output
    return json.loads(res.output), " ".join(text.output.split())


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_recommendation_that_throttles_gives_the_fleet_at_the_held_clock(
        answer: tuple[dict[str, Any], str]) -> None:
    doc, text = answer
    rec = doc["recommendation"]
    target_on = next(r for r in doc["doubling"]["runs"]
                     if r["traffic"] == "target" and r["thermal_model"])
    cooling = target_on["cooling"]
    assert not cooling["held_clock"]  # a saturated L4 under the fitted cooling throttles
    held = doc["held_clock"]
    # the clock the card settled at in the target hour, and the engine swept there
    assert held["clock_mhz"] == cooling["settled_mhz"] < cooling["profile"]["loaded_mhz"]
    assert held["sweep"]["target"]["thermal"] is False
    assert held["knee"] == held["sweep"]["knee"]
    # a slower card holds fewer users, so the fleet for the same users is larger
    assert held["users_per_card"] < rec["users_per_card"]
    assert held["cards"] > rec["cards"] and held["replicas"] == held["cards"]
    assert held["gateway_cap"] <= held["users_per_card"]
    # that fleet, an hour with the thermal model on: it meets the target it was sized for
    check = held["check"]
    assert check["thermal_model"] and check["shed_share"] == 0.0
    assert check["admitted_attainment"] >= 0.99
    # the recommendation names the cooling it assumes
    c = rec["cooling"]
    assert c["modelled_cooling_holds"] is False
    assert c["clock_mhz"] == cooling["profile"]["loaded_mhz"]
    assert c["needs_r_c_per_w"] == pytest.approx(cooling["max_r_c_per_w"], abs=1e-3)
    assert c["needs_r_c_per_w"] < c["modelled_r_c_per_w"]
    assert "held_clock" in c["note"]
    # and the text says both
    assert f"cooling: {c['note']}" in text
    assert (f"at the clock the card holds under the modelled cooling "
            f"({held['clock_mhz']:.0f} MHz): {held['users_per_card']} users per card") in text
    assert f"with cooling like the modelled card's, run these {held['cards']}" in text
