"""A plan that does not contradict its own thermal rows (issue 25 item 5).

When the thermal model says the recommended load throttles the card under the modelled
cooling, the plan gives two fleets: the recommended one, sized at the loaded clock, which
assumes cooling that holds that clock (the recommendation names it: `cooling`), and beside it
the fleet sized at the clock the card holds under the modelled cooling (`held_clock`): the
recommended precision swept again with every step as long as at that clock
(core/held_clock.py), its knee, users per card, cap and cards, and an hour of the target
traffic on that fleet with the thermal model on, to show what its card then does.

`plan --users` takes the clock from the doubled-traffic hour's target run with the thermal
model on; `plan --trace` from the busiest hour of the trace at its answer, replayed with the
thermal model off (the load's mix) and on (the clocks).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from chatfleet.core.documents.doubling import Cooling, Doubling
from chatfleet.core.documents.held_clock import CoolingAssumption, HeldClockFleet
from chatfleet.core.documents.sweep import ClosedLoad, Load, SweepDoc
from chatfleet.core.engine.build import EngineSpec
from chatfleet.core.held_clock import at_clock
from chatfleet.core.plan import PrecisionFigures, figures_from_sweep, fleet_size, prefill_reserve_s
from chatfleet.core.traffic.columns import Segment, busiest_first
from chatfleet.jobs.plan_fleet import cooling_block, fleet_runs_of
from chatfleet.jobs.plan_request import PlanRequest, engine_spec
from chatfleet.jobs.trace_search import Engine, TracePlanner, level
from chatfleet.jobs.workers import WorkerPool
from chatfleet.twin.sweep import TwinSweep


def cooling_assumption(cooling: Cooling | None,
                       held_mhz: float | None = None) -> CoolingAssumption | None:
    """Which cooling the recommended fleet assumes, from the thermal verdict at its load."""
    if cooling is None:
        return None
    prof = cooling.profile
    if cooling.held_clock:
        return CoolingAssumption(
            clock_mhz=prof.loaded_mhz, modelled_cooling_holds=True, inlet_c=prof.inlet_c,
            modelled_r_c_per_w=prof.r_c_per_w, needs_r_c_per_w=None,
            note=f"the modelled cooling holds {prof.loaded_mhz:.0f} MHz at this load")
    held = cooling.settled_mhz if held_mhz is None else held_mhz
    return CoolingAssumption(
        clock_mhz=prof.loaded_mhz, modelled_cooling_holds=False, inlet_c=prof.inlet_c,
        modelled_r_c_per_w=prof.r_c_per_w, needs_r_c_per_w=round(cooling.max_r_c_per_w, 3),
        note=(f"sized at {prof.loaded_mhz:.0f} MHz, which needs cooling of at most "
              f"{cooling.max_r_c_per_w:.2f} C/W at a {prof.inlet_c:g} C inlet "
              f"({cooling.cooling_factor:.1f}x better than the modelled card's "
              f"{prof.r_c_per_w:.2f} C/W); under the modelled cooling the card holds "
              + (f"{held:.0f} MHz: the fleet for that clock is `held_clock`"
                 if held is not None else "less")))


def held_sweep(req: PlanRequest, spec: EngineSpec) -> SweepDoc:
    """The closed-loop grid (knee refined) of the engine at a held clock, in this process."""
    loads: list[Load] = [ClosedLoad(c) for c in req.grid]
    sweeper = TwinSweep(spec, req.profile.workload(), req.slo, duration_s=req.duration_s,
                        warmup_s=req.warmup_s, seed=req.seed)
    return sweeper.run(loads, refine=True)


def held_figures(req: PlanRequest, fig: PrecisionFigures,
                 mhz: float) -> tuple[EngineSpec, PrecisionFigures, SweepDoc]:
    spec = at_clock(engine_spec(req, fig.weights, fig.kv_cache), mhz)
    doc = held_sweep(req, spec)
    return spec, figures_from_sweep(doc, f"twin at {mhz:.0f} MHz", req.cap_margin), doc


def held_clock_fleet(req: PlanRequest, fig: PrecisionFigures, doubling: Doubling,
                     pool: WorkerPool) -> HeldClockFleet | None:
    """`plan --users`: the fleet at the clock the target traffic's thermal-on hour settled
    at, when it throttled (None when the card held its clock)."""
    index, run = next((i, r) for i, r in enumerate(doubling.runs)
                      if r.traffic == "target" and r.thermal_model)
    c = run.cooling
    if c is None or c.held_clock or c.settled_mhz is None:
        return None
    mhz = c.settled_mhz
    _, held, doc = held_figures(req, fig, mhz)
    source = f"doubling.runs[{index}]: the target traffic's hour with the thermal model on"
    if held.users_per_card is None or held.gateway_cap is None:
        return HeldClockFleet(clock_mhz=mhz, source=source, knee=held.knee,
                              users_per_card=None, gateway_cap=None, replicas=None, cards=None,
                              why=f"at {mhz:.0f} MHz no tested load meets the target: the card "
                                  "needs the cooling that holds its clock", sweep=doc)
    size = fleet_size(req.users, held.users_per_card, req.headroom)
    check = fleet_runs_of(req, held, size["replicas"], held.gateway_cap * size["replicas"],
                          pool, (("target", 1),), (True,))[0]
    return HeldClockFleet(
        clock_mhz=mhz, source=source, knee=held.knee, users_per_card=held.users_per_card,
        gateway_cap=held.gateway_cap, replicas=size["replicas"], cards=size["cards"],
        why=(f"the modelled cooling holds {mhz:.0f} MHz under this load: {held.name} at that "
             f"clock meets the target with {held.users_per_card} users per card "
             f"(cap {held.gateway_cap}): {size['cards']} cards for {req.users} users with "
             f"{req.headroom:.0%} headroom"),
        check=check, sweep=doc)


def trace_thermal(planner: TracePlanner, req: PlanRequest, name: str, fig: PrecisionFigures,
                  eng: Engine, replicas: int, target: list[Segment], state: dict[str, Any],
                  max_replicas: int, time_scale: float) -> Iterator[None]:
    """`plan --trace`: the thermal verdict of the busiest hour at the answer (the replays
    `{name}/clocks/off` and `/on`), and when it throttles the fleet at the clock it holds,
    searched on the same segments."""
    off = planner.singles[f"{name}/clocks/off"].result
    on = planner.singles[f"{name}/clocks/on"].result
    if off is None or on is None or off.gpu is None or on.gpu is None:
        return
    busiest = busiest_first(target)[0]
    cooling = cooling_block(replace(eng.spec, thermal=True), off.gpu, on.gpu)
    if cooling.slowdown_after_s is not None:  # the replay's clock is the trace's: from its
        first = float(target[busiest].time.min())  # first line (the lead-in's) on
        cooling = replace(cooling, slowdown_after_s=round(cooling.slowdown_after_s - first, 1))
    block: dict[str, Any] = {"segment": busiest, "replicas": replicas,
                             "cooling": cooling.to_json(), "held_clock": None}
    state["thermal"], state["cooling"] = block, cooling
    if cooling.held_clock or cooling.settled_mhz is None:
        return
    mhz = cooling.settled_mhz
    spec, held, _ = held_figures(req, fig, mhz)
    if held.gateway_cap is None:
        block["held_clock"] = {"clock_mhz": mhz, "replicas": None,
                               "why_none": f"at {mhz:.0f} MHz no tested load meets the target"}
        return
    held_eng = Engine(replace(spec, max_running_requests=held.gateway_cap), held.gateway_cap,
                      prefill_reserve_s(held, req.slo.ttft_ms / 1000.0))
    ratio = (fig.users_per_card or 1) / max(1, held.users_per_card or 1)
    s = planner.search(f"{name}/held-clock", held_eng, target,
                       min(max_replicas, max(replicas, math.ceil(replicas * ratio))),
                       max_replicas)
    yield
    found = level(s.search.at_answer(), len(target), s, time_scale, s.search.answer,
                  s.search.why_none)
    block["held_clock"] = {"clock_mhz": mhz, "cap": held.gateway_cap,
                           "knee": held.knee.to_json(), **found}
    state["held_mhz"] = mhz
