"""How far the knee moves if the assumed split of prefill time is wrong.

One TTFT per precision cannot separate the prefill step's fixed cost from its GEMM efficiency
(calibration.py). This re-fits the L4 constants under other assumed BF16 GEMM efficiencies
(the feasible range is about 0.31 to 0.63: outside it the fit has no positive fixed cost, or
FP8's TTFT cannot be met) and reruns the same twin sweep for each.

Usage: .venv/bin/python benchmarks/calibration_sensitivity.py
"""

from __future__ import annotations

from chatfleet.core.calibration import ASSUMED_BF16_GEMM_EFF, fit_l4
from chatfleet.core.documents.sweep import ClosedLoad
from chatfleet.core.engine.build import EngineSpec
from chatfleet.core.slo import SLO
from chatfleet.core.specs import builtin_model, get_gpu, precision
from chatfleet.core.workload import LengthSpec, WorkloadConfig
from chatfleet.twin.sweep import TwinSweep

GRID = [1, 2, 4, 6, 8, 10, 12, 16, 20, 24, 32]
EFFS = [0.35, 0.40, 0.45, ASSUMED_BF16_GEMM_EFF, 0.55, 0.60]


def main() -> None:
    gpu, model = get_gpu("l4"), builtin_model("qwen3-8b")
    wcfg = WorkloadConfig(lengths=LengthSpec("uniform", 512, 128, 0.5, "vllm"))
    loads = [ClosedLoad(c) for c in GRID]
    print("closed loop, Qwen3-8B on L4, 2,048-token shared prompt, mixed 512/128 lengths,"
          " 300 s per point; knee = highest load with >= 99% meeting TTFT 1 s and TPOT 100 ms")
    print(f"{'bf16 gemm eff':>13s} {'prefill fixed ms':>16s} {'fp8 gemm eff':>12s} "
          f"{'BF16 knee':>9s} {'FP8 knee':>8s}")
    for eff in EFFS:
        cal = fit_l4(bf16_gemm_eff=eff)
        knees = []
        for prec in ("bf16", "fp8"):
            spec = EngineSpec(gpu, model, precision(prec, prec), calibration=cal)
            doc = TwinSweep(spec, wcfg, SLO(), duration_s=300.0, warmup_s=30.0).run(loads)
            knees.append(doc.knee.meets)
        mark = "  <- assumed" if eff == ASSUMED_BF16_GEMM_EFF else ""
        print(f"{eff:13.2f} {cal.prefill_fixed_s * 1000:16.1f} {cal.gemm_eff['fp8']:12.3f} "
              f"{knees[0]!s:>9s} {knees[1]!s:>8s}{mark}")


if __name__ == "__main__":
    main()
