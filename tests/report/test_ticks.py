"""Load axes people can read: bisected knees put loads side by side (24, 25, 26, 28), and their
labels must not run together; every tested load keeps its tick mark."""

from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Text

from chatfleet.core.documents.sweep import SweepPoint
from chatfleet.core.measure.knee import sweep_document
from chatfleet.core.slo import SLO
from chatfleet.report.build import load_sweeps
from chatfleet.report.plots import all_plots, goodput_plot
from chatfleet.report.ticks import choose_labelled, is_round, label_order
from tests.report.synth import make_point, target

# a twin grid with its closed-loop knee bisected to one user and its open-loop knee to 10%
BISECTED_USERS = (1, 2, 4, 8, 16, 24, 25, 26, 28, 32, 48, 64)
BISECTED_RATES = (0.125, 0.25, 0.28125, 0.296875, 0.3125, 0.375, 0.5, 1.0, 2.0, 4.0)


def bisected_sweep(tmp_path: Path, name: str = "bisected.json", speed: float = 3.0) -> Path:
    loads: list[dict[str, Any]] = [{"mode": "closed", "concurrency": c} for c in BISECTED_USERS]
    loads += [{"mode": "open", "rate_rps": r} for r in BISECTED_RATES]
    points = [make_point(load, speed=speed, run_index=i) for i, load in enumerate(loads)]
    for p in points:
        del p["files"]
    path = tmp_path / name
    doc = sweep_document(target("fp8"), {}, SLO(), [SweepPoint.from_json(p) for p in points])
    path.write_text(json.dumps(doc.to_json()))
    return path


def written_labels(fig: Figure) -> tuple[Any, list[tuple[Axes, list[Text]]]]:
    """The renderer and, for every axes, its written x tick labels, after a draw."""
    canvas = FigureCanvasAgg(fig)
    fig.draw_without_rendering()
    renderer = canvas.get_renderer()
    return renderer, [(ax, [t for t in ax.xaxis.get_ticklabels(which="both")
                            if t.get_visible() and t.get_text()]) for ax in fig.axes]


def overlapping(labels: list[Text], renderer: Any) -> list[tuple[str, str]]:
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in labels]
    return [(a, b) for i, (a, ba) in enumerate(boxes) for b, bb in boxes[i + 1:]
            if ba.overlaps(bb)]


def test_bisected_loads_get_labels_that_do_not_overlap(tmp_path: Path) -> None:
    sweeps = load_sweeps([bisected_sweep(tmp_path)])
    ends = {"closed": {"1", "64"}, "open": {"0.125", "4"}}
    for plot in all_plots(sweeps):
        assert plot.figure is not None
        renderer, drawn = written_labels(plot.figure)
        load_axes = 0
        for ax, labels in drawn:
            mode = "closed" if "closed loop" in ax.get_title() else "open"
            tested = set(BISECTED_USERS) if mode == "closed" else set(BISECTED_RATES)
            ticks = set(ax.xaxis.get_majorticklocs()) | set(ax.xaxis.get_minorticklocs())
            if not ticks & tested:
                continue
            load_axes += 1
            texts = [t.get_text() for t in labels]
            where = (plot.key, ax.get_title(), texts)
            assert overlapping(labels, renderer) == [], where
            assert tested <= ticks, where  # every tested load is still marked
            assert ends[mode] <= set(texts), where  # the axis's range is written
            assert len(texts) < len(tested), where  # ... the crowded refined ones are not
            assert all(len(t) <= 5 for t in texts), where  # rounded: no 0.296875
        assert load_axes == 4 if plot.key in ("goodput", "latency") else load_axes == 2


def test_the_knee_bracket_is_written_and_the_refined_loads_only_marked(tmp_path: Path) -> None:
    plot = goodput_plot(load_sweeps([bisected_sweep(tmp_path)]))
    assert plot.figure is not None
    _, drawn = written_labels(plot.figure)
    titles = {ax.get_title(): (ax, [t.get_text() for t in labels]) for ax, labels in drawn}
    ax, texts = titles["attainment, closed loop"]
    assert {"16", "24", "32"} <= set(texts), texts
    assert "25" not in texts and "26" not in texts  # one user from 24: marked only
    assert {25.0, 26.0} <= set(ax.xaxis.get_minorticklocs())
    ax, texts = titles["attainment, open loop"]
    assert "0.296875" not in texts and "0.3125" not in texts


def test_the_rule_takes_ends_and_round_values_first_and_keeps_labels_apart() -> None:
    loads = [1.0, 2.0, 4.0, 8.0, 16.0, 24.0, 25.0, 26.0, 28.0, 32.0, 64.0]
    labels = [f"{x:g}" for x in loads]
    order = label_order(loads, labels)
    assert [loads[i] for i in order[:2]] == [1.0, 64.0]
    assert sorted(loads[i] for i in order[2:7]) == [2.0, 4.0, 8.0, 16.0, 32.0]  # round
    assert [loads[i] for i in order[7:]] == [24.0, 28.0, 26.0, 25.0]  # more factors of two
    # on a crowded axis: 12 px wide labels centred 10 px apart take every other one
    centers = [10.0 * i for i in range(len(loads))]
    kept = choose_labelled(centers, [12.0] * len(loads), order, gap=4.0)
    assert all(b - a >= 2 for a, b in pairwise(kept))  # no two neighbours
    assert 0 in kept and len(loads) - 1 in kept
    # with room for all, all are written
    assert choose_labelled([40.0 * i for i in range(len(loads))], [12.0] * len(loads),
                           order, gap=4.0) == list(range(len(loads)))


@pytest.mark.parametrize(("x", "round_"), [(0.125, True), (0.5, True), (64.0, True),
                                           (200.0, True), (24.0, False), (0.296875, False),
                                           (1.375, False)])
def test_round_values_are_the_grid_ones(x: float, round_: bool) -> None:
    assert is_round(x) is round_
