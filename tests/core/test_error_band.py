"""The twin's error band (issue 22, item 4): a calibration scaled by k makes every step k times
as long; the provenance says what is fitted, borrowed and assumed; a plan and a twin sweep
carry the knees at the band's edges."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from chatfleet.cli import app
from chatfleet.core.calibration import STEP_TIME_BAND, calibration_for, vllm_calibration_for
from chatfleet.core.engine.mixed_step import MixedStepModel
from chatfleet.core.engine.step_time import StepTimeModel
from chatfleet.core.errors import ChatfleetError
from chatfleet.core.provenance import provenance
from chatfleet.core.specs import builtin_model, get_gpu, precision


@pytest.mark.parametrize("k", [0.75, 1.25, 2.0])
def test_a_scaled_calibration_makes_every_step_k_times_as_long(k: float) -> None:
    gpu, model, prec = get_gpu("l4"), builtin_model("qwen3-8b"), precision("fp8", "fp8")
    base = replace(vllm_calibration_for(gpu), launch_s=0.01, per_seq_s=0.0002)
    rng = random.Random(3)

    def models(cal: object) -> tuple[StepTimeModel, MixedStepModel]:
        assert isinstance(cal, type(base))
        c = cal.constants(gpu, prec.weights)
        return (StepTimeModel(model, gpu, prec, c),
                MixedStepModel(model, gpu, prec, c, cal.per_seq_s, 2048, 24,
                               launch_s=cal.launch_s))

    (s1, m1), (sk, mk) = models(base), models(base.scaled(k))
    for _ in range(100):
        n, ctx = rng.randint(1, 64), rng.randint(100, 100_000)
        new, cached = rng.randint(1, 4000), rng.randint(0, 4000)
        pairs = new * cached + new * (new + 1) / 2
        assert sk.decode_s(n, ctx) == pytest.approx(k * s1.decode_s(n, ctx), rel=1e-9)
        assert sk.prefill_s(new, pairs, cached, 1) == pytest.approx(
            k * s1.prefill_s(new, pairs, cached, 1), rel=1e-9)
        assert mk.step_s(n, ctx, new, pairs, cached, 2, 1) == pytest.approx(
            k * m1.step_s(n, ctx, new, pairs, cached, 2, 1), rel=1e-9)
    with pytest.raises(ChatfleetError):
        base.scaled(0.0)


def test_the_provenance_says_what_is_fitted_borrowed_and_assumed() -> None:
    l4, h200 = get_gpu("l4"), get_gpu("h200")
    sglang_l4 = provenance("sglang", l4, None)
    assert sglang_l4.fitted and "L4" in sglang_l4.fitted[0] and not sglang_l4.borrowed
    assert any("nothing above one user" in a for a in sglang_l4.assumed)
    vllm_l4 = provenance("vllm", l4, None)
    # the vLLM model on the L4 is fitted on SGLang's L4 figures, borrows the fixed costs
    assert vllm_l4.fitted == sglang_l4.fitted
    assert any("the same in vLLM" in b for b in vllm_l4.borrowed)
    assert any("per sequence" in a for a in vllm_l4.assumed)
    sglang_h200 = provenance("sglang", h200, None)
    assert not sglang_h200.fitted and "h200" in sglang_h200.borrowed[0]
    assert sglang_l4.band == STEP_TIME_BAND
    fitted = replace(calibration_for(l4), gpu="h200", source="my sweep", error_band=0.07)
    mine = provenance("vllm", h200, fitted)
    assert mine.fitted == ("my sweep",) and mine.band == 0.07 and not mine.borrowed
    assert provenance("vllm", l4, fitted).borrowed  # an H200 profile used for an L4


def test_a_twin_sweep_gives_the_knees_at_the_band_edges(tmp_path: object) -> None:
    out = CliRunner().invoke(app, [
        "twin", "sweep", "--weights", "fp8", "--kv-cache", "fp8", "--lengths", "uniform",
        "--range-ratio", "0.5", "--range-convention", "vllm",
        "--concurrency", "4,8,12,16,24,32,48", "--duration", "60", "--warmup", "10",
        "--print-json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    band = doc["knee_band"]
    assert band["error_band"] == STEP_TIME_BAND
    central = doc["knee"]["meets"] or 0
    slower, faster = band["knee"]["slower"]["meets"] or 0, band["knee"]["faster"]["meets"] or 0
    assert slower <= central <= faster  # slower steps can only fit fewer users
    assert slower < faster  # the band moves the knee on this grid
    assert doc["calibration"]["fitted"]
