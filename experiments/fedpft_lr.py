"""FedPFT's learning-rate sweep, beside its table (``--lrs``): every row at each lr on the validation split
(the test split is not read), one lr chosen for all rows by mean accuracy, written to
``sweep-lr-<config name>`` (.md, .json, and two plots: accuracy against lr, and each row's accuracy by
round per lr)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from experiments import plots, tables
from experiments.fedpft_rows import LABELS, row_overrides, suffixes_of, summarise


def lr_sweep(args: Any, cfg: Any, base: Path, suffixes: list[str], command: str) -> None:
    """Every row at each of ``args.lrs`` on the validation split; one lr for all rows by mean accuracy."""
    keys = [(lr, row, suffix) for lr in args.lrs for suffix in suffixes for row in args.rows]
    lr_rows = {
        f"lr{lr:g}-{row}-{suffix}": [
            f"train.lr={lr}",
            "data.eval_split=validation",
            *row_overrides(row, suffix),
        ]
        for lr, row, suffix in keys
    }
    runs = tables.plan(base, lr_rows, args.seeds, args.set, seed_major=True)  # every row at one lr first
    tables.start(args, runs.runs)
    dirs = dict(zip(keys, runs.dirs.values(), strict=True))
    found = {key: summarise(paths) for key, paths in dirs.items()}
    results: dict[str, Any] = {f"lr{lr:g}-{row}-{suffix}": r for (lr, row, suffix), r in found.items()}
    means = lr_means(args, found, suffixes)
    results["mean_by_lr"] = {f"{lr:g}": v for lr, v in means.items()}
    results["chosen_lr"] = max(means, key=lambda lr: means[lr]) if means else None
    text = lr_sweep_text(cfg, args, found, suffixes, command)
    text += tables.rejected_note(path for paths in dirs.values() for path in paths)
    stem = args.results_dir / f"sweep-lr-{cfg.name}"
    tables.write_table(stem, text, cfg.name, command, results, args)
    plot_lr_sweep(cfg, args, found, suffixes, tables.sibling(stem, ".png"))
    plot_lr_sweep_rounds(cfg, args, found, suffixes, tables.sibling(stem, "-rounds.png"))


def lr_means(args: Any, found: dict[Any, dict[str, Any]], suffixes: list[str]) -> dict[float, float]:
    """lr -> the mean accuracy over every row and setting, for the lrs where all of them finished."""
    means = {}
    for lr in args.lrs:
        cells = [found[(lr, row, suffix)] for suffix in suffixes for row in args.rows]
        if all("accuracy" in c for c in cells):
            means[lr] = sum(c["accuracy"] for c in cells) / len(cells)
    return means


def lr_sweep_text(
    cfg: Any, args: Any, found: dict[Any, dict[str, Any]], suffixes: list[str], command: str
) -> str:
    """The sweep's markdown: accuracy by lr per row, each row's best lr, the lr chosen, the rounds."""
    means = lr_means(args, found, suffixes)
    chosen = max(means, key=lambda lr: means[lr]) if means else None
    header = ["lr"] + [f"{LABELS[row]} {suffix}" for suffix in suffixes for row in args.rows] + ["mean"]
    rows = [
        [f"{lr:g}"]
        + [
            tables.cell(found[(lr, row, suffix)].get("accuracy_by_seed"), 1)
            for suffix in suffixes
            for row in args.rows
        ]
        + [f"{means[lr]:.1f}" if lr in means else "-"]
        for lr in args.lrs
    ]
    best_by_row = []
    for suffix in suffixes:
        for row in args.rows:
            done = [lr for lr in args.lrs if "accuracy" in found[(lr, row, suffix)]]
            best = max(done, key=lambda lr: found[(lr, row, suffix)]["accuracy"]) if done else None
            shown = "no lr finished" if best is None else f"best at lr {best:g} (of {len(done)} finished)"
            best_by_row.append(f"- {LABELS[row]}, {suffix}: {shown}")
    return "\n".join(
        [
            f"# {cfg.name}: learning-rate sweep, validation accuracy (%), mean ± std over seeds",
            "",
            f"`{command}`; {cfg.fed.rounds} rounds, {cfg.eval.max_examples} validation examples, "
            f"{tables.seeds_text(len(args.seeds))}. The test split is not read.",
            "",
            tables.markdown_table(header, rows),
            "",
            "Each row's best lr (the sweep picks one for all):",
            "",
            *best_by_row,
            "",
            f"Chosen lr (highest mean validation accuracy over the rows and settings): {chosen:g}"
            if chosen is not None
            else "No lr has every row finished yet.",
            "",
            *by_round_section(args, found, suffixes),
        ]
    )


def render_lr_sweep(recorded: tables.Recorded) -> str:
    args, suffixes = recorded.args, suffixes_of(recorded.args)
    found = {
        (lr, row, suffix): recorded.results[f"lr{lr:g}-{row}-{suffix}"]
        for lr in args.lrs
        for suffix in suffixes
        for row in args.rows
    }
    return lr_sweep_text(recorded.cfg, args, found, suffixes, recorded.command)


def by_round_section(args: Any, found: dict[Any, dict[str, Any]], suffixes: list[str]) -> list[str]:
    """Markdown lines: each row's validation accuracy at every evaluated round, one line per lr."""
    rounds = sorted({int(r) for result in found.values() for r in result.get("accuracy_by_round", {})})
    if not rounds:
        return []
    header = ["row", "setting", "lr", *[f"round {r}" for r in rounds]]
    lines = []
    for suffix in suffixes:
        for row in args.rows:
            for lr in args.lrs:
                curve = found[(lr, row, suffix)].get("accuracy_by_round", {})
                if curve:
                    cells = [f"{curve[str(r)]:.1f}" if str(r) in curve else "-" for r in rounds]
                    lines.append([LABELS[row], suffix, f"{lr:g}", *cells])
    return [
        "Validation accuracy (%) at each evaluated round (mean over seeds):",
        "",
        tables.markdown_table(header, lines),
    ]


def plot_lr_sweep(
    cfg: Any, args: Any, found: dict[Any, dict[str, Any]], suffixes: list[str], path: Path
) -> Path:
    """One panel per dataset and partition: validation accuracy against lr (log axis), one line per row."""
    figure, axes, first = plots.panel_grid(len(suffixes), 4.2, 3.2)
    for ax, suffix in zip(axes, suffixes, strict=True):
        for row in args.rows:
            points = [(lr, found[(lr, row, suffix)]) for lr in args.lrs]
            points = [(lr, r) for lr, r in points if "accuracy" in r]
            if points:
                ax.errorbar(
                    [lr for lr, _ in points],
                    [r["accuracy"] for _, r in points],
                    yerr=[r.get("accuracy_std", 0.0) for _, r in points],
                    marker="o",
                    capsize=3,
                    label=LABELS[row],
                )
        ax.set_title(suffix)
    title = f"{cfg.name}: {cfg.model.name}, learning-rate sweep"
    return plots.finish_grid(
        figure, axes, first, xlabel="lr", ylabel="validation accuracy (%)", title=title, path=path, log_x=True
    )


def plot_lr_sweep_rounds(
    cfg: Any, args: Any, found: dict[Any, dict[str, Any]], suffixes: list[str], path: Path
) -> Path | None:
    """One panel per row and setting: validation accuracy against the round, one line per lr (mean over
    seeds): whether a low lr is still climbing when the run ends, and whether a high one collapses."""
    panels = [(row, suffix) for suffix in suffixes for row in args.rows]
    curves = {key: result.get("accuracy_by_round", {}) for key, result in found.items()}
    if not any(curves.values()):
        return None
    figure, axes, first = plots.panel_grid(len(panels), 4.2, 3.2)
    for ax, (row, suffix) in zip(axes, panels, strict=True):
        for lr in args.lrs:
            curve = curves[(lr, row, suffix)]
            if curve:
                ax.plot([int(r) for r in curve], list(curve.values()), marker="o", label=f"lr {lr:g}")
        ax.set_title(f"{LABELS[row]}, {suffix}", fontsize=9)
    title = f"{cfg.name}: {cfg.model.name}, validation accuracy by round"
    return plots.finish_grid(
        figure, axes, first, xlabel="round", ylabel="validation accuracy (%)", title=title, path=path
    )
