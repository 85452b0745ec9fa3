"""Tables of a fitted profile (`twin calibrate`) and of a judgement (`twin judge`)."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from chatfleet.cli.common import out

# how each step-fit constant reads: (label, unit scale, unit)
TERM_UNITS = {
    "decode_fixed_s": ("fixed host work a step", 1e3, "ms"),
    "prefill_extra_s": ("extra of a step with prefill", 1e3, "ms"),
    "per_seq_s": ("per sequence beyond the first", 1e6, "us"),
    "launch_s": ("launch time overlapping the GPU", 1e3, "ms"),
    "bandwidth_eff": ("achieved bandwidth / datasheet", 1.0, ""),
    "gemm_eff": ("achieved GEMM rate / datasheet", 1.0, ""),
    "attn_eff": ("achieved attention rate / datasheet", 1.0, ""),
    "kv_read_eff": ("KV-cache read bandwidth / datasheet", 1.0, ""),
}


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:+.0f}%"


def _fig(x: float | None, digits: int = 0) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def print_profile(prof: dict[str, Any]) -> None:
    cal = prof["calibration"]
    if prof.get("method") == "steps":
        fit = prof["step_fit"]
        out.print(f"profile for {prof['gpu']} {prof['weights']}/{prof['kv_cache']} (vllm "
                  f"model, fitted on every step of {len(fit['points'])} points): front end "
                  f"{cal['frontend_delay_s'] * 1000:.1f} ms")
        t = Table(title="the step-time model's constants (held: from the card's physics)")
        for col in ("constant", "meaning", "value", "std error", "per step"):
            t.add_column(col, justify="right")
        per_step = fit["mean_seconds_per_step"]
        for term in fit["terms"]:
            label, k, unit = TERM_UNITS[term["name"]]
            se = ("held" if term["held"] else "-" if term["std_error"] is None
                  else f"{term['std_error'] * k:.3g}{unit}")
            if term["weakly_identified"]:
                se += " (weak)"
            spent = per_step.get(term["name"])
            value = term["value"] * k if abs(term["value"]) > 1e-12 else 0.0
            t.add_row(term["name"], label, f"{value:.4g}{unit}", se,
                      "" if spent is None else f"{spent * 1e3:.2f} ms")
        t.add_row("gpu time", "weights, KV, GEMMs, attention", "", "",
                  f"{per_step['gpu'] * 1e3:.2f} ms")
        out.print(t)
        s = Table(title="mean step per point, observed against modelled "
                        f"(RMS of one step against its model: "
                        f"{fit['rms_rel_residual'] * 100:.0f}% of the mean step)")
        for col in ("point", "steps", "dropped gaps", "observed ms", "modelled ms", "error"):
            s.add_column(col, justify="right")
        for p in fit["points"]:
            s.add_row(p["label"], f"{p['steps']:.0f}", str(p["dropped"]),
                      _fig(p["observed_step_s"] and p["observed_step_s"] * 1e3, 1),
                      _fig(p["modelled_step_s"] and p["modelled_step_s"] * 1e3, 1),
                      _pct(p["rel_error"]))
        out.print(s)
        out.print(f"error band carried into plans: +/-{prof['error_band'] * 100:.0f}% of the "
                  "step time (the largest per-point error of the mean step)")
    else:
        out.print(f"profile for {prof['gpu']} {prof['weights']}/{prof['kv_cache']} "
                  f"({prof['engine_model']} model, fitted on "
                  f"{', '.join(map(str, prof['fit_points']))} users): bandwidth "
                  f"efficiency {cal['bandwidth_eff']:.3f}, prefill fixed "
                  f"{cal['prefill_fixed_s'] * 1000:.1f} ms, decode fixed "
                  f"{cal['decode_fixed_s'] * 1000:.1f} ms"
                  + (f", per sequence {cal['per_seq_s'] * 1e6:.0f} us, front end "
                     f"{cal['frontend_s'] * 1000:.1f} ms per request"
                     if prof["engine_model"] == "vllm" else ""))
    for note in prof.get("fit_notes") or ():
        out.print(f"note: {note}")
    out.print(points_table(prof["fit_error"], "fit error on the sweep's points (twin against "
                           "live)"))


def points_table(rows: list[dict[str, Any]], title: str) -> Table:
    t = Table(title=title)
    for col in ("load", "n", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99", "tok/s",
                "running", "queue", "attain", "targets"):
        t.add_column(col, justify="right")

    def pair(row: dict[str, Any], key: str, digits: int = 0, err: bool = True) -> str:
        f = row.get(key)
        if not isinstance(f, dict):
            return "-"
        text = f"{_fig(f['live'], digits)} / {_fig(f['twin'], digits)}"
        return text + (f" ({_pct(f['rel_error'])})" if err else "")

    for row in rows:
        label = row.get("label") or str(row["load"])
        t.add_row(label + ("" if not row.get("fitted_on") else " (fit)"),
                  f"{row.get('requests', '')}{'*' if row.get('thin') else ''}",
                  pair(row, "ttft_p50"), pair(row, "ttft_p99", err=False),
                  pair(row, "tpot_p50", 1), pair(row, "tpot_p99", 1, err=False),
                  pair(row, "output_tok_s"), pair(row, "max_running", err=False),
                  pair(row, "max_queue", err=False), pair(row, "attainment", 3, err=False),
                  "" if "within_targets" not in row else
                  "yes" if row["within_targets"] else "no")
    t.caption = ("live / twin; times in ms; * thin: fewer than 200 requests; targets: TTFT p50 "
                 "within 25%, TPOT p50 within 15%, tok/s within 10%")
    return t


def print_judgement(doc: dict[str, Any]) -> None:
    for sweep in doc["sweeps"]:
        kind = "held out" if sweep["held_out"] else "fitted on"
        out.print(points_table(sweep["points"], f"{sweep['path']} ({kind})"))
        for k in sweep["knees"]:
            if k["grid_steps"] is None:
                continue
            out.print(f"{k['mode']}-loop knee: live meets {k['live']['meets']}, fails "
                      f"{k['live']['fails']}; twin meets {k['twin']['meets']}, fails "
                      f"{k['twin']['fails']} ({k['grid_steps']} grid steps apart)")
    h = doc["held_out"]
    out.print(f"held out: {h['within_targets']} of {h['points']} points within every target, "
              f"{h['knees_within']} of {h['knees']} knees within "
              f"{doc['targets']['knee_grid_steps']} grid step")
