"""Quality against client cost for ``fedtune report --compare``: what each compared run reached, and
what one of its clients spent for it (peak memory, traffic per round)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedtune.report.io import MetricsRow, Run, config_value
from fedtune.report.plots import CostPoint, eval_metric_names, plot_quality_vs_memory
from fedtune.report.tables import NOT_RECORDED, markdown_table
from fedtune.units import BYTES_PER_MB

CLIENT_MEMORY_KEY = "client_peak_mem_mb"
"""The round's largest client peak memory (MiB) among the clients that replied (``fit_round_result``)."""


def cost_section(runs: Sequence[Run], labels: Sequence[str], plot_path: Path) -> tuple[str, Path | None]:
    """Final quality against what a client spends on it: peak memory and traffic per round, one line
    per run; and the plot of quality against memory at ``plot_path``, one panel per task and metric
    (None where no run records a client peak and a final evaluation)."""
    variants = method_variants(runs)
    tasks = [task_of(run) for run in runs]
    metrics = list(dict.fromkeys(m for run in runs for m in eval_metric_names(run.rows)))
    headers = ["Run", "Method", "Variant", "Task", *[f"final {m}" for m in metrics]]
    headers += ["Client peak memory (MiB)", "Up per round (MB)", "Down per round (MB)"]
    rows: list[list[object]] = []
    points: list[CostPoint] = []
    for label, run, variant, task in zip(labels, runs, variants, tasks, strict=True):
        final = (run.final_row or {}).get("eval", {})
        memory = client_peak_mib(run.trained_rows)
        up, down = (mean_per_round(run.trained_rows, key) for key in ("bytes_up", "bytes_down"))
        values = [*(final.get(m) for m in metrics), memory, up, down]
        cells = [NOT_RECORDED if value is None else value for value in values]
        rows.append([label, run.config.get("algorithm"), variant, task, *cells])
        plotted = {m: float(v) for m, v in final.items() if isinstance(v, int | float)}
        if memory is not None and plotted:
            points.append(CostPoint(label, str(run.config.get("algorithm")), task, plotted, memory, up))
    text = "\n".join(
        [
            "### Quality against client cost\n",
            markdown_table(headers, rows),
            _cost_notes(labels, tasks, points),
        ]
    )
    if not points:
        return text, None
    title = "Final quality against client peak memory (marker area: bytes up per round)"
    return text, plot_quality_vs_memory(points, plot_path, title)


def _cost_notes(labels: Sequence[str], tasks: list[str], points: list[CostPoint]) -> str:
    notes = [
        f"Client peak memory: the largest `{CLIENT_MEMORY_KEY}` over the training rounds, the peak of "
        "the heaviest client: `torch.cuda.max_memory_allocated` during its local training on a GPU, the "
        "VmHWM of the process it trained in on a CPU (in a simulation that process also holds the server). "
        "Up and down: the mean over the training rounds of `bytes_up` and `bytes_down` (all clients). "
        f"{NOT_RECORDED}: the run's metrics rows do not record it."
    ]
    by_task = {task: [label for label, t in zip(labels, tasks, strict=True) if t == task] for task in tasks}
    if len(by_task) > 1:
        groups = "; ".join(f"{', '.join(names)}: {task}" for task, names in by_task.items())
        notes.append(
            f"The runs differ in task, so each task has its own panels and none share an axis: {groups}."
        )
    left_out = [label for label in labels if label not in {point.label for point in points}]
    if left_out:
        notes.append(f"Not plotted (no client peak memory or no final evaluation): {', '.join(left_out)}.")
    return "\n\n".join(notes) + "\n"


def client_peak_mib(trained: Sequence[MetricsRow]) -> float | None:
    """The largest client peak memory over the training rounds, None where no round records one.

    A round without replies records 0 (no client ran), which is no measurement rather than a peak.
    """
    peaks = [float(row[CLIENT_MEMORY_KEY]) for row in trained if (row.get(CLIENT_MEMORY_KEY) or 0) > 0]
    return max(peaks, default=None)


def mean_per_round(trained: Sequence[MetricsRow], key: str) -> float | None:
    """The mean of ``key`` (bytes) over the training rounds that record it, in MB; None where none does."""
    values = [row[key] for row in trained if row.get(key) is not None]
    return sum(values) / len(values) / BYTES_PER_MB if values else None


def task_of(run: Run) -> str:
    """What a run's quality is measured on: its dataset and its eval metrics. Runs of different tasks
    are not comparable on one axis."""
    dataset = config_value(run.config, "data.dataset") or NOT_RECORDED
    return f"{dataset} ({', '.join(eval_metric_names(run.rows)) or 'no eval'})"


def method_variants(runs: Sequence[Run]) -> list[str]:
    """What sets each run's method apart: ``fed.mode`` where it is not ``federated``, and the settings of
    the method's own config section that differ between the compared runs of that method."""
    variants = []
    for run in runs:
        algorithm = str(run.config.get("algorithm"))
        mode = config_value(run.config, "fed.mode")
        parts = [f"fed.mode={mode}"] if mode not in (None, "federated") else []
        sections = [
            _section(other, algorithm) for other in runs if other.config.get("algorithm") == algorithm
        ]
        for key, value in _section(run, algorithm).items():
            if len({repr(section.get(key)) for section in sections}) > 1:
                parts.append(f"{algorithm}.{key}={value}")
        variants.append(", ".join(parts))
    return variants


def _section(run: Run, name: str) -> dict[str, Any]:
    section = run.config.get(name)
    return section if isinstance(section, dict) else {}
