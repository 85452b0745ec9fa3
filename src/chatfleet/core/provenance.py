"""Where the twin's constants come from: what was fitted (and on which engine and card), what
is borrowed from another engine or card, what is assumed, and the error band they carry. A
plan's `calibration` block, a twin sweep's `calibration` key and the lines under their answers
(docs/calibration.md#what-a-plan-says-of-its-constants-and-its-error-band)."""

from __future__ import annotations

from dataclasses import dataclass

from chatfleet.core.calibration import (
    ASSUMED_BF16_GEMM_EFF,
    ASSUMED_DECODE_FIXED_S,
    ASSUMED_EAGER_S,
    ASSUMED_VLLM_PER_SEQ_S,
    STEP_TIME_BAND,
    STEP_TIME_BAND_SOURCE,
    Calibration,
)
from chatfleet.core.memory import CALIBRATED_GPUS
from chatfleet.core.specs import GPU


@dataclass(frozen=True, slots=True)
class Provenance:
    """Where the twin's figures come from: what was fitted (and on which engine and card),
    what is borrowed from elsewhere, what is assumed; and the error band they carry."""

    fitted: tuple[str, ...]
    borrowed: tuple[str, ...]
    assumed: tuple[str, ...]
    band: float
    band_source: str

    def to_json(self) -> dict[str, object]:
        return {"fitted": list(self.fitted), "borrowed": list(self.borrowed),
                "assumed": list(self.assumed), "error_band": self.band,
                "error_band_source": self.band_source}


L4_FIT = ("SGLang v0.5 on an NVIDIA L4 with Qwen3-8B at one user: the BF16 and FP8 output rates "
          "and median TTFTs (docs/facts.md#l4-calibration-points)")


def _l4_assumptions() -> tuple[str, ...]:
    return (f"a decode step's fixed cost of {ASSUMED_DECODE_FIXED_S * 1e3:g} ms",
            f"a BF16 prefill's GEMMs at {ASSUMED_BF16_GEMM_EFF:.0%} of peak",
            f"{ASSUMED_EAGER_S * 1e3:g} ms per decode step above the CUDA-graph batch limit",
            "nothing above one user was measured on an L4")


def provenance(engine_model: str, gpu: GPU, cal: Calibration | None) -> Provenance:
    """The provenance of the constants the twin runs with: `cal` a profile given by the user
    (None: the built-in ones for this engine model and card)."""
    if cal is not None:
        elsewhere = (() if cal.gpu == gpu.name else
                     (f"a profile fitted on the {cal.gpu}, applied to the {gpu.name}",))
        band, source = ((cal.error_band, "the profile's fit") if cal.error_band is not None
                        else (STEP_TIME_BAND, STEP_TIME_BAND_SOURCE))
        return Provenance((cal.source,), elsewhere, (), band, source)
    on_l4 = gpu.name in CALIBRATED_GPUS
    fitted: tuple[str, ...] = (L4_FIT,) if on_l4 else ()
    borrowed: tuple[str, ...] = () if on_l4 else (
        f"the L4 fit's efficiencies and fixed costs ({L4_FIT}), on the {gpu.name}'s "
        "datasheet figures",)
    assumed = _l4_assumptions()
    if engine_model == "vllm":
        borrowed += ("the step's fixed costs of the SGLang fit, taken as the same in vLLM",)
        assumed += (f"vLLM's cost per sequence in a step, {ASSUMED_VLLM_PER_SEQ_S * 1e6:g} us",
                    "vLLM's memory overheads (core/memory.py: its pool rule)")
    return Provenance(fitted, borrowed, assumed, STEP_TIME_BAND, STEP_TIME_BAND_SOURCE)
