"""The report's plots, drawn with matplotlib's SVG backend and returned as inline SVG text.

Every plot overlays the sweeps it is given, one colour per sweep with its label in the legend.
Load plots put closed-loop concurrency and open-loop rate on separate panels. Invalid points are
drawn as crosses (left out of the lines, the knee and the peak) and thin points (fewer than 200
requests) as hollow markers. Text stays text in the SVG (`svg.fonttype: none`), and every figure
gets its own id salt, so several SVGs can sit in one HTML page without clashing ids.
"""

from __future__ import annotations

import io
import re
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import matplotlib
import numpy as np

matplotlib.use("Agg")

from matplotlib import rc_context
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from chatfleet.core.documents.sweep import Knee, SweepPoint
from chatfleet.report import human
from chatfleet.report.load import Series, Sweep, number
from chatfleet.report.tables import load_text
from chatfleet.report.ticks import set_load_ticks, thin_labels

Getter = Callable[[SweepPoint], float | None]

COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf",
          "#bcbd22", "#7f7f7f", "#d62728")
INVALID_COLOR = "#d62728"
SLO_COLOR = "#c00000"
RC: dict[str, Any] = {
    "svg.fonttype": "none",
    "font.family": "sans-serif",
    "font.sans-serif": ["DejaVu Sans"],  # shipped with matplotlib
    "font.size": 9.5,
    "axes.titlesize": 10.5,
    "axes.titleweight": "bold",
    "axes.grid": True,
    "grid.alpha": 0.35,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "legend.fontsize": 8.5,
    "legend.frameon": False,
}
MODE_AXIS = {
    "closed": "concurrency (closed-loop users)",
    "open": "arrival rate (requests/s, open loop)",
}
MODE_TITLE = {"closed": "closed loop", "open": "open loop"}
MAX_LINE_SAMPLES = 2000


@dataclass(slots=True)
class Plot:
    """One figure of the report: an anchor, a title, a caption and the inline SVG (and the
    matplotlib figure it was drawn from, for whoever wants to measure it)."""

    key: str
    title: str
    caption: str
    svg: str
    figure: Figure | None = field(default=None, repr=False, compare=False)


def _style() -> Any:
    """The report's matplotlib style, as a context manager."""
    return rc_context(cast(Any, RC))


def color(i: int) -> str:
    return COLORS[i % len(COLORS)]


def modes_of(sweeps: Sequence[Sweep]) -> list[str]:
    present = {p.load.mode for s in sweeps for p in s.points}
    return [m for m in ("closed", "open") if m in present]


def _mode_points(sweep: Sweep, mode: str) -> list[SweepPoint]:
    pts = [p for p in sweep.points if p.load.mode == mode]
    return sorted(pts, key=lambda p: float(p.load.value))


def _svg_of(fig: Figure, salt: str) -> str:
    thin_labels(fig)  # the load axes' labels that would collide become unlabelled ticks
    buf = io.StringIO()
    with rc_context(cast(Any, {"svg.hashsalt": salt, "svg.fonttype": "none"})):
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None,
                                                 "Format": None, "Type": None})
    text = buf.getvalue()
    text = text[text.index("<svg"):]  # no XML declaration or DOCTYPE inside HTML
    text = re.sub(r"<metadata>.*?</metadata>\s*", "", text, flags=re.S)
    # one namespace per figure: matplotlib numbers its groups (figure_1, axes_1, ...) afresh
    # in every SVG, and ids must stay unique in the page that holds them all
    text = re.sub(r'\bid="([^"]+)"', rf'id="{salt}-\1"', text)
    text = re.sub(r"url\(#([^)]+)\)", rf"url(#{salt}-\1)", text)
    text = re.sub(r'((?:xlink:)?href)="#([^"]+)"', rf'\1="#{salt}-\2"', text)
    return text.strip()


def _new_figure(ncols: int, nrows: int, width_per_col: float = 6.2,
                height_per_row: float = 3.4) -> tuple[Figure, list[list[Axes]]]:
    width = max(7.5, min(13.5, width_per_col * ncols))
    fig = Figure(figsize=(width, height_per_row * nrows + 0.9), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, [list(row) for row in axes]


def _load_axis(ax: Axes, loads: Sequence[float], mode: str, label: bool = True) -> None:
    set_load_ticks(ax, loads, mode)
    if label:
        ax.set_xlabel(MODE_AXIS[mode])


def _loads(sweeps: Sequence[Sweep], mode: str) -> list[float]:
    return [float(p.load.value) for s in sweeps for p in _mode_points(s, mode)]


SWEEP_MARKERS = ("o", "s", "D", "^", "v", "P", "h", "<", ">", "p")


def marker_of(i: int) -> str:
    return SWEEP_MARKERS[i % len(SWEEP_MARKERS)]


def width_of(i: int) -> float:
    """Earlier sweeps draw wider lines, so a later sweep on the same values leaves a rim."""
    return max(1.4, 3.0 - 0.6 * i)


def _draw_metric(ax: Axes, sweep: Sweep, mode: str, getter: Getter, c: str, *,
                 linestyle: Any = "-", marker: str = "o", label: str | None = None,
                 invalid_labels: Labels | None = None, linewidth: float = 1.6) -> None:
    """Valid points joined by a line (the mean of repeats), thin points hollow, invalid points
    as crosses (optionally labelled with their reason)."""
    pts = _mode_points(sweep, mode)
    by_load: dict[float, list[float]] = {}
    for p in pts:
        y = getter(p)
        if y is None:
            continue
        x = float(p.load.value)
        if not p.valid:
            ax.plot([x], [y], marker="X", markersize=9, color=INVALID_COLOR,
                    markeredgecolor=c, markeredgewidth=1.2, linestyle="none", zorder=5)
            if invalid_labels is not None:
                invalid_labels.append((x, y, str(p.invalid_reason or "invalid")))
            continue
        by_load.setdefault(x, []).append(y)
        hollow = bool(p.thin)
        ax.plot([x], [y], marker=marker, markersize=5.5, color=c, linestyle="none",
                markerfacecolor="white" if hollow else c, markeredgewidth=1.2, zorder=4)
    if by_load:
        xs = sorted(by_load)
        ys = [sum(by_load[x]) / len(by_load[x]) for x in xs]
        ax.plot(xs, ys, linestyle=linestyle, color=c, linewidth=linewidth, label=label,
                zorder=3)


Labels = list[tuple[float, float, str]]


def _place_invalid_labels(ax: Axes, items: Labels) -> None:
    """Write each invalid point's reason beside it, wrapped, inside the axes: to the left of a
    point in the right half, below a point in the upper half."""
    if not items:
        return
    ax.get_xlim(), ax.get_ylim()  # settle the autoscaled limits first
    to_axes = ax.transAxes.inverted()
    for x, y, reason in items:
        fx, fy = to_axes.transform(ax.transData.transform((x, y)))
        right, high = fx > 0.55, fy > 0.5
        text = textwrap.fill(reason if len(reason) <= 90 else reason[:88] + "…", 26)
        ax.annotate(text, (x, y), xytext=(-9 if right else 9, -8 if high else 8),
                    textcoords="offset points", ha="right" if right else "left",
                    va="top" if high else "bottom", fontsize=7.5, color=INVALID_COLOR,
                    zorder=7, annotation_clip=True,
                    bbox={"boxstyle": "round,pad=0.2", "facecolor": "white", "alpha": 0.85,
                          "edgecolor": "none"})


def _log_y(ax: Axes) -> None:
    """Log scale with plain numbers (1,000 rather than 10^3) at 1-2-5 steps."""
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,.10g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _knee_of(sweep: Sweep, mode: str) -> Knee:
    return sweep.doc.knee if mode == "closed" else sweep.doc.knee_rate


def _knee_marks(ax: Axes, knee: Knee, c: str) -> None:
    meets, fails = number(knee.meets), number(knee.fails)
    if meets is not None and fails is not None:
        ax.axvspan(meets, fails, color=c, alpha=0.10, zorder=0)
    if meets is not None:
        ax.axvline(meets, color=c, linestyle="--", linewidth=1.1, zorder=1)
    if fails is not None:
        ax.axvline(fails, color=c, linestyle=":", linewidth=1.1, zorder=1)


def _knee_legend(sweep: Sweep, mode: str, c: str) -> Patch | None:
    knee = _knee_of(sweep, mode)
    if not _mode_points(sweep, mode):
        return None
    names = human.loads(mode, [knee.meets, knee.fails])
    m, f = number(knee.meets), number(knee.fails)
    meets = "none" if m is None else names[m]
    fails = "none" if f is None else names[f]
    return Patch(facecolor=c, alpha=0.25, edgecolor=c,
                 label=f"{sweep.label} {MODE_TITLE[mode]} knee: meets {meets}, "
                       f"fails {fails} {human.unit(mode)}")


def _common_handles(sweeps: Sequence[Sweep]) -> list[Any]:
    handles: list[Any] = [
        Line2D([], [], color=color(i), linewidth=2, marker=marker_of(i), label=s.label)
        for i, s in enumerate(sweeps)
    ]
    if any(p.thin and p.valid for s in sweeps for p in s.points):
        handles.append(Line2D([], [], marker="o", color="grey", markerfacecolor="white",
                              linestyle="none", label="thin: < 200 requests"))
    if any(not p.valid for s in sweeps for p in s.points):
        handles.append(Line2D([], [], marker="X", color=INVALID_COLOR, markeredgecolor="black",
                              markersize=8, linestyle="none",
                              label="invalid (left out of the knee)"))
    return handles


def _legend(fig: Figure, handles: list[Any], ncol: int = 3) -> None:
    if handles:
        fig.legend(handles=handles, loc="outside lower center", ncol=ncol)


def _empty(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="grey")


def _no_points_plot(key: str, title: str) -> Plot:
    fig, axes = _new_figure(1, 1, height_per_row=1.6)
    _empty(axes[0][0], "no points")
    axes[0][0].set_axis_off()
    return Plot(key, title, "No points to plot.", _svg_of(fig, key), fig)


def _slo_targets(sweeps: Sequence[Sweep], key: str) -> list[float]:
    return sorted({float(getattr(s.doc.slo, key)) for s in sweeps})


def goodput_plot(sweeps: Sequence[Sweep]) -> Plot:
    """Goodput (requests/s meeting the target) and attainment against load, per load mode,
    with each sweep's knee bracket and the target attainment."""
    key, title = "goodput", "Goodput and attainment against load"
    modes = modes_of(sweeps)
    if not modes:
        return _no_points_plot(key, title)
    with _style():
        fig, axes = _new_figure(len(modes), 2)
        knee_handles: list[Any] = []
        targets = _slo_targets(sweeps, "attainment")
        for col, mode in enumerate(modes):
            top, bottom = axes[0][col], axes[1][col]
            labels: Labels = []
            for i, s in enumerate(sweeps):
                c = color(i)
                knee = _knee_of(s, mode)
                for ax in (top, bottom):
                    _knee_marks(ax, knee, c)
                _draw_metric(top, s, mode, lambda p: number(p.goodput_rps), c,
                             marker=marker_of(i), linewidth=width_of(i))
                _draw_metric(bottom, s, mode, lambda p: number(p.attainment), c,
                             marker=marker_of(i), linewidth=width_of(i), invalid_labels=labels)
                handle = _knee_legend(s, mode, c)
                if handle is not None:
                    knee_handles.append(handle)
            for t in targets:
                bottom.axhline(t, color=SLO_COLOR, linestyle="--", linewidth=1.2, zorder=2)
            top.set_title(f"goodput at the target, {MODE_TITLE[mode]}")
            top.set_ylabel("goodput (requests/s meeting the target)")
            top.set_ylim(bottom=0)
            bottom.set_title(f"attainment, {MODE_TITLE[mode]}")
            bottom.set_ylabel("share of requests meeting the target")
            bottom.set_ylim(-0.02, 1.05)
            loads = _loads(sweeps, mode)
            _load_axis(top, loads, mode, label=False)
            _load_axis(bottom, loads, mode)
            _place_invalid_labels(bottom, labels)
        handles = _common_handles(sweeps)
        handles.append(Line2D([], [], color=SLO_COLOR, linestyle="--", label="target attainment "
                              + ", ".join(f"{t:g}" for t in targets)))
        handles.append(Line2D([], [], color="black", linestyle="--", label="knee: meets"))
        handles.append(Line2D([], [], color="black", linestyle=":", label="knee: fails"))
        _legend(fig, handles + knee_handles, ncol=3)
        svg = _svg_of(fig, key)
    caption = ("Goodput is the requests per second of the window that meet the target; "
               "attainment is their share of all the window's requests (shed and failed count "
               "as misses). The shaded band is each sweep's knee bracket: the dashed line is the "
               "highest load that meets the target attainment together with every lower load, "
               "the dotted line the next tested load, which fails.")
    return Plot(key, title, caption, svg, fig)


# (percentile key, line style, marker)
_TTFT_STYLES: tuple[tuple[str, Any, str], ...] = (
    ("p50", "-", "o"), ("p90", "--", "s"), ("p99", ":", "^"))
_ITL_STYLES: tuple[tuple[str, Any, str], ...] = (
    ("p50", "-", "o"), ("p99", "--", "^"), ("max", ":", "v"))


def latency_plot(sweeps: Sequence[Sweep]) -> Plot:
    """TTFT p50/p90/p99 and pooled ITL p50/p99/max against load, with the SLO lines."""
    key, title = "latency", "TTFT and inter-token latency against load"
    modes = modes_of(sweeps)
    if not modes:
        return _no_points_plot(key, title)
    ttft_t = _slo_targets(sweeps, "ttft_ms")
    tpot_t = _slo_targets(sweeps, "tpot_ms")
    stats = sorted({s.doc.slo.itl_stat for s in sweeps})
    with _style():
        fig, axes = _new_figure(len(modes), 2)
        for col, mode in enumerate(modes):
            top, bottom = axes[0][col], axes[1][col]
            for i, s in enumerate(sweeps):
                c = color(i)
                for q, ls, mk in _TTFT_STYLES:
                    _draw_metric(top, s, mode, _nested("ttft_ms", q), c, linestyle=ls,
                                 marker=mk)
                for q, ls, mk in _ITL_STYLES:
                    _draw_metric(bottom, s, mode, _nested("itl_ms", q), c, linestyle=ls,
                                 marker=mk)
            for t in ttft_t:
                top.axhline(t, color=SLO_COLOR, linestyle="--", linewidth=1.2)
            for t in tpot_t:
                bottom.axhline(t, color=SLO_COLOR, linestyle="--", linewidth=1.2)
            top.set_title(f"time to first token, {MODE_TITLE[mode]}")
            top.set_ylabel("TTFT (ms, model time)")
            bottom.set_title(f"inter-token latency (pooled), {MODE_TITLE[mode]}")
            bottom.set_ylabel("ITL (ms, model time)")
            for ax in (top, bottom):
                if _positive_data(ax):
                    _log_y(ax)
            loads = _loads(sweeps, mode)
            _load_axis(top, loads, mode, label=False)
            _load_axis(bottom, loads, mode)
        handles = _common_handles(sweeps)
        for q, ls, mk in _TTFT_STYLES:
            handles.append(Line2D([], [], color="dimgray", linestyle=ls, marker=mk,
                                  label=f"TTFT {q}"))
        for q, ls, mk in _ITL_STYLES:
            handles.append(Line2D([], [], color="dimgray", linestyle=ls, marker=mk,
                                  label=f"ITL {q}"))
        handles.append(Line2D([], [], color=SLO_COLOR, linestyle="--",
                              label="targets: TTFT " + ", ".join(f"{t:g}" for t in ttft_t)
                              + " ms; per token " + ", ".join(f"{t:g}" for t in tpot_t)
                              + " ms (" + ", ".join(stats) + ")"))
        _legend(fig, handles, ncol=4)
        svg = _svg_of(fig, key)
    caption = ("TTFT percentiles over the completed requests (from the scheduled time in open "
               "loop, the send time in closed loop) and the pooled inter-token gaps of every "
               "completed request (p50, p99, max). The per-token target applies to each "
               f"request's own statistic ({', '.join(stats)}); the pooled ITL p99 and max show "
               "the decode stalls that prefill-first scheduling causes. Log scale.")
    return Plot(key, title, caption, svg, fig)


def _positive_data(ax: Axes) -> bool:
    vals = [v for line in ax.get_lines()
            for v in np.asarray(line.get_ydata(), dtype=np.float64).tolist()
            if number(v) is not None]
    return bool(vals) and min(vals) > 0


def _nested(block: str, q: str) -> Getter:
    return lambda p: number(p.quantiles(block).get(q))


def throughput_plot(sweeps: Sequence[Sweep]) -> Plot:
    """Output tokens/s against load, the peak marked; the knee drawn for comparison."""
    key, title = "throughput", "Throughput against load (the peak is never the limit)"
    modes = modes_of(sweeps)
    if not modes:
        return _no_points_plot(key, title)
    with _style():
        fig, axes = _new_figure(len(modes), 1, height_per_row=3.8)
        for col, mode in enumerate(modes):
            ax = axes[0][col]
            for i, s in enumerate(sweeps):
                c = color(i)
                meets = number(_knee_of(s, mode).meets)
                if meets is not None:
                    ax.axvline(meets, color=c, linestyle="--", linewidth=1.1)
                _draw_metric(ax, s, mode, lambda p: number(p.output_tok_s), c,
                             marker=marker_of(i), linewidth=width_of(i))
                peak = s.doc.throughput_peak
                px, py = number(peak.load), number(peak.output_tok_s)
                if (peak.mode or "closed") == mode and px is not None and py is not None:
                    x, y = px, py
                    ax.plot([x], [y], marker="*", markersize=16, color=c,
                            markeredgecolor="black", linestyle="none", zorder=6)
                    ax.annotate(f"peak {y:,.0f} tok/s", (x, y), xytext=(-8, 10),
                                textcoords="offset points", ha="right", fontsize=8.5,
                                color=c, fontweight="bold")
            ax.set_title(f"output tokens per second, {MODE_TITLE[mode]}")
            ax.set_ylabel("output tok/s")
            ax.set_ylim(bottom=0)
            ax.margins(y=0.15)
            _load_axis(ax, _loads(sweeps, mode), mode)
        handles = _common_handles(sweeps)
        handles.append(Line2D([], [], marker="*", markersize=12, color="grey",
                              markeredgecolor="black", linestyle="none",
                              label="throughput peak (never the limit)"))
        handles.append(Line2D([], [], color="black", linestyle="--", label="knee: meets"))
        _legend(fig, handles, ncol=3)
        svg = _svg_of(fig, key)
    caption = ("Output tokens per second of the window. Throughput peaks at a load where the "
               "target is no longer met: the peak is reported to explain the limit, never used "
               "as the limit (that is the knee, dashed).")
    return Plot(key, title, caption, svg, fig)


def cache_plot(sweeps: Sequence[Sweep]) -> Plot:
    """The share of prompt tokens served from the prefix cache against load."""
    key, title = "cache", "Cached-token share against load"
    modes = modes_of(sweeps)
    if not modes:
        return _no_points_plot(key, title)
    with _style():
        fig, axes = _new_figure(len(modes), 1, height_per_row=3.2)
        for col, mode in enumerate(modes):
            ax = axes[0][col]
            for i, s in enumerate(sweeps):
                _draw_metric(ax, s, mode, lambda p: number(p.cached_token_share),
                             color(i), marker=marker_of(i), linewidth=width_of(i))
            ax.set_title(f"cached tokens / prompt tokens, {MODE_TITLE[mode]}")
            ax.set_ylabel("cached-token share")
            ax.set_ylim(-0.02, 1.05)
            _load_axis(ax, _loads(sweeps, mode), mode)
        _legend(fig, _common_handles(sweeps), ncol=4)
        svg = _svg_of(fig, key)
    caption = ("Prompt tokens served from the prefix cache, over the completed requests. With "
               "one shared system prompt it should stay high at every load; a drop means the "
               "pool evicts the shared prefix (or the prompt is not byte-identical).")
    return Plot(key, title, caption, svg, fig)


def _thin_out(ts: list[float], vs: list[float]) -> tuple[list[float], list[float]]:
    step = max(1, len(ts) // MAX_LINE_SAMPLES)
    return ts[::step], vs[::step]


def _run_label(p: SweepPoint) -> str:
    text = load_text(p.load)
    if p.run_index is not None:
        text = f"run {p.run_index}: {text}"
    if not p.valid:
        text += " (invalid)"
    return text


def _run_colors(n: int) -> list[Any]:
    cmap = matplotlib.colormaps["viridis"]
    return [cmap(0.9 * i / max(1, n - 1)) for i in range(n)]


def _timeline_panels(
    sweeps: Sequence[Sweep],
    series_of: Callable[[Sweep], dict[int, Series]],
    rows: Sequence[tuple[str, str, str]],
    key: str,
    title: str,
    caption: str,
    extra: Callable[[Axes, str, Sweep], None] | None = None,
) -> Plot | None:
    """One column per sweep holding run files, one row per (column key, panel title, y label),
    one line per run, coloured by load; times relative to the run's first sample."""
    shown = [s for s in sweeps if series_of(s)]
    if not shown:
        return None
    with _style():
        fig, axes = _new_figure(len(shown), len(rows), height_per_row=2.9)
        for col, s in enumerate(shown):
            runs = series_of(s)
            order = [i for i, _ in sorted(((i, s.points[i]) for i in runs),
                                          key=lambda ip: (ip[1].load.mode != "closed",
                                                          float(ip[1].load.value)))]
            colors = _run_colors(len(order))
            for r, (column, panel, ylabel) in enumerate(rows):
                ax = axes[r][col]
                for c, idx in zip(colors, order, strict=True):
                    p = s.points[idx]
                    ts, vs = runs[idx].column(column)
                    if not ts:
                        continue
                    t0 = runs[idx].t0
                    xs, ys = _thin_out([t - t0 for t in ts], vs)
                    ax.plot(xs, ys, color=c, linewidth=1.1,
                            linestyle="-" if p.valid else "--",
                            label=_run_label(p) if r == 0 else None)
                if extra is not None:
                    extra(ax, column, s)
                ax.set_title(f"{s.label}: {panel}")
                ax.set_ylabel(ylabel)
                if r == len(rows) - 1:
                    ax.set_xlabel("model seconds since the run's first sample")
                if not ax.get_lines():
                    _empty(ax, f"no {column} samples")
            handles, labels = [], []
            for r in range(len(rows)):
                h, lab = axes[r][col].get_legend_handles_labels()
                handles += h
                labels += lab
            if handles:
                axes[-1][col].legend(handles, labels, fontsize=7.5, ncol=3, loc="upper center",
                                     bbox_to_anchor=(0.5, -0.28))
        svg = _svg_of(fig, key)
    return Plot(key, title, caption, svg, fig)


def telemetry_plot(sweeps: Sequence[Sweep]) -> Plot | None:
    """Per-run SM clock and temperature timelines from the telemetry files, with the clock
    floor and the samples in thermal slowdown. None when no sweep has telemetry files."""

    def extra(ax: Axes, column: str, s: Sweep) -> None:
        if column == "sm_clock_mhz":
            labelled = False
            for series in s.telemetry.values():
                t0 = series.t0
                xy = [(t - t0, v) for row in series.rows if row.get("thermal_slowdown")
                      if (t := number(row.get("t"))) is not None
                      and (v := number(row.get("sm_clock_mhz"))) is not None]
                if xy:
                    ax.plot([x for x, _ in xy], [y for _, y in xy], linestyle="none",
                            marker=".", markersize=3, color=INVALID_COLOR, zorder=5,
                            label=None if labelled else "thermal slowdown")
                    labelled = True
            floors = sorted({f for p in s.points if p.live is not None
                             and (f := number(p.live.clock_floor_mhz)) is not None})
            for f in floors:
                ax.axhline(f, color=SLO_COLOR, linestyle="--", linewidth=1.3,
                           label=f"clock floor {f:,.0f} MHz")
            ax.set_ylim(bottom=0)

    caption = ("SM clock and GPU temperature of every run, from runs/NNN/telemetry.jsonl (one "
               "line per run, coloured by load; dashed: an invalid run). Red dots are samples in "
               "thermal slowdown; the dashed red line is the clock floor under which a run is "
               "set aside. Times are model seconds from the run's first sample.")
    return _timeline_panels(
        sweeps, lambda s: s.telemetry,
        (("sm_clock_mhz", "SM clock", "SM clock (MHz)"), ("temp_c", "temperature", "°C")),
        "telemetry", "GPU clock and temperature per run", caption, extra)


def engine_plot(sweeps: Sequence[Sweep]) -> Plot | None:
    """Per-run engine scrapes: running and queued requests and KV token usage over time."""
    caption = ("The engine's running requests, waiting queue and KV pool usage as scraped "
               "during each run (runs/NNN/engine.jsonl), one line per run, coloured by load.")
    return _timeline_panels(
        sweeps, lambda s: s.engine,
        (("running", "running requests", "running"), ("queue", "waiting queue", "queued"),
         ("token_usage", "KV token usage", "share of the pool")),
        "engine", "Engine state per run", caption)


def all_plots(sweeps: Sequence[Sweep]) -> list[Plot]:
    """Every plot of the report, in order (the timelines only when run files exist)."""
    plots = [goodput_plot(sweeps), latency_plot(sweeps), throughput_plot(sweeps)]
    tele = telemetry_plot(sweeps)
    if tele is not None:
        plots.append(tele)
    plots.append(cache_plot(sweeps))
    eng = engine_plot(sweeps)
    if eng is not None:
        plots.append(eng)
    return plots
