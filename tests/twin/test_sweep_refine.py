"""TwinSweep: a sweep's document after every point, and the refinement of the knee brackets."""

from __future__ import annotations

from chatfleet.core.documents.sweep import ClosedLoad, Knee, Load, OpenLoad
from chatfleet.core.engine.build import EngineSpec
from chatfleet.core.slo import SLO
from chatfleet.core.specs import builtin_model, get_gpu, precision
from chatfleet.core.workload import LengthSpec, WorkloadConfig
from chatfleet.twin.sweep import TwinSweep


def sweeper() -> TwinSweep:
    spec = EngineSpec(get_gpu("l4"), builtin_model("qwen3-8b"), precision("fp8", "fp8"))
    return TwinSweep(spec, WorkloadConfig(lengths=LengthSpec("uniform", 512, 128, 0.5, "vllm")),
                     SLO(), duration_s=60.0, warmup_s=10.0, seed=5)


def test_refine_bisects_both_brackets_to_their_width() -> None:
    seen: list[int] = []
    loads: list[Load] = [ClosedLoad(c) for c in (1, 64)]
    loads += [OpenLoad(r) for r in (0.25, 8.0)]
    doc = sweeper().run(loads, refine=True, on_point=lambda d: seen.append(len(d.points)))
    assert seen == list(range(1, len(doc.points) + 1))  # the document after every point
    knee, rate = doc.knee, doc.knee_rate
    assert knee.meets is not None and knee.fails == knee.meets + 1
    assert rate.fails - rate.meets <= 0.1 * rate.meets + 1e-9
    tested = [getattr(p.load, "concurrency", None) for p in doc.points]
    assert tested[:2] == [1, 64] and len(tested) > 4  # refinement points follow the grid


def test_without_refine_the_grid_is_all_that_runs() -> None:
    loads = [ClosedLoad(c) for c in (1, 64)]
    doc = sweeper().run(loads)
    assert [p.load.concurrency for p in doc.points] == [1, 64]
    assert doc.knee == Knee(1, 64)


def test_an_open_bracket_is_closed_before_it_is_bisected() -> None:
    """A grid whose top still meets is doubled until a load fails; an open-loop grid whose
    lowest rate fails is halved until one meets; then both are bisected as usual."""
    loads: list[Load] = [ClosedLoad(c) for c in (1, 4)]
    loads += [OpenLoad(8.0)]
    doc = sweeper().run(loads, refine=True)
    knee, rate = doc.knee, doc.knee_rate
    closed = [p.load.concurrency for p in doc.points if p.load.mode == "closed"]
    assert closed[:5] == [1, 4, 8, 16, 32]  # doubled from the top until one failed
    assert knee.meets is not None and knee.fails == knee.meets + 1
    opened = [p.load.rate_rps for p in doc.points if p.load.mode == "open"]
    assert opened[:3] == [8.0, 4.0, 2.0]  # halved from the lowest until one met
    assert rate.meets is not None and rate.fails is not None
