"""FedMKT over rounds, beside its table (when the config has more than one round): ``rounds-<config>`` (.md,
.json, .png) gives every round of the FedMKT runs, the LLM's and each SLM's score, and how many public
samples DualMinCE selected for the LLM and for the SLMs. With ``--keep-earlier`` a seed asked for whose
FedMKT run is not here keeps its every round from the previous ``.json`` (a seed whole, never mixing two
runs), and the file names it."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from experiments import plots, tables
from experiments.fedmkt_models import COLOURS, Runs, holders, metric_of, model_scores, slms
from experiments.tables import layout

SELECTED = {"llm_kd_selected": "LLM", "slm_kd_selected": "SLM (mean)"}


def over_rounds(cfg: Any, runs: Runs) -> dict[str, Any]:
    """Round -> column -> seed -> value of the finished FedMKT runs of ``runs`` (at its own lr where
    ``runs.own`` gives the FedMKT row one): the LLM's and each SLM's score, and how many public samples
    DualMinCE kept for the LLM's distillation (``llm_kd_selected``) and, the mean over clients, for an
    SLM's (``slm_kd_selected``)."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    setting, metric = runs.setting, runs.metric
    for seed in runs.seeds:
        run_dir = runs.path(f"{setting}-fedmkt", seed)
        rows = tables.finished_rows(run_dir)
        held = holders(cfg, setting, run_dir) if rows else {}
        for row in rows:
            cells = model_scores(row, held, metric)
            cells.update({key: float(row[key]) for key in SELECTED if key in row})
            for column, value in cells.items():
                out.setdefault(str(row["round"]), {}).setdefault(column, {})[str(seed)] = value
    return out


Round = tuple[str, dict[str, dict[str, float]]]  # a round and its columns' values by seed


def columns(names: list[str]) -> list[layout.Column[Round]]:
    """The round, the LLM's and each SLM's score x 100, and the samples selected."""

    def over_seeds(header: str, column: str, scale: float = 1.0) -> layout.Column[Round]:
        return layout.Column(header, lambda row: tables.cell(row[1].get(column), 1, scale))

    return [
        layout.Column("round", lambda row: row[0]),
        over_seeds("LLM", "llm", 100.0),
        *(over_seeds(name, name, 100.0) for name in names),
        *(over_seeds(f"selected: {label}", key) for key, label in SELECTED.items()),
    ]


def rounds_markdown(
    cfg: Any,
    curves: dict[str, Any],
    command: str,
    carried: dict[str, list[str]] | None = None,
    root: Path | None = None,
) -> str:
    """Per dataset and setting, every round of the FedMKT runs: scores and the samples selected."""
    parts = [
        f"# FedMKT over rounds: {cfg.name} (LLM {cfg.model.name}; scores x 100, mean ± std over seeds)",
        "",
        f"Round 0 is before any training (the table's Zero-shot row), round {cfg.fed.rounds} the table's "
        f"FedMKT row. Selected: how many of the {cfg.fedmkt.public_examples} public samples DualMinCE kept "
        "for the distillation, the LLM's (from all clients' knowledge) and an SLM's (from the LLM's, the "
        "mean over clients).",
        "",
    ]
    for key, by_round in curves.items():
        dataset, setting = key.rsplit("-", 1)
        names = slms(cfg, setting)
        parts += [f"## {dataset}, {setting}", "", layout.table(columns(names), by_round.items()), ""]
        if carried and key in carried:
            kept = ", ".join(carried[key])
            parts += [f"Seeds kept from this file's previous results (runs not in {root}): {kept}", ""]
    parts.append(f"Command: `{command}`")
    return "\n".join(parts)


def plot_rounds(cfg: Any, curves: dict[str, Any], path: Path) -> Path | None:
    """Per dataset and setting, two panels over rounds: each model's score, and the samples selected
    (mean over seeds, each seed a faint dot)."""
    from matplotlib.figure import Figure

    if not curves:
        return None
    figure = Figure(figsize=(1.0 + 4.4 * len(curves), 6.6), layout="constrained")
    grid = figure.subplots(2, len(curves), squeeze=False)
    for index, (key, by_round) in enumerate(curves.items()):
        top, bottom = grid[0][index], grid[1][index]
        setting = key.rsplit("-", 1)[1]
        series = [("llm", "LLM", 100.0, top)] + [(n, n, 100.0, top) for n in slms(cfg, setting)]
        series += [(k, f"selected: {label}", 1.0, bottom) for k, label in SELECTED.items()]
        for number, (column, label, scale, ax) in enumerate(series):
            points = [(int(r), c[column]) for r, c in by_round.items() if column in c]
            if not points:
                continue
            xs = [x for x, _ in points]
            colour = COLOURS[number % len(COLOURS)]
            ax.plot(
                xs,
                [scale * float(np.mean(list(v.values()))) for _, v in points],
                "-o",
                color=colour,
                label=label,
            )
            dots = [(x, scale * value) for x, v in points for value in v.values()]
            ax.scatter(*zip(*dots, strict=True), s=10, color=colour, alpha=0.4)
        top.set_title(key.replace("-", ", "), fontsize=9)
        bottom.set_xlabel("round")
        bottom.set_ylim(0, cfg.fedmkt.public_examples)
        for ax in (top, bottom):
            ax.set_xticks(sorted(int(r) for r in by_round))
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7, frameon=False)
    grid[0][0].set_ylabel("score x 100 (acc or Rouge-L)")
    grid[1][0].set_ylabel(f"public samples selected (of {cfg.fedmkt.public_examples})")
    plots.suptitle(figure, f"{cfg.name}: FedMKT over rounds; dots: each seed")
    return plots.save_figure(figure, path)


def write_rounds(
    cfg: Any, args: Any, root: Path, command: str, own: Mapping[str, float] | None = None
) -> None:
    """``rounds-<config>`` (.md, .json, .png): every round of the finished FedMKT runs asked for (``own``:
    the rows' own lrs, ``--row-lr``; with ``--keep-earlier``, and of the seeds asked for whose runs are
    elsewhere, from the previous file). Nothing is written where no run has a round and there is no
    previous file: an empty file would only sit beside the table."""
    stem = args.results_dir / f"rounds-{cfg.name}"
    earlier = tables.earlier_results(stem) if args.keep_earlier else {}
    curves: dict[str, Any] = {}
    carried: dict[str, list[str]] = {}
    for dataset in args.datasets:
        for setting in args.settings:
            key = f"{dataset}-{setting}"
            runs = Runs(root, dataset, setting, args.seeds, metric_of(cfg, dataset), own or {})
            by_round = over_rounds(cfg, runs)
            # a seed is kept whole or not at all: its rounds never mix two runs
            here = {seed for cells in by_round.values() for column in cells.values() for seed in column}
            wanted = [seed for seed in map(str, args.seeds) if seed not in here]
            by_group = tables.fill_cells(by_round, earlier.get(key, {}), wanted)
            kept = sorted({seed for seeds in by_group.values() for seed in seeds}, key=int)
            if kept:
                carried[key] = kept
            if by_round:
                curves[key] = dict(sorted(by_round.items(), key=lambda item: int(item[0])))
    if not curves and not tables.sibling(stem, ".json").exists():
        print(f"no FedMKT run here has a round to show: {stem.name} not written")
        return
    text = rounds_markdown(cfg, curves, command, carried, root)
    results = {**curves, "carried": carried} if carried else curves
    tables.write_table(stem, text, str(args.config), command, results, args)
    figure = plot_rounds(cfg, curves, tables.sibling(stem, ".png"))
    if figure is not None:
        print(f"plot: {figure}")


def render_rounds(recorded: tables.Recorded) -> str:
    cfg, args, results = recorded.cfg, recorded.args, recorded.results
    curves = {key: value for key, value in results.items() if key != "carried"}
    carried = results.get("carried", {})
    return rounds_markdown(cfg, curves, recorded.command, carried, args.runs_dir / cfg.name)
