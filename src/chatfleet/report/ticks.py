"""Load-axis ticks people can read: every tested load is marked on the axis, but only the loads
whose labels fit side by side are written.

A knee bisected to one user puts 24, 25, 26 and 28 next to each other on a log axis that runs
from 1 to 64; written all at once the labels run together ("2426 28"). So the tested loads are
ranked (the axis's two ends first, then the grid's round values: powers of two and 1-2-5
decades, then the rest by fewest significant digits) and taken in that order while a label
keeps clear of those already written; the others keep a tick mark without a label (a minor
tick). The widths are the renderer's own, measured once the figure is laid out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator

from chatfleet.report import human

GAP_EM = 0.6  # the least space between two written labels, in the label font's size
MINOR_TICK_LENGTH = 4.0  # points: an unlabelled tested load is still marked


class LoadTicks(FixedLocator):
    """The tested loads of one axis, every one a tick; `thin_labels` writes those that fit."""

    def __init__(self, loads: Sequence[float], mode: str) -> None:
        super().__init__(list(loads))
        self.loads = list(loads)
        self.mode = mode


def set_load_ticks(ax: Axes, loads: Sequence[float], mode: str) -> None:
    """A log axis when the loads span a factor of 8 or more; a tick at every tested load,
    labelled for people (users as whole numbers, rates to two significant figures, told
    apart). Call `thin_labels(fig)` once the figure is drawn to drop the labels that collide."""
    xs = sorted({x for x in loads if x > 0})
    if xs and xs[-1] / xs[0] >= 8:
        ax.set_xscale("log", base=2 if mode == "closed" else 10)
    if not xs:
        return
    labels = human.loads(mode, xs)
    ax.xaxis.set_major_locator(LoadTicks(xs, mode))
    ax.xaxis.set_major_formatter(FuncFormatter(
        lambda v, _pos: labels.get(float(v)) or human.load(mode, v)))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_minor_formatter(NullFormatter())


def is_round(x: float) -> bool:
    """A value a grid is made of: a power of two (0.25, 1, 2, 64) or 1, 2, 5 times a power
    of ten (0.5, 10, 200)."""
    if x <= 0:
        return False
    if abs(math.log2(x) - round(math.log2(x))) < 1e-9:
        return True
    mantissa = x / 10 ** math.floor(math.log10(x))
    return any(abs(mantissa - m) < 1e-9 for m in (1.0, 2.0, 5.0))


def _digits(label: str) -> int:
    return len(label.replace(",", "").replace(".", "").lstrip("0-")) or 1


def _trailing_zero_bits(x: float) -> int:
    n = round(x)
    if n <= 0 or abs(x - n) > 1e-9:
        return 0
    return (n & -n).bit_length() - 1


def label_order(loads: Sequence[float], labels: Sequence[str]) -> list[int]:
    """Indices of `loads` (sorted ascending) in the order their labels are written: both ends,
    then round values, then fewer significant digits, then more factors of two (24 before 26),
    then by load."""
    last = len(loads) - 1

    def key(i: int) -> tuple[int, int, int, int, float]:
        x = loads[i]
        return (0 if i in (0, last) else 1, 0 if is_round(x) else 1, _digits(labels[i]),
                -_trailing_zero_bits(x), x)

    return sorted(range(len(loads)), key=key)


def choose_labelled(centers: Sequence[float], widths: Sequence[float], order: Sequence[int],
                    gap: float) -> list[int]:
    """The indices to label, taken in `order` while each label (centred at `centers[i]`,
    `widths[i]` wide) stays at least `gap` clear of every label already taken; sorted."""
    kept: list[int] = []
    for i in order:
        if all(abs(centers[i] - centers[j]) >= (widths[i] + widths[j]) / 2 + gap for j in kept):
            kept.append(i)
    return sorted(kept)


def thin_labels(fig: Figure) -> None:
    """On every load axis of `fig` (set with `set_load_ticks`), keep the labels that fit and
    turn the other tested loads into unlabelled (minor) ticks."""
    axes = [ax for ax in fig.axes if isinstance(ax.xaxis.get_major_locator(), LoadTicks)]
    if not axes:
        return
    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    fig.draw_without_rendering()
    renderer = canvas.get_renderer()  # type: ignore[no-untyped-call]
    for ax in axes:
        locator = ax.xaxis.get_major_locator()
        assert isinstance(locator, LoadTicks)
        lo, hi = sorted(ax.get_xlim())
        loads = [x for x in locator.loads if lo <= x <= hi]
        if not loads:
            continue
        formatter = ax.xaxis.get_major_formatter()
        labels = [formatter(x, i) for i, x in enumerate(loads)]
        written = ax.xaxis.get_ticklabels()
        props = (written[0] if written else ax.xaxis.label).get_fontproperties()
        widths = [renderer.get_text_width_height_descent(t, props, ismath=False)[0]
                  for t in labels]
        centers = [float(ax.transData.transform((x, 0.0))[0]) for x in loads]
        gap = GAP_EM * props.get_size_in_points() * fig.dpi / 72.0
        keep = choose_labelled(centers, widths, label_order(loads, labels), gap)
        kept = [loads[i] for i in keep]
        rest = [x for x in locator.loads if x not in kept]
        ax.xaxis.set_major_locator(FixedLocator(kept))
        ax.xaxis.set_minor_locator(FixedLocator(rest) if rest else NullLocator())
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.tick_params(axis="x", which="minor", length=MINOR_TICK_LENGTH)
