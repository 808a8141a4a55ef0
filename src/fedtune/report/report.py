"""``fedtune report``: ``report.md`` and ``plots/*.png`` for one run, optionally compared with others."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from fedtune.fl.budget import budget_stop, used_mb
from fedtune.report.cost import cost_section
from fedtune.report.io import (
    MetricsRow,
    Run,
    config_value,
    load_run,
)
from fedtune.report.plots import (
    eval_metric_names,
    plot_bytes_per_round,
    plot_category_scores,
    plot_learning_curves,
    plot_partition,
)
from fedtune.report.tables import format_delta, markdown_table, partition_table
from fedtune.units import BYTES_PER_MB

CONFIG_ESSENTIALS = [
    ("name", "Run name"),
    ("algorithm", "Algorithm"),
    ("model.name", "Model"),
    ("data.dataset", "Dataset"),
    ("data.partition.scheme", "Partition"),
    ("data.partition.num_clients", "Clients"),
    ("fed.rounds", "Rounds (configured)"),
    ("fed.mode", "Mode"),
    ("seed", "Seed"),
]


def write_report(run_dir: Path, compare: list[Path] | None = None) -> Path:
    """Write ``run_dir/report.md`` and its figures under ``run_dir/plots``; returns the report path.

    ``compare`` adds a cross-run table and overlaid learning curves of this run and those runs.
    """
    run = load_run(run_dir)
    # Globs such as ``runs/*`` often include the run itself; comparing it with itself adds nothing.
    others = [load_run(path) for path in dict.fromkeys(compare or []) if path.resolve() != run_dir.resolve()]
    plots_dir = run_dir / "plots"
    sections = [f"# Report: {run.name}\n\nRun directory: `{run_dir}`\n", _summary_section(run)]
    sections.append(privacy_section(run))
    sections.append(secagg_section(run))
    sections.append(_learning_curves_section(run, plots_dir))
    sections.append(_category_section(run, plots_dir))
    sections.append(client_section(run))
    sections.append(_communication_section(run, plots_dir))
    sections.append(_partition_section(run, plots_dir))
    if others:
        sections.append(_compare_section([run, *others], plots_dir))
    sections.append("## Per-round metrics\n\n" + per_round_table(run.rows))
    report_path = run_dir / "report.md"
    report_path.write_text("\n".join(section for section in sections if section), encoding="utf-8")
    return report_path


def _image(title: str, path: Path, plots_dir: Path) -> str:
    return f"![{title}]({plots_dir.name}/{path.name})\n"


def _summary_section(run: Run) -> str:
    config_rows: list[list[object]] = [
        [label, config_value(run.config, key)] for key, label in CONFIG_ESSENTIALS
    ]
    return "\n".join(
        [
            "## Summary\n",
            markdown_table(["Setting", "Value"], config_rows),
            eval_summary_table(run),
            markdown_table(["Quantity", "Value"], resource_rows(run.trained_rows)),
            budget_line(run),
        ]
    )


def budget_line(run: Run) -> str:
    """With ``fed.budget_mb``: the traffic spent against it, and the round it stopped the run before."""
    budget = config_value(run.config, "fed.budget_mb")
    if not isinstance(budget, int | float):
        return ""
    line = f"Communication budget: {used_mb(run.rows):.4g} of {budget:g} MB (fed.budget_mb, MB = 10^6 bytes)"
    stop = budget_stop(run.rows, float(budget))
    configured = config_value(run.config, "fed.rounds")
    if stop is not None and isinstance(configured, int) and stop.next_round <= configured:
        line += (
            f"; stopped before round {stop.next_round} of {configured}, which would have needed about "
            f"{stop.predicted:.4g} MB more"
        )
    return line + ".\n"


def privacy_section(run: Run) -> str:
    """Client-level DP (``dp.enabled``): the epsilon spent, its delta, the mechanism, epsilon by round."""
    private = [row for row in run.rows if "dp_epsilon" in row]
    if not private:
        return ""
    last = private[-1]
    trained = [row for row in private if row["round"] > 0]
    configured = config_value(run.config, "fed.rounds")
    limit = config_value(run.config, "dp.max_epsilon")
    stopped = limit is not None and isinstance(configured, int) and last["round"] < configured
    rows: list[list[object]] = [
        ["epsilon (after the last round)", last["dp_epsilon"]],
        ["delta", last["dp_delta"]],
        ["rounds released", len(trained)],
        ["noise multiplier z", last.get("dp_noise_multiplier")],
        ["sampling", config_value(run.config, "dp.sampling")],
        ["sampling rate q", last.get("dp_sample_rate")],
        ["clip norm C", config_value(run.config, "dp.clip_norm")],
        ["max epsilon", limit],
    ]
    if stopped:
        rows.append(["stopped", f"before round {last['round'] + 1} of {configured} (dp.max_epsilon)"])
    per_round = [
        [row["round"], row["dp_epsilon"], row.get("dp_clipped"), row.get("dp_update_norm")] for row in trained
    ]
    intro = (
        "Client-level differential privacy, central: every update was clipped (by the server, or by the "
        "clients under secure aggregation) and the server noised their sum (docs/privacy.md). Epsilon "
        "covers the released model; the rest of this report (losses, clients, per-client metrics, update "
        "norms) is the operator's log and is not protected.\n"
    )
    return "\n".join(
        [
            "## Privacy\n",
            intro,
            markdown_table(["Quantity", "Value"], rows),
            markdown_table(["Round", "epsilon", "Share clipped", "Median update norm"], per_round),
        ]
    )


def secagg_section(run: Run) -> str:
    """Secure aggregation (``secagg.enabled``): what the protocol cost per round beyond the updates."""
    rows = [row for row in run.rows if "secagg_bytes_up" in row]
    if not rows:
        return ""
    cells: list[list[object]] = []
    for row in rows:
        up, down, vectors = (
            row["secagg_bytes_up"],
            row["secagg_bytes_down"],
            row.get("secagg_vector_bytes", 0),
        )
        total = (row.get("bytes_up") or 0) + (row.get("bytes_down") or 0)
        cells.append(
            [
                row["round"],
                row.get("secagg_clients"),
                row.get("secagg_dropped"),
                vectors / BYTES_PER_MB,
                (up - vectors) / BYTES_PER_MB,
                down / BYTES_PER_MB,
                (up + down - vectors) / total if total else None,
                row.get("secagg_seconds"),
            ]
        )
    headers = ["Round", "Clients summed", "Dropped", "Masked vectors up (MB)", "Protocol up (MB)"]
    headers += ["Protocol down (MB)", "Overhead share of traffic", "Protocol (s)"]
    intro = (
        "SecAgg+ (docs/privacy.md): the server learned only the sum of each round's updates. The masked "
        "vectors weigh what plain updates would; the protocol's keys, encrypted shares and unmasking are "
        "the overhead.\n"
    )
    return "\n".join(["## Secure aggregation\n", intro, markdown_table(headers, cells)])


def eval_summary_table(run: Run) -> str:
    """Each eval metric before training, after the last evaluated round, and the change."""
    before = (run.before_row or {}).get("eval", {})
    final_row = run.final_row
    final = final_row["eval"] if final_row else {}
    final_header = f"Final (round {final_row['round']})" if final_row else "Final"
    rows: list[list[object]] = []
    for metric in eval_metric_names(run.rows):
        delta = final[metric] - before[metric] if metric in before and metric in final else None
        rows.append([metric, before.get(metric), final.get(metric), format_delta(delta)])
    if not rows:
        return "No evaluation rounds were recorded.\n"
    return markdown_table(["Metric", "Before (round 0)", final_header, "Δ"], rows)


def resource_rows(trained: Sequence[MetricsRow]) -> list[list[object]]:
    """Totals and peaks of traffic, time and memory over the training rounds."""
    round_seconds = [row["round_seconds"] for row in trained if "round_seconds" in row]
    gpu_peaks = [row["gpu_peak_mb"] for row in trained if row.get("gpu_peak_mb") is not None]
    rows: list[list[object]] = [
        ["Rounds completed", max((row["round"] for row in trained), default=0)],
        ["Upload total (MB)", _total(trained, "bytes_up") / BYTES_PER_MB],
        ["Download total (MB)", _total(trained, "bytes_down") / BYTES_PER_MB],
        ["Tokens trained", int(_total(trained, "tokens"))],
        ["Mean round time (s)", _mean(round_seconds)],
        ["Total round time (s)", sum(round_seconds)],
        [
            "Peak RSS (MiB)",
            max((row["peak_rss_mb"] for row in trained if "peak_rss_mb" in row), default=None),
        ],
    ]
    # Only GPU runs record GPU memory; a row of dashes on CPU runs would suggest a missing value.
    rows += [["Peak GPU memory (MiB)", max(gpu_peaks)]] if gpu_peaks else []
    rows += [
        ["Failed client-rounds", sum(len(row.get("failed") or {}) for row in trained)],
        ["Rejected client-rounds", sum(len(row.get("rejected") or {}) for row in trained)],
    ]
    return rows


def _peak(rows: list[MetricsRow], key: str) -> float | None:
    return max((row[key] for row in rows if key in row), default=None)


def _total(rows: Sequence[MetricsRow], key: str) -> float:
    return float(sum(row.get(key) or 0 for row in rows))


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def per_round_table(rows: Sequence[MetricsRow]) -> str:
    """One line per round, with the eval metrics of the rounds that were evaluated."""
    metrics = eval_metric_names(rows)
    headers = ["Round", "Clients", "Failed", "Rejected", "Train loss", "Examples trained", "Tokens"]
    headers += ["Up (MB)", "Down (MB)", "Round (s)", "Peak RSS (MiB)", *metrics]
    return markdown_table(headers, [_per_round_cells(row, metrics) for row in rows])


def _per_round_cells(row: MetricsRow, metrics: list[str]) -> list[object]:
    """Keys the row lacks (all but eval at round 0) stay empty cells rather than zeros."""
    evaluated = row.get("eval") or {}
    return [
        row["round"],
        _count(row, "clients"),
        _count(row, "failed"),
        _count(row, "rejected"),
        row.get("train_loss"),
        row.get("trained_examples"),
        row.get("tokens"),
        _megabytes(row, "bytes_up"),
        _megabytes(row, "bytes_down"),
        row.get("round_seconds"),
        row.get("peak_rss_mb"),
        *[evaluated.get(metric) for metric in metrics],
    ]


def _count(row: MetricsRow, key: str) -> int | None:
    return len(row[key]) if row.get(key) is not None else None


def _megabytes(row: MetricsRow, key: str) -> float | None:
    return row[key] / BYTES_PER_MB if row.get(key) is not None else None


def _learning_curves_section(run: Run, plots_dir: Path) -> str:
    path = plot_learning_curves({run.name: run.rows}, plots_dir / "learning_curves.png", run.name)
    return "## Learning curves\n\n" + _image("Learning curves", path, plots_dir)


def _category_section(run: Run, plots_dir: Path) -> str:
    before = (run.before_row or {}).get("eval_by_category") or {}
    final = (run.final_row or {}).get("eval_by_category") or {}
    if not final:
        return ""
    stats = run.data_stats or {}
    eval_counts: dict[str, int] = stats.get("eval_counts", {})
    trained = trained_categories(stats["counts"]) if "counts" in stats else None
    labels = category_labels(sorted({c for scores in final.values() for c in scores}), eval_counts, trained)
    title = f"{run.name}: per-category scores"
    path = plot_category_scores(before, final, plots_dir / "category_scores.png", title, labels)
    lines = ["## Per-category scores\n", category_table(before, final, eval_counts, trained)]
    unheld = untrained_categories(eval_counts, trained)
    if unheld:
        lines.append(f"\n\\* in no client's training data: {', '.join(unheld)} (evaluated all the same).\n")
    if few_examples(eval_counts):
        lines.append(
            f"\n{FEW_MARK} scored on fewer than {FEW_CATEGORY_EXAMPLES} examples: a difference there is "
            "mostly noise (one example more or less right moves the score by 1/n); raise "
            "eval.max_examples or evaluate on a larger test set before reading it.\n"
        )
    return "\n".join([*lines, _image(title, path, plots_dir)])


def client_section(run: Run) -> str:
    """Client-side (personal) evaluation: each client's own metrics before and at the final round."""
    before = (run.before_row or {}).get("eval_by_client") or {}
    final = (run.final_row or {}).get("eval_by_client") or {}
    if not final:
        return ""
    counts = (run.data_stats or {}).get("counts", {})
    metrics = sorted({name for scores in final.values() for name in scores})
    headers = ["client", "categories", *[f"{m} before" for m in metrics], *[f"{m} final" for m in metrics]]
    rows: list[list[object]] = []
    for client in sorted(final):
        categories = ", ".join(sorted(counts.get(client, {}))) or "-"
        rows.append(
            [
                client,
                categories,
                *[before.get(client, {}).get(m, "-") for m in metrics],
                *[final[client].get(m, "-") for m in metrics],
            ]
        )
    intro = "Each client's own model on its own held-out split (`eval.personal`).\n"
    return "\n".join(["## Per-client evaluation\n", intro, markdown_table(headers, rows), ""])


def trained_categories(counts: dict[str, dict[str, int]]) -> set[str]:
    """The categories some client holds, from data_stats.json's per-client counts."""
    return {category for per_client in counts.values() for category, n in per_client.items() if n > 0}


def untrained_categories(eval_counts: dict[str, int], trained: set[str] | None) -> list[str]:
    """Evaluated categories that no client trained on."""
    return [] if trained is None else sorted(set(eval_counts) - trained)


def category_labels(
    categories: list[str], eval_counts: dict[str, int], trained: set[str] | None
) -> dict[str, str]:
    """``name (n=3)``, with ``*`` when no client holds the category."""
    labels = {}
    for category in categories:
        count = f" (n={eval_counts[category]})" if category in eval_counts else ""
        mark = "*" if trained is not None and category not in trained else ""
        labels[category] = f"{category}{count}{mark}"
    return labels


FEW_CATEGORY_EXAMPLES = 10
"""A category scored on fewer examples than this has its change marked as noise (``FEW_MARK``)."""
FEW_MARK = "†"


def few_examples(eval_counts: dict[str, int]) -> list[str]:
    """The categories scored on fewer than ``FEW_CATEGORY_EXAMPLES`` examples."""
    return sorted(c for c, n in eval_counts.items() if n < FEW_CATEGORY_EXAMPLES)


def category_table(
    before: dict[str, dict[str, float]],
    final: dict[str, dict[str, float]],
    eval_counts: dict[str, int] | None = None,
    trained: set[str] | None = None,
) -> str:
    eval_counts = eval_counts or {}
    rows: list[list[object]] = []
    for metric, scores in final.items():
        for category in sorted(scores):
            start = before.get(metric, {}).get(category)
            delta = scores[category] - start if start is not None else None
            held = "" if trained is None else ("yes" if category in trained else "no *")
            mark = (
                f" {FEW_MARK}"
                if eval_counts.get(category, FEW_CATEGORY_EXAMPLES) < FEW_CATEGORY_EXAMPLES
                else ""
            )
            row = [metric, category, eval_counts.get(category), held, start, scores[category]]
            rows.append([*row, format_delta(delta) + mark])
    headers = ["Metric", "Category", "Eval examples", "In training data", "Before", "Final", "Δ"]
    return markdown_table(headers, rows)


def _communication_section(run: Run, plots_dir: Path) -> str:
    if not run.trained_rows:
        return ""
    title = f"{run.name}: traffic per round"
    path = plot_bytes_per_round(run.rows, plots_dir / "bytes_per_round.png", title)
    return "## Communication\n\n" + _image(title, path, plots_dir)


def _partition_section(run: Run, plots_dir: Path) -> str:
    if run.data_stats is None:
        return ""
    counts = run.data_stats["counts"]
    title = f"{run.data_stats.get('dataset', 'data')}, {run.data_stats.get('scheme', 'partition')} partition"
    path = plot_partition(counts, plots_dir / "partition.png", title)
    return "\n".join(["## Data partition\n", partition_table(counts), _image(title, path, plots_dir)])


def _compare_section(runs: list[Run], plots_dir: Path) -> str:
    labels = _unique_labels(runs)
    metrics = list(dict.fromkeys(m for run in runs for m in eval_metric_names(run.rows)))
    headers = ["Run", "Algorithm", "Rounds", *[f"final {m}" for m in metrics]]
    headers += ["Up (MB)", "Down (MB)", "Total time (s)"]
    rows = [_compare_cells(label, run, metrics) for label, run in zip(labels, runs, strict=True)]
    curves = {label: run.rows for label, run in zip(labels, runs, strict=True)}
    path = plot_learning_curves(curves, plots_dir / "compare_learning_curves.png", "Learning curves by run")
    return "\n".join(
        [
            "## Comparison\n",
            markdown_table(headers, rows),
            _image("Learning curves by run", path, plots_dir),
            _cost_section(runs, labels, plots_dir),
        ]
    )


def _cost_section(runs: list[Run], labels: list[str], plots_dir: Path) -> str:
    text, path = cost_section(runs, labels, plots_dir / "compare_quality_vs_memory.png")
    return (
        text if path is None else text + "\n" + _image("Quality against client peak memory", path, plots_dir)
    )


def _compare_cells(label: str, run: Run, metrics: list[str]) -> list[object]:
    final = (run.final_row or {}).get("eval", {})
    trained = run.trained_rows
    return [
        label,
        config_value(run.config, "algorithm"),
        max((row["round"] for row in trained), default=0),
        *[final.get(metric) for metric in metrics],
        _total(trained, "bytes_up") / BYTES_PER_MB,
        _total(trained, "bytes_down") / BYTES_PER_MB,
        _total(trained, "round_seconds"),
    ]


def _unique_labels(runs: list[Run]) -> list[str]:
    """Run names, falling back to the directory name where two runs share a name."""
    names = [run.name for run in runs]
    return [
        name if names.count(name) == 1 else f"{name} ({run.run_dir.name})"
        for name, run in zip(names, runs, strict=True)
    ]
