"""FedBiOT's learning-rate search, beside its table (``--lrs``): each method at each lr on the validation
split (the test split is not read), at one dropout (the first of ``--dropouts``), and each method's own
best lr, as the paper searched the lr per method. Written to ``sweep-lr-<config name>`` (.md, .json, and
a plot of the score against the lr); the .md ends with the ``--row-lr`` that runs the table at those lrs.
With ``--keep-earlier`` a method and lr none of whose runs is here (made elsewhere, or removed) keeps the
values the previous file recorded, whole; one with some seeds' runs here takes the others' values from the
previous file seed by seed (a search extended to more seeds on another machine); the file names both.

A method's score at an lr is the mean over seeds of its AdapEmu and AdapFu values of the table's metric
(a client runs AdapEmu; the paper reports both), higher is better but for perplexity; a tie on the score
goes to the lower AdapFu perplexity, then to the smaller lr. A search may be extended to more seeds only
where its choice is close (``--seeds 0 1 2 --methods M --lrs A B``, then every lr with ``--table-only``):
a cell with fewer seeds than asked names how many it has.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from experiments import plots, tables
from experiments.fedbiot_rows import LABELS, METHODS, primary_metric, start
from experiments.tables import search

OUTPUTS = ("adapemu", "adapfu")


def sweep_key(lr: float, method: str, dropout: float) -> str:
    return f"lr{lr:g}-{method}-d{dropout}"


def kept_label(key: str) -> str:
    """A `sweep_key`'s method and lr, as the note of the rows ``--keep-earlier`` kept names them."""
    method = next(m for m in METHODS if f"-{m}-d" in key)
    return f"{LABELS[method]} at lr {key[2 : key.index(f'-{method}-d')]}"


def check_sweepable(parser: Any, cfg: Any) -> None:
    """The sweep scores on the training dataset's validation split: refuse a config that evaluates on
    another dataset (``data.eval_dataset``), which has no such split to read."""
    if cfg.data.eval_dataset:
        parser.error(
            f"--lrs scores each lr on {cfg.data.dataset}'s validation split, but this config evaluates on "
            f"data.eval_dataset {cfg.data.eval_dataset!r}; sweep with --set data.eval_dataset=null"
        )


def lr_sweep(args: Any, cfg: Any, base: Path, metric: str, command: str, summarise: Any) -> None:
    """Every method of ``args.methods`` at each of ``args.lrs`` on the validation split, and each one's
    best lr (``summarise``: the table's, run directories -> their values over seeds)."""
    dropout = args.dropouts[0]
    rows = {
        sweep_key(lr, method, dropout): [
            *METHODS[method],
            f"fedbiot.dropout={dropout}",
            f"train.lr={lr}",
            "data.eval_split=validation",
        ]
        for lr in args.lrs
        for method in args.methods
    }
    runs = tables.plan(base, rows, args.seeds, args.set)
    start(args, runs)
    stem = args.results_dir / f"sweep-lr-{cfg.name}"
    results: dict[str, Any] = {key: summarise(paths, metric) for key, paths in runs.dirs.items()}
    kept = search.keep_earlier_cells(args, results, stem, kept_label)
    results["best_lr"] = best_lrs(args, results, metric)
    text = sweep_text(cfg, args, results, metric, command)
    text += tables.closing_notes(runs.dirs, stem, args, **kept)
    tables.write_table(stem, text, cfg.name, command, results, args)
    plot_sweep(cfg, args, results, metric, tables.sibling(stem, ".png"))


def score(result: dict[str, Any], metric: str) -> float | None:
    """The mean of AdapEmu's and AdapFu's ``metric`` (None until both are there)."""
    keys = [f"{output}/{metric}" for output in OUTPUTS]
    return float(np.mean([result[k] for k in keys])) if all(k in result for k in keys) else None


def best_lrs(args: Any, results: dict[str, Any], metric: str) -> dict[str, float]:
    """Method -> its best lr among those whose runs finished (see the module docstring)."""
    sign = -1.0 if metric == "perplexity" else 1.0
    dropout = args.dropouts[0]
    best = {}
    for method in args.methods:
        done = []
        for lr in args.lrs:
            result = results.get(sweep_key(lr, method, dropout), {})
            value = score(result, metric)
            if value is not None:
                tie_break = -float(result.get("adapfu/perplexity", np.inf))
                done.append(((sign * value, tie_break, -lr), lr))
        if done:
            best[method] = max(done)[1]
    return best


def sweep_text(cfg: Any, args: Any, results: dict[str, Any], metric: str, command: str) -> str:
    scale = 1.0 if metric == "perplexity" else 100.0
    dropout = args.dropouts[0]
    header = ["method", *[f"lr {lr:g}" for lr in args.lrs], "best lr"]
    best = results.get("best_lr", {})

    def rows_of(name: str, factor: float, with_best: bool) -> list[list[str]]:
        rows = []
        for method in args.methods:
            cells = [LABELS[method]]
            for lr in args.lrs:
                result = results.get(sweep_key(lr, method, dropout), {})
                shown = [result.get(f"{output}/{name}") for output in OUTPUTS]
                cells.append(
                    " / ".join("-" if v is None else f"{float(v) * factor:.2f}" for v in shown)
                    + tables.fewer_seeds(result, len(args.seeds))
                    if any(v is not None for v in shown)
                    else "-"
                )
            if with_best:
                cells.append(f"{best[method]:g}" if method in best else "-")
            rows.append(cells)
        return rows

    rows = rows_of(metric, scale, with_best=True)
    unit = "" if metric == "perplexity" else " (x 100)"
    better = "lower" if metric == "perplexity" else "higher"
    chosen = " ".join(f"{method}={lr:g}" for method, lr in best.items())
    lines = [
        f"# {cfg.name}: learning-rate search per method, validation {metric}{unit}, AdapEmu / AdapFu",
        "",
        f"`{command}`; dropout {dropout}, {cfg.fed.rounds} rounds, {cfg.eval.max_examples} validation "
        f"examples, {tables.seeds_text(len(args.seeds))} (mean over seeds). The test split is not read.",
        "",
        tables.markdown_table(header, rows),
        "",
        f"A method's best lr has the {better} mean of its AdapEmu and AdapFu {metric} (ties: the lower "
        "AdapFu perplexity, then the smaller lr).",
    ]
    if any(
        tables.fewer_seeds(result, len(args.seeds)) for result in results.values() if isinstance(result, dict)
    ):
        lines += ["", tables.FEWER_SEEDS_NOTE]
    if best:
        lines += ["", f"The table at these lrs: `--row-lr {chosen}`"]
    if metric != "perplexity":
        lines += [
            "",
            "Validation perplexity, AdapEmu / AdapFu:",
            "",
            tables.markdown_table(header[:-1], rows_of("perplexity", 1.0, with_best=False)),
        ]
    return "\n".join(lines)


def render_sweep(recorded: tables.Recorded) -> str:
    args = recorded.args
    args.dropouts = args.dropouts or [0.2, 0.5]  # as the table's command defaults them
    return sweep_text(recorded.cfg, args, recorded.results, primary_metric(recorded.cfg), recorded.command)


def plot_sweep(cfg: Any, args: Any, results: dict[str, Any], metric: str, path: Path) -> Path:
    """One panel per output (AdapEmu, AdapFu): the validation metric against the lr (log axis), a line per
    method, mean ± std over seeds; a cell on fewer seeds than asked (a search extended to more seeds only
    where its choice was close) is drawn hollow. Where the metric is one value at every lr of every method
    (exact match at 0 on math), the tie-break decides the best lr: the panels show validation perplexity
    instead."""
    dropout = args.dropouts[0]
    asked = len(args.seeds)
    title = f"{cfg.name}: {cfg.model.name}, lr search at dropout {dropout} (validation)"
    shown = {
        result[f"{output}/{metric}"]
        for key, result in results.items()
        if key != "best_lr"
        for output in OUTPUTS
        if f"{output}/{metric}" in result
    }
    if metric != "perplexity" and len(shown) == 1:
        title += f"; {metric} is {shown.pop() * 100:g} everywhere"
        metric = "perplexity"
    scale = 1.0 if metric == "perplexity" else 100.0
    figure, axes, first = plots.panel_grid(len(OUTPUTS), 4.2, 3.2)
    hollow = False
    for ax, output in zip(axes, OUTPUTS, strict=True):
        for method in args.methods:
            points = [(lr, results.get(sweep_key(lr, method, dropout), {})) for lr in args.lrs]
            points = [(lr, r) for lr, r in points if f"{output}/{metric}" in r]
            if points:
                line = ax.errorbar(
                    [lr for lr, _ in points],
                    [r[f"{output}/{metric}"] * scale for _, r in points],
                    yerr=[r.get(f"{output}/{metric}_std", 0.0) * scale for _, r in points],
                    marker="o",
                    capsize=3,
                    label=LABELS[method],
                )
                fewer = [(lr, r) for lr, r in points if tables.fewer_seeds(r, asked)]
                if fewer:
                    ax.plot(
                        [lr for lr, _ in fewer],
                        [r[f"{output}/{metric}"] * scale for _, r in fewer],
                        linestyle="none",
                        marker="o",
                        markerfacecolor="white",  # over the line's filled marker: reads as hollow
                        zorder=3,
                        markeredgecolor=line.lines[0].get_color(),
                    )
                    hollow = True
        ax.set_title("AdapEmu" if output == "adapemu" else "AdapFu")
    if hollow:
        title += f"; hollow: fewer seeds than {asked}"
    ylabel = f"validation {metric}{'' if metric == 'perplexity' else ' (x 100)'}"
    return plots.finish_grid(
        figure,
        axes,
        first,
        xlabel="lr",
        ylabel=ylabel,
        title=title,
        path=path,
        log_x=True,
        log_y=metric == "perplexity",  # a diverged lr's thousands would flatten every other point
    )
