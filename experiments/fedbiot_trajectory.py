"""FedBiOT's methods over rounds, beside its table (``--trajectory``): AdapEmu and AdapFu at every round the
runs evaluated (round 0: right after the initial emulator distillation), with each seed's best round
beside the last, as the paper reports the best checkpoint of a long run."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from experiments import plots, tables
from experiments.fedbiot_rows import COLOURS

MODELS = (("adapemu", "AdapEmu"), ("adapfu", "AdapFu"))


def trajectory_summary(run_dirs: list[Path], metric: str) -> dict[str, Any]:
    """Per evaluated round (over the seeds whose run finished): mean ± std of AdapEmu / AdapFu ``metric``
    and perplexity, and per seed the best round by AdapFu ``metric``; a tie goes to the lower AdapFu
    perplexity, then to the earlier round (a metric that is 0 in every round leaves perplexity to decide)."""
    by_seed = {
        tables.seed_of(d): {int(r["round"]): r["eval"] for r in tables.finished_rows(d) if r.get("eval")}
        for d in run_dirs
    }
    by_seed = {seed: rounds for seed, rounds in by_seed.items() if rounds}
    out: dict[str, Any] = {"seeds": len(by_seed), "rounds": {}}
    if not by_seed:
        return out
    common = sorted(set.intersection(*(set(rounds) for rounds in by_seed.values())))
    for rnd in common:
        cells = {}
        for model, _ in MODELS:
            for name in dict.fromkeys([metric, "perplexity"]):
                key = f"{model}/{name}"
                values = [rounds[rnd][key] for rounds in by_seed.values() if key in rounds[rnd]]
                if values:
                    cells[key] = tables.mean_std(values)
        out["rounds"][str(rnd)] = cells
    sign = 1.0 if metric != "perplexity" else -1.0
    out["best_round"] = {}
    for seed, rounds in by_seed.items():
        scores = [(sign * rounds[r][f"adapfu/{metric}"], -rounds[r]["adapfu/perplexity"], -r) for r in common]
        out["best_round"][seed] = common[scores.index(max(scores))]
    return out


def trajectory_markdown(
    cfg: Any, metric: str, curves: dict[str, dict[str, Any]], labels: Mapping[str, str], command: str
) -> str:
    """Per method (``labels``: row -> name) and dropout, every evaluated round, and each one's best."""
    scale = 100.0 if metric != "perplexity" else 1.0
    unit = " (%)" if scale == 100.0 else ""
    names = list(dict.fromkeys([metric, "perplexity"]))
    header = ["method", "dropout", "round"]
    header += [f"{label} {name}{unit if name == metric else ''}" for name in names for _, label in MODELS]
    rows, notes = [], []
    for key, curve in curves.items():
        method, d = key.split("-d")
        for rnd, cells in curve["rounds"].items():
            row = [labels.get(method, method), d, rnd]
            for name in names:
                for model, _ in MODELS:
                    value = cells.get(f"{model}/{name}")
                    factor = scale if name == metric else 1.0
                    std = value[1] * factor if value is not None and curve["seeds"] > 1 else None
                    shown = "-" if value is None else tables.plus_minus(value[0] * factor, std)
                    row.append(shown)
            rows.append(row)
        if curve["rounds"]:
            trained = [r for r in curve["rounds"] if r != "0"]
            first, last = (curve["rounds"][r]["adapfu/perplexity"][0] for r in (trained[0], trained[-1]))
            best = ", ".join(f"seed {s}: round {r}" for s, r in curve["best_round"].items())
            label = labels.get(method, method)
            notes.append(
                f"{label}, d={d}: AdapFu perplexity {first:.3f} at round {trained[0]} -> {last:.3f} at round "
                f"{trained[-1]} ({'falls' if last < first else 'rises or holds'}); "
                f"best round by AdapFu {metric} (a tie: by AdapFu perplexity): {best}"
            )
    return "\n".join(
        [
            f"# {cfg.name}: AdapEmu and AdapFu over rounds, mean ± std over seeds",
            "",
            f"`{command}`; model {cfg.model.name}, {cfg.fed.rounds} rounds, every client every round "
            f"unless fed.clients_per_round says less, K = {cfg.train.max_steps} local steps (batch "
            f"{cfg.train.batch_size}), {cfg.eval.max_examples} test examples. Round 0: right after the "
            "initial emulator distillation (AdapFu is then the base model).",
            "",
            tables.markdown_table(header, rows),
            "",
            *[f"- {note}" for note in notes],
        ]
    )


def plot_trajectory(
    cfg: Any, metric: str, curves: dict[str, dict[str, Any]], labels: Mapping[str, str], path: Path
) -> Path:
    """Four panels (AdapEmu / AdapFu x the table's metric / perplexity), one line per method and dropout,
    mean over seeds with a ± std band."""
    from matplotlib.figure import Figure

    scale = 100.0 if metric != "perplexity" else 1.0
    names = list(dict.fromkeys([metric, "perplexity"]))
    figure = Figure(figsize=(9.0, 3.2 * len(names) + 0.6), layout="constrained")
    grid = figure.subplots(len(names), 2, squeeze=False)
    dropouts = sorted({key.split("-d")[1] for key in curves})
    for row, name in zip(grid, names, strict=True):
        factor = scale if name == metric else 1.0
        for ax, (model, label) in zip(row, MODELS, strict=True):
            for key, curve in curves.items():
                method, d = key.split("-d")
                key_name = f"{model}/{name}"
                points = [(int(r), c[key_name]) for r, c in curve["rounds"].items() if key_name in c]
                if not points:
                    continue
                xs = np.array([x for x, _ in points])
                mean = np.array([v[0] for _, v in points]) * factor
                std = np.array([v[1] for _, v in points]) * factor
                style = "-" if d == dropouts[0] else "--"
                colour = COLOURS.get(method, "#7f7f7f")
                label_d = f"{labels.get(method, method)} d={d}"
                ax.plot(xs, mean, style, marker="o", color=colour, label=label_d)
                ax.fill_between(xs, mean - std, mean + std, color=colour, alpha=0.15)
            ax.set_title(f"{label}: {name}{' (%)' if factor == 100.0 else ''}")
            ax.set_xlabel("round")
            if name == "perplexity":
                ax.set_yscale("log")
            ax.grid(True, alpha=0.3)
    handles, names = grid[0][0].get_legend_handles_labels()
    figure.legend(handles, names, loc="outside lower center", ncols=max(1, len(names)), frameon=False)
    plots.suptitle(figure, f"{cfg.name}: {cfg.model.name}, AdapEmu and AdapFu over rounds", fontsize=None)
    return plots.save_figure(figure, path)
