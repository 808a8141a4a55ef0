"""FedPT against the quality of the clients' small model, beside its table (``--small-models``): FedAvg
(small) and FedPT with each model named as the clients' (the large model stays the config's), written to
``study-small-<config>`` (.md, .json, .png)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.common import now

from experiments import plots, tables
from experiments.fedpt_rows import LABELS, run_overrides, test_sets
from experiments.tables import layout

STUDY_METHODS = ("fedavg_small", "fedpt")


def layer_count(model: str) -> int:
    from fedtune.models.loading import parse_tiny_name, resolve_source

    tiny = parse_tiny_name(model)
    if tiny is not None:
        return tiny.num_layers
    return int(
        json.loads((Path(resolve_source(model, "causal-lm")) / "config.json").read_text())[
            "num_hidden_layers"
        ]
    )


def held_out_perplexity(model: str) -> float | None:
    """The model's perplexity on the held-out public texts of `fedtune models derive`: a derived model's
    own (after its distillation), or, for a model others were derived from, the teacher's there."""
    from fedtune.models.loading import DERIVED_DIR, DERIVED_MARKER, derived_path
    from fedtune.models.zoo import default_cache_dir

    own = derived_path(model)
    if own is not None:
        return float(json.loads((own / DERIVED_MARKER).read_text())["student_ppl_after"])
    for info in sorted((default_cache_dir() / DERIVED_DIR).glob(f"*/{DERIVED_MARKER}")):
        saved = json.loads(info.read_text())
        if saved.get("source") == model:
            return float(saved["teacher_ppl"])
    return None


def study_root(args: Any, cfg: Any, model: str, layers: int) -> Path:
    """The config's own small model runs under the table's directory, another under ``<name>-l<layers>``."""
    return Path(args.runs_dir) / (cfg.name if model == cfg.model.name else f"{cfg.name}-l{layers}")


def render_study(recorded: tables.Recorded) -> str:
    return study_text(recorded.cfg, recorded.results, recorded.command, tables.stamp_of(recorded))


def small_model_study(args: Any, cfg: Any, command: str) -> None:
    """FedAvg (small) and FedPT with each of ``--small-models`` as the clients' model (the large model
    stays the config's); the large model itself as the small one is FedAvg (large), FedPT's target."""
    layers = {model: layer_count(model) for model in args.small_models}
    roots = {model: study_root(args, cfg, model, layers[model]) for model in args.small_models}
    runs = {
        roots[model] / method: run_overrides(method, cfg, [*args.set, f"model.name={model}"])
        for model in args.small_models
        for method in STUDY_METHODS
    }
    tables.start(args, runs, jobs=1, threads=None)
    sets = test_sets(cfg)
    results: dict[str, Any] = {}
    for model, root in roots.items():
        entry: dict[str, Any] = {"layers": layers[model], "held_out_ppl": held_out_perplexity(model)}
        for method in STUDY_METHODS:
            final = tables.last_evaluated(tables.finished_rows(root / method))
            if final is not None:
                entry[method] = final["eval"]
        results[model] = entry
    text = study_text(cfg, results, command)
    study_runs = (root / method for root in roots.values() for method in STUDY_METHODS)
    text += tables.rejected_note(study_runs, under=Path(args.runs_dir))
    stem = args.results_dir / f"study-small-{cfg.name}"
    tables.write_table(stem, text, cfg.name, command, results, args)
    plot_small_model_study(cfg, results, sets, tables.sibling(stem, ".png"))


def study_text(cfg: Any, results: dict[str, Any], command: str, stamp: str | None = None) -> str:
    """The small-model study's table; ``stamp``: the time it was made (None: now)."""
    large = results.get(cfg.fedpt.large_model, {}).get("fedavg_small")
    columns: list[layout.Column[layout.Entry]] = [
        layout.Column("client model", lambda row: row[0]),
        layout.Column("layers", lambda row: str(row[1]["layers"])),
        layout.Column("held-out ppl", lambda row: layout.number(row[1]["held_out_ppl"], 1)),
        layout.Column("FedAvg (small) test ppl", lambda row: _plain(row, "fedavg_small", "perplexity")),
    ]
    for label, prefix in test_sets(cfg):
        columns += _rouge_columns(label, prefix + "rougeL", large)
    columns += [
        layout.Column("FedPT test ppl", lambda row: _plain(row, "fedpt", "perplexity")),
        layout.Column("alpha", lambda row: str(_of(row, "fedpt").get("alpha", "-"))),
    ]
    return "\n".join(
        [
            f"# {cfg.name}: FedPT against the quality of the clients' small model",
            "",
            f"`{command}` — {stamp or now()}",
            "",
            f"Large model {cfg.fedpt.large_model}; each row's clients tune the small model named (FedAvg "
            "(small)) and FedPT proxy-tunes the large model with it. The large model as its own small model "
            "is FedAvg (large), FedPT's target. Held-out ppl: perplexity on the held-out public texts of "
            "`fedtune models derive` (the source's own for the large model). Rouge-L: mean ± std over the "
            "sampling seeds; test ppl: deterministic, on the in-domain test set.",
            "",
            layout.table(columns, results.items()),
        ]
    )


def _rouge_columns(label: str, key: str, large: dict[str, Any] | None) -> list[layout.Column[layout.Entry]]:
    """A test set's Rouge-L of FedAvg (small) and FedPT, and FedPT's gap to FedAvg (large)."""
    return [
        layout.Column(f"FedAvg (small) {label}", lambda row: layout.mean_std(_of(row, "fedavg_small"), key)),
        layout.Column(f"FedPT {label}", lambda row: layout.mean_std(_of(row, "fedpt"), key)),
        layout.Column(f"FedPT - FedAvg (large) {label}", lambda row: _gap(_of(row, "fedpt"), large, key)),
    ]


def _gap(fedpt: dict[str, Any], large: dict[str, Any] | None, key: str) -> str:
    return "-" if not large or key not in fedpt else f"{fedpt[key] - large[key]:+.4f}"


def _of(row: layout.Entry, method: str) -> dict[str, Any]:
    return dict(row[1].get(method, {}))


def _plain(row: layout.Entry, method: str, key: str) -> str:
    return layout.number(_of(row, method).get(key))


def plot_small_model_study(
    cfg: Any, results: dict[str, Any], sets: list[tuple[str, str]], path: Path
) -> Path:
    """Per test set: Rouge-L of FedAvg (small) and FedPT against the small model's held-out perplexity
    (log axis), FedAvg (large) as a line."""
    figure, axes, first = plots.panel_grid(len(sets), 4.4, 3.3)
    points = [(entry["held_out_ppl"], entry) for entry in results.values() if entry["held_out_ppl"]]
    points.sort(key=lambda item: item[0])
    large = results.get(cfg.fedpt.large_model, {}).get("fedavg_small", {})
    for ax, (label, prefix) in zip(axes, sets, strict=True):
        key = prefix + "rougeL"
        for method, colour in (("fedavg_small", "#7f7f7f"), ("fedpt", "#1f77b4")):
            shown = [(x, e[method]) for x, e in points if key in e.get(method, {})]
            if shown:
                ax.errorbar(
                    [x for x, _ in shown],
                    [m[key] for _, m in shown],
                    yerr=[m.get(f"{key}_std", 0.0) for _, m in shown],
                    marker="o",
                    capsize=3,
                    color=colour,
                    label=LABELS[method],
                )
        if key in large:
            ax.axhline(large[key], color="#d62728", linestyle="--", label="FedAvg (large)")
        ax.set_title(label)
    title = f"{cfg.name}: FedPT against the small model's quality"
    xlabel = "small model's held-out perplexity"
    return plots.finish_grid(
        figure, axes, first, xlabel=xlabel, ylabel="Rouge-L", title=title, path=path, log_x=True
    )
