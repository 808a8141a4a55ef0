"""PNG figures for a run report.

Figures are built on ``matplotlib.figure.Figure`` rather than pyplot so that no GUI backend is
ever selected and no global figure registry grows when many reports are written in one process.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.colors import Colormap
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from fedtune.report.io import CategoryCounts, MetricsRow
from fedtune.report.tables import categories_of, natural_sort_key
from fedtune.units import BYTES_PER_MB

DPI = 120
BEFORE_COLOUR = "#9e9e9e"
FINAL_COLOUR = "#1f77b4"

# A series of (round, value) points; one per line in a learning-curve subplot.
Curve = list[tuple[int, float]]


def train_loss_curve(rows: Sequence[MetricsRow]) -> Curve:
    return [(row["round"], row["train_loss"]) for row in rows if row.get("train_loss") is not None]


def eval_curve(rows: Sequence[MetricsRow], metric: str) -> Curve:
    return [(row["round"], row["eval"][metric]) for row in rows if metric in (row.get("eval") or {})]


def eval_metric_names(rows: Sequence[MetricsRow]) -> list[str]:
    """Metric names in the order the runner first reported them."""
    names: dict[str, None] = {}
    for row in rows:
        names.update(dict.fromkeys(row.get("eval") or {}))
    return list(names)


def _save(figure: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=DPI)
    return path


def _subplot_grid(
    count: int, width: float, height: float, extra_height: float = 0.0
) -> tuple[Figure, list[Axes]]:
    """``count`` subplots in rows of at most three, ``extra_height`` inches under them (for a legend);
    unused cells are hidden."""
    columns = 2 if count == 4 else min(count, 3)
    rows = math.ceil(count / columns)
    figure = Figure(figsize=(width * columns, height * rows + extra_height), layout="constrained")
    grid = figure.subplots(rows, columns, squeeze=False)
    axes = [ax for row in grid for ax in row]
    for unused in axes[count:]:
        unused.set_visible(False)
    return figure, axes[:count]


def _style_round_axis(ax: Axes, ylabel: str, title: str, last_round: int) -> None:
    ax.set_title(title)
    # One x-range for every subplot, so train loss (from round 1) and eval (from round 0) line up.
    ax.set_xlim(-0.5, last_round + 0.5)
    ax.set_xlabel("Round")
    ax.set_ylabel(ylabel)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))
    ax.grid(True, alpha=0.3)


def _draw_curves(ax: Axes, curves: dict[str, Curve], colours: dict[str, str]) -> None:
    for label, curve in curves.items():
        if curve:
            rounds, values = zip(*curve, strict=True)
            ax.plot(rounds, values, marker="o", markersize=3, linewidth=1.5, color=colours[label])
    if not any(curves.values()):
        ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center", color="grey")


def plot_learning_curves(runs: Mapping[str, Sequence[MetricsRow]], path: Path, title: str) -> Path:
    """Train loss per round and each eval metric per eval round, one subplot each.

    With more than one run the curves are overlaid and labelled by run name.
    """
    metrics: dict[str, None] = {}
    for rows in runs.values():
        metrics.update(dict.fromkeys(eval_metric_names(rows)))
    last_round = max(row["round"] for rows in runs.values() for row in rows)
    figure, axes = _subplot_grid(1 + len(metrics), width=4.2, height=3.0)
    # Fixed colours per run: a run absent from one subplot must not shift the colours of the others.
    colours = {name: f"C{i % 10}" for i, name in enumerate(runs)}
    _draw_curves(axes[0], {name: train_loss_curve(rows) for name, rows in runs.items()}, colours)
    _style_round_axis(axes[0], "Loss (nats/token)", "Train loss", last_round)
    for ax, metric in zip(axes[1:], metrics, strict=True):
        _draw_curves(ax, {name: eval_curve(rows, metric) for name, rows in runs.items()}, colours)
        _style_round_axis(ax, metric, f"Eval {metric}", last_round)
    figure.suptitle(title)
    if len(runs) > 1:
        handles = [Line2D([], [], color=colours[name], marker="o", markersize=3, label=name) for name in runs]
        figure.legend(handles=handles, loc="outside lower center", ncols=min(len(runs), 4))
    return _save(figure, path)


def plot_category_scores(
    before: dict[str, dict[str, float]],
    final: dict[str, dict[str, float]],
    path: Path,
    title: str,
    labels: Mapping[str, str] | None = None,
) -> Path:
    """Grouped bars per category, before training vs after the last eval round, one subplot per metric.

    ``before`` and ``final`` map metric -> category -> score; ``before`` may be empty when the
    run did not evaluate at round 0. ``labels`` names the categories on the axis (e.g. with their
    evaluation counts, and ``*`` for a category no client trained on).
    """
    metrics = list(dict.fromkeys([*final, *before]))
    categories = sorted({c for scores in [*before.values(), *final.values()] for c in scores})
    width = max(4.2, 0.45 * len(categories) + 1.5)
    figure, axes = _subplot_grid(len(metrics), width=width, height=3.4)
    for ax, metric in zip(axes, metrics, strict=True):
        _draw_grouped_bars(ax, categories, before.get(metric, {}), final.get(metric, {}), labels or {})
        ax.set_title(metric)
        ax.set_ylabel(f"{metric} (score)")
        ax.grid(True, axis="y", alpha=0.3)
        ax.set_axisbelow(True)
        # Headroom above the tallest bar keeps the legend from covering any of them.
        ax.set_ylim(top=ax.get_ylim()[1] * 1.2)
        ax.legend(loc="upper left", ncols=2, fontsize="small", frameon=False)
    if labels and any(label.endswith("*") for label in labels.values()):
        figure.text(0.01, 0.01, "* in no client's training data", fontsize="small")
    figure.suptitle(title)
    return _save(figure, path)


def _draw_grouped_bars(
    ax: Axes,
    categories: list[str],
    before: dict[str, float],
    final: dict[str, float],
    labels: Mapping[str, str],
) -> None:
    positions = range(len(categories))
    bar_width = 0.4 if before else 0.7
    if before:
        ax.bar(
            [p - bar_width / 2 for p in positions],
            [before.get(c, math.nan) for c in categories],
            bar_width,
            label="before",
            color=BEFORE_COLOUR,
        )
    offset = bar_width / 2 if before else 0.0
    ax.bar(
        [p + offset for p in positions],
        [final.get(c, math.nan) for c in categories],
        bar_width,
        label="final",
        color=FINAL_COLOUR,
    )
    names = [labels.get(c, c) for c in categories]
    ax.set_xticks(list(positions), names, rotation=35, ha="right", rotation_mode="anchor")


def plot_bytes_per_round(rows: Sequence[MetricsRow], path: Path, title: str) -> Path:
    """Stacked upload/download MB per round, with the cumulative total on a second y-axis."""
    trained = [row for row in rows if row["round"] > 0]
    rounds = [row["round"] for row in trained]
    up = [row.get("bytes_up", 0) / BYTES_PER_MB for row in trained]
    down = [row.get("bytes_down", 0) / BYTES_PER_MB for row in trained]
    cumulative = _running_sum([u + d for u, d in zip(up, down, strict=True)])
    figure = Figure(figsize=(min(max(5.5, 0.12 * len(rounds) + 4.0), 11.0), 3.8), layout="constrained")
    ax = figure.subplots()
    ax.bar(rounds, up, label="upload (clients → server)", color="#ff7f0e")
    ax.bar(rounds, down, bottom=up, label="download (server → clients)", color="#1f77b4")
    _style_round_axis(ax, "MB per round", title, rounds[-1])
    ax.set_xlim(rounds[0] - 0.6, rounds[-1] + 0.6)
    ax.set_axisbelow(True)
    total_ax = ax.twinx()
    total_ax.plot(rounds, cumulative, color="black", marker=".", linewidth=1.5, label="cumulative total")
    total_ax.set_ylabel("Cumulative MB")
    total_ax.set_ylim(bottom=0)
    handles, labels = ax.get_legend_handles_labels()
    total_handles, total_labels = total_ax.get_legend_handles_labels()
    figure.legend(
        handles + total_handles, labels + total_labels, loc="outside lower center", ncols=3, fontsize="small"
    )
    return _save(figure, path)


def _running_sum(values: list[float]) -> list[float]:
    sums: list[float] = []
    for value in values:
        sums.append((sums[-1] if sums else 0.0) + value)
    return sums


def plot_partition(counts: CategoryCounts, path: Path, title: str) -> Path:
    """Examples per client as horizontal bars stacked by category (cf. FedPT, Figures 8-9).

    Bar height and label size shrink with the number of clients so that 4 to 100 clients
    all stay readable; the legend sits outside the axes so it never hides a bar.
    """
    if not counts:
        raise ValueError(f"{title}: no clients to plot")
    clients = sorted(counts, key=natural_sort_key)
    categories = categories_of(counts)
    colours = _category_colours(len(categories))
    figure = Figure(figsize=(7.5, min(0.9 + 0.2 * len(clients), 20.0) + 0.8), layout="constrained")
    ax = figure.subplots()
    left = [0] * len(clients)
    for category, colour in zip(categories, colours, strict=True):
        widths = [counts[client].get(category, 0) for client in clients]
        ax.barh(clients, widths, left=left, height=0.8, color=colour, label=category)
        left = [offset + width for offset, width in zip(left, widths, strict=True)]
    ax.set_xlim(0, max(*left, 1) * 1.03)
    ax.invert_yaxis()
    ax.tick_params(axis="y", labelsize=_client_label_size(len(clients)))
    ax.margins(y=0.01)
    ax.set_xlabel("Number of examples")
    ax.set_ylabel("Client")
    ax.set_title(title)
    ax.grid(True, axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    ax.legend(title="Category", loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    return _save(figure, path)


def _client_label_size(num_clients: int) -> float:
    if num_clients <= 20:
        return 9.0
    return 7.0 if num_clients <= 50 else 5.5


def _category_colours(count: int) -> list[tuple[float, float, float, float]]:
    """Qualitative colours, so adjacent categories never look alike; cycled past twenty."""
    palette: Colormap = colormaps["tab10" if count <= 10 else "tab20"]
    size = 10 if count <= 10 else 20
    return [palette(i % size) for i in range(count)]


@dataclass(frozen=True)
class CostPoint:
    """One run on the quality-against-client-cost plot.

    ``memory_mib`` is the client's peak memory (``client_peak_mem_mb``), ``up_mb`` the mean upload per
    training round (decimal MB); ``quality`` maps each eval metric to its value at the last evaluated round.
    """

    label: str
    method: str
    task: str
    quality: Mapping[str, float]
    memory_mib: float
    up_mb: float | None


LOG_SPREAD = 10.0
"""Memory is drawn on a log axis once the largest peak is this many times the smallest."""
MARKER_AREA = (30.0, 600.0)
"""The smallest and largest marker area (points²): the run uploading least and the one uploading most."""


NAMED_BESIDE = 4
"""Up to this many runs, a point is named beside it; more get a number, named in a legend (names beside
ten points overlap)."""


def point_texts(points: Sequence[CostPoint]) -> tuple[list[str], list[str]]:
    """What marks each point (beside it) and, when there are more than `NAMED_BESIDE`, the legend
    entries that name the numbers (else none): its run, method and upload per round."""
    named = [
        f"{_point_name(p)}\n{'n/a' if p.up_mb is None else f'{p.up_mb:.3g} MB'} up/round" for p in points
    ]
    if len(points) <= NAMED_BESIDE:
        return named, []
    numbers = [str(i) for i in range(1, len(points) + 1)]
    return numbers, [f"{n}: {text.replace(chr(10), ', ')}" for n, text in zip(numbers, named, strict=True)]


def plot_quality_vs_memory(points: Sequence[CostPoint], path: Path, title: str) -> Path:
    """Final quality (y) against the client's peak memory (x), one point per run, one subplot per task
    and metric; the marker's area grows with the bytes uploaded per round, which its label states (in
    a legend beside the panels, by number, when there are more than `NAMED_BESIDE` runs)."""
    panels = [
        (task, metric)
        for task in dict.fromkeys(p.task for p in points)
        for metric in _metrics_of(points, task)
    ]
    marks, legend = point_texts(points)
    figure, axes = _subplot_grid(max(len(panels), 1), width=4.8, height=3.6, extra_height=0.16 * len(legend))
    areas = marker_areas([p.up_mb for p in points])
    colours = {p.label: f"C{i % 10}" for i, p in enumerate(points)}
    handles: dict[str, Line2D] = {}  # a legend entry -> a plain marker of its colour (the areas vary)
    for ax, (task, metric) in zip(axes, panels, strict=False):
        shown = [
            (p, area, mark, entry)
            for p, area, mark, entry in zip(points, areas, marks, legend or marks, strict=True)
            if p.task == task and metric in p.quality
        ]
        for point, area, mark, entry in shown:
            xy = (point.memory_mib, point.quality[metric])
            ax.scatter(*xy, s=area, color=colours[point.label], alpha=0.7)
            handles[entry] = Line2D([], [], marker="o", linestyle="", color=colours[point.label], alpha=0.7)
            ax.annotate(mark, xy, textcoords="offset points", xytext=(6, 6), fontsize="x-small")
        memories = [p.memory_mib for p, *_ in shown]
        if memories and max(memories) > LOG_SPREAD * min(memories):
            ax.set_xscale("log")
        ax.margins(x=0.25, y=0.2)
        ax.set_title(f"{task}: {metric}" if len(panels) > 1 else metric, fontsize="medium")
        ax.set_xlabel("Client peak memory (MiB)")
        ax.set_ylabel(f"final {metric}")
        ax.grid(True, alpha=0.3)
    if legend:
        figure.legend(
            list(handles.values()),
            list(handles),
            loc="outside lower center",
            fontsize="x-small",
            frameon=False,
        )
    figure.suptitle(title, fontsize="small" if len(panels) == 1 else "medium")
    return _save(figure, path)


def _point_name(point: CostPoint) -> str:
    return point.label if point.method in point.label else f"{point.label} ({point.method})"


def _metrics_of(points: Sequence[CostPoint], task: str) -> list[str]:
    return list(dict.fromkeys(m for p in points if p.task == task for m in p.quality))


def marker_areas(up_mb: Sequence[float | None]) -> list[float]:
    """Marker areas proportional to upload on a log scale (uploads span bytes to gigabytes across
    methods); a run without a measured upload gets the smallest marker, and its label says n/a."""
    smallest, largest = MARKER_AREA
    logs = [math.log10(value) if value else None for value in up_mb]
    known = [value for value in logs if value is not None]
    if not known or max(known) == min(known):
        return [smallest if value is None else (smallest + largest) / 2 for value in logs]
    low, high = min(known), max(known)
    return [
        smallest if v is None else smallest + (largest - smallest) * (v - low) / (high - low) for v in logs
    ]
