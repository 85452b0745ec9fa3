"""Fit the step-time model to every observed step of a sweep: weighted least squares.

The residual of a sample is (modelled - observed gap), weighted by 1/num_decode (a step seen by
n requests counts once). Plain least squares: the fit is of the mean step, which is what a
request's time per output token averages. The fit starts from the constants the twin already
has (the prior: the card's physics and the assumed fixed costs) and moves them within physical
bounds. A
parameter the data cannot pin down (its standard error over half its value, or pressed against
a bound) is reported as weakly identified: it stays near where it started.

What the fit reports, beside the constants:
- per term: its mean seconds per step over the fitted steps and its share of the mean step,
  with the constant's standard error (from the Jacobian; the steps of one run share the
  machine's state, so these are optimistic: the per-point errors are the honest spread);
- per point: the mean observed step against the mean modelled one over that point's steps;
- `band`: the largest per-point relative error of the mean step over the points fitted on,
  the error the twin's step times carry into a plan (twin/calibrate.py, core/plan.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from chatfleet.core.errors import ChatfleetError
from chatfleet.core.stepfit.model import Hardware, StepParams, step_terms, step_times
from chatfleet.core.stepfit.samples import StepSamples, concat

# physical bounds of each constant (seconds, or a share of the datasheet figure)
BOUNDS: dict[str, tuple[float, float]] = {
    "decode_fixed_s": (0.0, 0.5), "prefill_extra_s": (0.0, 0.5), "per_seq_s": (0.0, 0.01),
    "launch_s": (0.0, 0.5), "bandwidth_eff": (0.05, 1.0), "gemm_eff": (0.05, 1.0),
    "attn_eff": (0.02, 1.0), "kv_read_eff": (0.05, 1.0),
}
WEAK_RELATIVE_SE = 0.5
KV_READ = "kv_read_eff"  # held at the weights' bandwidth where the steps leave it weak
MIN_STEPS = 50  # a fit needs at least this many observed steps


@dataclass(frozen=True)
class TermFit:
    name: str
    value: float
    std_error: float | None
    weakly_identified: bool


@dataclass(frozen=True)
class PointFit:
    label: str
    fitted_on: bool
    num_samples: int
    num_steps: float
    num_dropped: int
    observed_step_s: float
    modelled_step_s: float

    @property
    def rel_error(self) -> float:
        return self.modelled_step_s / self.observed_step_s - 1.0


@dataclass(frozen=True)
class StepFit:
    params: StepParams
    terms: tuple[TermFit, ...]
    term_seconds: dict[str, float]  # mean seconds per step of each term, over the fitted steps
    points: tuple[PointFit, ...]
    # a single step against its model, RMS over the mean step: the step-to-step noise
    rms_rel_residual: float
    band: float

    def term(self, name: str) -> TermFit:
        return next(t for t in self.terms if t.name == name)

    @property
    def held(self) -> tuple[str, ...]:
        """The constants held at their prior (by the caller, or kv_read_eff by the fit)."""
        return tuple(t.name for t in self.terms if t.std_error is None
                     and not t.weakly_identified)


def fit_steps(hw: Hardware, prior: StepParams, runs: Sequence[tuple[str, StepSamples, bool]],
              held: Sequence[str] = ()) -> StepFit:
    """Fit on the runs marked True (label, samples, fit on this run?); report every run."""
    names = StepParams.names()
    unknown = [h for h in held if h not in names]
    if unknown:
        raise ChatfleetError(f"unknown constant(s) to hold: {', '.join(unknown)} "
                             f"(one of {', '.join(names)})")
    fit_set = concat([s for _, s, on in runs if on])
    if fit_set.num_steps < MIN_STEPS:
        raise ChatfleetError(f"the points to fit on hold {fit_set.num_steps:.0f} observed steps; "
                             f"a fit needs at least {MIN_STEPS}")
    free = [n for n in names if n not in held]
    start = dict(zip(names, prior.values(), strict=True))
    lo = np.array([BOUNDS[n][0] for n in free])
    hi = np.array([BOUNDS[n][1] for n in free])
    x0 = np.clip(np.array([start[n] for n in free]), lo, hi)
    scale = np.maximum(np.abs(x0), 1e-4)
    sw = np.sqrt(fit_set.weight)

    def params(x: np.ndarray) -> StepParams:
        v = dict(start)
        v.update(zip(free, (x * scale).tolist(), strict=True))
        return StepParams(**v)

    def residuals(x: np.ndarray) -> np.ndarray:
        return (step_times(hw, params(x), fit_set) - fit_set.gap_s) * sw

    # the step is serial + max(launch, gpu): which share of the host time overlaps the GPU is
    # a non-convex question, so the fit starts from several splits of the prior's host time
    # and keeps the one that fits best
    res = None
    for x in _starts(x0, free, start, lo, hi):
        r = least_squares(residuals, x / scale, bounds=(lo / scale, hi / scale), x_scale="jac")
        if res is None or r.cost < res.cost:
            res = r
    assert res is not None
    best = params(res.x)
    terms = _terms(best, free, res, scale, lo, hi, fit_set)
    if KV_READ in free and any(t.name == KV_READ and t.weakly_identified for t in terms):
        # the KV read's own rate is told from the weights' only by steps over long contexts:
        # where these cannot tell them apart it is the weights' rate, not wherever a flat
        # direction of the fit left it
        return fit_steps(hw, replace(prior, kv_read_eff=prior.bandwidth_eff), runs,
                         held=(*held, KV_READ))
    modelled = step_times(hw, best, fit_set)
    rms = math.sqrt(float(np.average((modelled - fit_set.gap_s) ** 2, weights=fit_set.weight))
                    ) / float(np.average(fit_set.gap_s, weights=fit_set.weight))
    points = tuple(_point(hw, best, label, s, on) for label, s, on in runs)
    fitted = [abs(p.rel_error) for p in points if p.fitted_on and p.num_steps > 0]
    parts = step_terms(hw, best, fit_set)
    w = fit_set.weight
    term_seconds = {
        "decode_fixed_s": float(np.average(parts.fixed, weights=w)),
        "prefill_extra_s": float(np.average(parts.prefill_extra, weights=w)),
        "per_seq_s": float(np.average(parts.per_seq, weights=w)),
        "launch_s": float(np.average(parts.launch_over_gpu, weights=w)),
        "gpu": float(np.average(parts.gpu, weights=w)),
    }
    return StepFit(best, terms, term_seconds, points, rms, max(fitted, default=0.0))


SPLITS = (0.0, 0.25, 0.5, 0.75, 1.0)


def _starts(x0: np.ndarray, free: list[str], start: dict[str, float], lo: np.ndarray,
            hi: np.ndarray) -> list[np.ndarray]:
    """The prior, and the prior's fixed plus launch time split between the two in SPLITS
    (where both are free)."""
    out = [x0]
    if "decode_fixed_s" in free and "launch_s" in free:
        host = start["decode_fixed_s"] + start["launch_s"]
        i, j = free.index("decode_fixed_s"), free.index("launch_s")
        for share in SPLITS:
            x = x0.copy()
            x[i], x[j] = host * (1 - share), host * share
            out.append(np.clip(x, lo, hi))
    return out


def _terms(best: StepParams, free: list[str], res: Any, scale: np.ndarray,
           lo: np.ndarray, hi: np.ndarray, fit_set: StepSamples) -> tuple[TermFit, ...]:
    jac = np.asarray(res.jac) / scale  # d residual / d parameter (unscaled)
    r = np.asarray(res.fun)
    dof = max(1.0, fit_set.num_steps - len(free))
    sigma2 = float(r @ r) / dof
    try:
        cov = np.linalg.pinv(jac.T @ jac) * sigma2
        se = np.sqrt(np.clip(np.diag(cov), 0.0, None))
    except np.linalg.LinAlgError:
        se = np.full(len(free), np.nan)
    # a constant the steps do not move at all (its column of the Jacobian ~0) has no error
    # the pseudo-inverse can give (it reports 0): it is unidentified
    norms = np.linalg.norm(jac, axis=0)
    se = np.where(norms <= 1e-9 * max(float(norms.max(initial=0.0)), 1e-300), np.nan, se)
    out = []
    values = dict(zip(StepParams.names(), best.values(), strict=True))
    for name, value in values.items():
        if name not in free:
            out.append(TermFit(name, value, None, False))
            continue
        i = free.index(name)
        at_bound = value <= float(lo[i]) + 1e-12 or value >= float(hi[i]) - 1e-12
        s = float(se[i]) if math.isfinite(float(se[i])) else None
        weak = at_bound or s is None or (value > 0 and s > WEAK_RELATIVE_SE * value)
        out.append(TermFit(name, value, s, weak))
    return tuple(out)


def _point(hw: Hardware, p: StepParams, label: str, s: StepSamples, on: bool) -> PointFit:
    if len(s) == 0:
        return PointFit(label, on, 0, 0.0, s.num_dropped, math.nan, math.nan)
    return PointFit(label, on, len(s), s.num_steps, s.num_dropped,
                    float(np.average(s.gap_s, weights=s.weight)),
                    float(np.average(step_times(hw, p, s), weights=s.weight)))
