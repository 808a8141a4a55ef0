"""experiments/plots.py: what a table's plot shows is never cut at the figure's edges."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from experiments import plots


def _inside(figure: object, artist: object) -> bool:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(figure).get_renderer()  # type: ignore[arg-type]
    box = artist.get_window_extent(renderer=renderer)  # type: ignore[attr-defined]
    return bool(box.x0 >= -0.5 and box.x1 <= figure.bbox.width + 0.5)  # type: ignore[attr-defined]


@pytest.mark.parametrize("panels", [1, 3])
def test_a_legend_of_long_labels_fits_the_figure(tmp_path: Path, panels: int) -> None:
    """One narrow panel (an lr search) or a line of three, whose rows have long names: the legend under
    the panels is within the figure (fewer columns, else a wider figure), not cut at both sides."""
    figure, axes, first = plots.panel_grid(panels, 4.0, 3.0)
    names = ["PerFIT, ranks 8/12/16, pathological", "PerFIT s = 0.5, 2nd-order importance, pathological"]
    names += ["PerFIT s = 0.5, mixed importance, pathological"]
    for ax in axes:
        for i, name in enumerate(names):
            ax.plot([1e-3, 1e-2], [i, i + 1], label=name)
    path = plots.finish_grid(
        figure, axes, first, xlabel="lr", ylabel="ppl", title="t", path=tmp_path / "a.png"
    )
    assert path.read_bytes().startswith(b"\x89PNG")
    (legend,) = figure.legends
    assert [text.get_text() for text in legend.get_texts()] == names
    assert _inside(figure, legend)


def test_an_lr_axis_is_labelled_at_the_lrs_searched_and_a_diverged_perplexity_keeps_the_rest_readable(
    tmp_path: Path,
) -> None:
    """A search over 2e-3 ... 5e-2 (less than two decades): matplotlib labels the log axis's minor ticks
    too, and their labels run into each other; the axis is labelled at the lrs searched instead. With
    ``log_y`` (perplexity, one lr diverged to 12,000 beside values near 20) the y axis is logarithmic."""
    lrs = [2e-3, 5e-3, 1e-2, 2e-2, 5e-2]
    figure, axes, first = plots.panel_grid(2, 4.2, 3.2)
    for ax in axes:
        ax.errorbar(lrs, [25.0, 23.0, 22.0, 21.0, 12402.0], yerr=[0.0] * 5, marker="o", label="FedBiOT")
    plots.finish_grid(
        figure,
        axes,
        first,
        xlabel="lr",
        ylabel="ppl",
        title="t",
        path=tmp_path / "a.png",
        log_x=True,
        log_y=True,
    )
    for ax in axes:
        assert [float(x) for x in ax.get_xticks()] == pytest.approx(lrs)
        assert [label.get_text() for label in ax.get_xticklabels()] == [
            "0.002",
            "0.005",
            "0.01",
            "0.02",
            "0.05",
        ]
        assert not [label.get_text() for label in ax.get_xticklabels(minor=True) if label.get_text()]
        assert ax.get_yscale() == "log"


def test_a_tables_row_names_under_its_panel_do_not_run_into_each_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A FedMKT table's seven rows under one panel: each row's name ("Commoner answer", "LLM on public
    set", "SLMs + public CE") stays clear of its neighbours' (wrapped onto lines of its own)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    saved: list[object] = []
    monkeypatch.setattr(plots, "save_figure", lambda figure, path, dpi=120: saved.append(figure) or path)
    ticks = ["Commoner answer", "Zero-shot", "Standalone", "Centralized", "LLM on public set"]
    ticks += ["SLMs + public CE", "FedMKT"]
    series = plots.Series("LLM", "C0", "o", 0.0, [[0.5, 0.6]] * len(ticks))
    panel = plots.Panel("wic, hetero2 (3 seeds)", ticks, [series])
    plots.seed_panels([panel], width=4.6, height=3.4, ylabel="score", title="t", path=tmp_path / "a.png")
    (figure,) = saved
    renderer = FigureCanvasAgg(figure).get_renderer()  # type: ignore[arg-type]
    (ax,) = figure.axes  # type: ignore[attr-defined]
    labels = ax.get_xticklabels()
    assert [label.get_text().replace("\n", " ") for label in labels] == ticks
    boxes = [label.get_window_extent(renderer=renderer) for label in labels]
    for left, right in itertools.pairwise(boxes):
        assert left.x1 < right.x0, (left, right)
