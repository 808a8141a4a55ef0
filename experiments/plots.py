"""The plots of the paper tables: a grid of panels, each row's seeds as a marker with whiskers and faint
dots (differences of a few points, which bars would hide), a title that is never cut, the figure saved."""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiments.tables import mean_std


def panel_grid(
    count: int, width: float, height: float, margin: float = 0.6
) -> tuple[Any, list[Any], list[Any]]:
    """A figure of ``count`` panels of ``width`` x ``height`` inches, three at most a line (``margin``:
    inches for the title and legend): the figure, its panels in order, the first panel of each line."""
    from matplotlib.figure import Figure

    cols = min(3, count)
    lines = -(-count // cols)
    figure = Figure(figsize=(1.0 + width * cols, margin + height * lines), layout="constrained")
    grid = figure.subplots(lines, cols, squeeze=False)
    axes = [ax for line in grid for ax in line]
    for spare in axes[count:]:
        spare.set_visible(False)
    return figure, axes[:count], [line[0] for line in grid]


def seed_markers(
    ax: Any, xs: Sequence[float], columns: Sequence[Iterable[float]], *, colour: str, marker: str, label: str
) -> None:
    """At each x, the mean ± std of its values as a marker with whiskers and each value (seed) as a faint
    dot beside it: differences of a few points, which bars would hide. An x without values is left out."""
    shown = [(x, list(values)) for x, values in zip(xs, columns, strict=True)]
    shown = [(x, values) for x, values in shown if values]
    stats = [mean_std(values) for _, values in shown]
    ax.errorbar(
        [x for x, _ in shown],
        [mean for mean, _ in stats],
        yerr=[std for _, std in stats],
        fmt=marker,
        color=colour,
        capsize=4,
        markersize=7,
        label=label,
    )
    dots = [(x + 0.05, value) for x, values in shown for value in values]
    if dots:
        ax.scatter(*zip(*dots, strict=True), s=10, color=colour, alpha=0.45, zorder=3)


def finish_grid(
    figure: Any,
    axes: Sequence[Any],
    first: Sequence[Any],
    *,
    xlabel: str,
    ylabel: str,
    title: str,
    path: Path,
    log_x: bool = False,
    log_y: bool = False,
) -> Path:
    """Finish a `panel_grid` of curves (against a log x axis with ``log_x``, labelled at the x values the
    curves have; a log y axis with ``log_y``): axis labels, grid, one legend under the panels (from the
    first), the title; save to ``path``."""
    for ax in axes:
        if log_x:
            ax.set_xscale("log")
            label_at_points(ax)
        if log_y:
            ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.grid(True, alpha=0.3)
    for ax in first:
        ax.set_ylabel(ylabel)
    handles, labels = axes[0].get_legend_handles_labels()
    ncols = max(1, len(labels) if len(axes) > 1 else min(2, len(labels)))  # one panel: two a line, to fit
    legend_under(figure, handles, labels, ncols)
    suptitle(figure, title)
    return save_figure(figure, path)


def label_at_points(ax: Any) -> None:
    """Tick and label a log x axis at the x values its curves have (the lrs or alphas searched) and at no
    others: over less than two decades matplotlib also labels the minor ticks, and the labels overlap."""
    from matplotlib.ticker import NullLocator

    points = sorted({float(x) for line in ax.get_lines() for x in line.get_xdata()})
    if points:
        ax.set_xticks(points, [f"{x:g}" for x in points])
        ax.xaxis.set_minor_locator(NullLocator())


def legend_under(figure: Any, handles: Sequence[Any], labels: Sequence[str], ncols: int) -> None:
    """One legend under the panels, ``ncols`` entries a line where that fits the figure's width, else one a
    line, widening the figure where even that is wider than it: long row names are never cut at the
    edges."""
    legend = figure.legend(handles, labels, loc="outside lower center", ncols=ncols, frameon=False)
    if ncols > 1 and _width_needed(figure, legend) > figure.get_figwidth():
        legend.remove()
        legend = figure.legend(handles, labels, loc="outside lower center", ncols=1, frameon=False)
    needed = _width_needed(figure, legend)
    if needed > figure.get_figwidth():
        figure.set_figwidth(needed)


def _width_needed(figure: Any, artist: Any) -> float:
    """The width in inches ``artist`` takes in ``figure``, with a margin."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(figure).get_renderer()
    return float(artist.get_window_extent(renderer=renderer).width / figure.dpi + 0.3)


def suptitle(figure: Any, text: str, fontsize: float | None = 10) -> None:
    """Title ``figure`` with ``text``, widening the figure where the title is wider than it (one narrow
    panel under a long title), so the title is never cut at the edges. ``fontsize`` None: matplotlib's."""
    title = figure.suptitle(text) if fontsize is None else figure.suptitle(text, fontsize=fontsize)
    needed = _width_needed(figure, title)
    if needed > figure.get_figwidth():
        figure.set_figwidth(needed)


def save_figure(figure: Any, path: Path, dpi: int = 120) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=dpi)
    return path


@dataclass(frozen=True)
class Series:
    """One series of a `Panel`: at each of the panel's ticks (shifted by ``shift``) the values of its
    seeds, ``columns`` (one per tick), as `seed_markers`."""

    label: str
    colour: str
    marker: str
    shift: float
    columns: Sequence[Iterable[float]]


@dataclass(frozen=True)
class Panel:
    """A panel of a table's plot: a row per tick, each ``series`` a marker per row."""

    title: str
    ticks: Sequence[str]
    series: Sequence[Series]


# characters a line of a row's name under a panel: longer names wrap at their spaces, so that names of
# seven rows under one panel stay clear of each other
TICK_WIDTH = 11


def seed_panels(
    panels: Sequence[Panel],
    *,
    width: float,
    height: float,
    ylabel: str,
    title: str,
    path: Path,
    margin: float = 0.6,
    legend_in_panels: bool = False,
) -> Path:
    """A table's plot: a `panel_grid` of ``panels``, each row's seeds as `seed_markers`, one legend under
    the panels (each panel its own with ``legend_in_panels``: their series differ); saved to ``path``."""
    figure, axes, first = panel_grid(len(panels), width, height, margin=margin)
    for ax, panel in zip(axes, panels, strict=True):
        xs = range(len(panel.ticks))
        for series in panel.series:
            shifted = [x + series.shift for x in xs]
            plot_args = {"colour": series.colour, "marker": series.marker, "label": series.label}
            seed_markers(ax, shifted, series.columns, **plot_args)
        names = [textwrap.fill(tick, TICK_WIDTH, break_long_words=False) for tick in panel.ticks]
        ax.set_xticks(xs, names, fontsize=7.5)
        ax.set_xlim(-0.5, len(panel.ticks) - 0.5)
        ax.set_title(panel.title, fontsize=9)
        ax.grid(True, axis="y", alpha=0.3)
        if legend_in_panels:
            ax.legend(fontsize=7, frameon=False)
    for ax in first:
        ax.set_ylabel(ylabel)
    if not legend_in_panels:
        handles, labels = axes[0].get_legend_handles_labels()
        legend_under(figure, handles, labels, ncols=2)
    suptitle(figure, title)
    return save_figure(figure, path)
