"""FedPFT's comparison at small scale: FedOT, FedPFT, FedPETuning and the two ablations, side by side.

    python experiments/fedpft_table.py configs/paper/fedpft-minilm.yaml --jobs 2  # run what is missing
    python experiments/fedpft_table.py configs/paper/fedpft-minilm.yaml --datasets lexclass wic --seeds 0 1 2
    python experiments/fedpft_table.py configs/paper/fedpft-minilm.yaml --partitions iid dir1 dir5 dir10
    python experiments/fedpft_table.py configs/paper/fedpft-minilm.yaml --set model.name=smollm2-135m
    python experiments/fedpft_table.py configs/paper/fedpft-minilm.yaml --table-only

Rows (each a normal run directory ``--runs-dir/<config name>/<row>-<dataset>-<partition>-s<seed>``):
``fedot_kd`` (FedOT: the layer-drop emulator distilled as Offsite-tuning does, with FedPFT's distillation
budget), ``fedot`` (the emulator as cut, not distilled: an ablation), ``fedpft``, ``fedpetuning`` (the full
model), ``no_layer`` (FedPFT
without layer-level distillation), ``no_neuron`` (without neuron-level distillation); on demand
``fedpft_rel`` (FedPFT distilled with ``hidden_loss: token_relative``, for decoders) and
``fedot_emu`` (FedOT with LoRA trained on the emulator's layers as well as on the adapter). Datasets:
``lexclass`` (wordnet-lexclass, single sentences, 24 classes), ``wic`` (wordnet-wic, sentence
pairs, 2 classes) and ``hypernym`` (wordnet-hypernym-yn, question + definition pairs, 2 classes).
Partitions: IID and Dirichlet(alpha) label skew over the class.

The table gives the final accuracy and macro-F1 of the LoRA + head plugged into the full model
(mean ± std over seeds), the sub-model's own accuracy, what a client holds (parameters and the
simulation's peak RSS, which holds every model of the run), and the MB sent down and up per round;
then whether the expected ordering FedOT < FedPFT <= FedPETuning holds (for the distilled and the
undistilled FedOT) and whether each distillation step helps (FedOT's too). A plot beside the table
(``table-<config name>.png``) shows the same accuracies, one panel per dataset and partition, with each
seed's value as a dot. Runs are subprocesses, ``--jobs`` at a time with one thread each; rerunning
resumes unfinished runs and skips finished ones. ``--keep-earlier``: a row none of whose runs is in
``--runs-dir`` (made on another machine) keeps, whole, the value the table's previous results file
recorded, and the table names it.

``--lrs LR ...`` sweeps the learning rate instead: every row at each lr (run directories
``lr<lr>-<row>-<dataset>-<partition>-s<seed>``), scored on the dataset's validation split, never the test
split; ``sweep-lr-<config name>`` (.md, .json, .png) gives each row's validation accuracy by lr and picks
one lr for all rows, the one with the highest mean over the rows and settings swept.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments import fedpft_lr, plots, tables
from experiments.fedpft_rows import (
    DATASETS,
    LABELS,
    ON_DEMAND,
    PARTITIONS,
    ROWS,
    row_overrides,
    suffixes_of,
    summarise,
)
from experiments.tables import layout


def _compare(
    results: dict[str, dict[str, Any]], low: str, high: str, suffix: str, strict: bool
) -> str | None:
    a, b = results.get(f"{low}-{suffix}", {}), results.get(f"{high}-{suffix}", {})
    if "accuracy" not in a or "accuracy" not in b:
        return None
    if a["constant"] and b["constant"]:
        return f"- {suffix}: {LABELS[low]} vs {LABELS[high]}: not informative, both predict one class"
    verdict = tables.verdict([a["accuracy"], b["accuracy"]], strict)
    wins, seeds = tables.seeds_holding([a["accuracy_by_seed"], b["accuracy_by_seed"]])
    sign = "<" if strict else "<="
    digits = 1 if f"{a['accuracy']:.1f}" != f"{b['accuracy']:.1f}" else 2  # show what decided it
    noise = tables.claim_text([a["accuracy_by_seed"], b["accuracy_by_seed"]])
    return (
        f"- {suffix}: {LABELS[low]} {sign} {LABELS[high]}: {verdict} "
        f"({a['accuracy']:.{digits}f} vs {b['accuracy']:.{digits}f}; lower in {wins} of {seeds} seeds; "
        f"{noise})"
    )


def ordering(results: dict[str, dict[str, Any]], suffixes: list[str]) -> list[str]:
    pairs = [("fedot_kd", "fedpft", True), ("fedot", "fedpft", True), ("fedpft", "fedpetuning", False)]
    pairs += [("no_layer", "fedpft", True), ("no_neuron", "fedpft", True), ("fedot", "fedot_kd", True)]
    lines = [
        _compare(results, low, high, suffix, strict) for suffix in suffixes for low, high, strict in pairs
    ]
    return [line for line in lines if line]


def _params(result: dict[str, Any]) -> str:
    params = result.get("params", {})
    if not params:
        return "-"
    return f"{params['client_params'] / 1e6:.1f}M of {params['full_params'] / 1e6:.1f}M"


COLUMNS: list[layout.Column[layout.Entry]] = [
    layout.Column("method", lambda entry: LABELS[entry[0].split("-")[0]]),
    layout.Column("data", lambda entry: entry[0].split("-")[1]),
    layout.Column("partition", lambda entry: entry[0].split("-")[2]),
    layout.Column(
        "accuracy",
        lambda e: tables.cell(e[1]["accuracy_by_seed"], 1) + (" (one class)" if e[1]["constant"] else ""),
    ),
    layout.over_seeds("macro-F1", "macro_f1"),
    layout.over_seeds("sub-model acc.", "sub/accuracy"),
    layout.Column("client holds", lambda entry: _params(entry[1])),
    layout.value("peak RSS MB (sim.)", "peak_rss_mb", 0),
    layout.value("MB down/round", "mb_down_per_round", 1),
    layout.value("MB up/round", "mb_up_per_round"),
    layout.SEEDS,
]


def columns(cfg: Any, rows: list[layout.Entry]) -> list[layout.Column[layout.Entry]]:
    """`COLUMNS`, with each row's learning rate after the partition when a row recorded one (rows from
    before runs recorded it trained at the table's ``train.lr``)."""
    if not any("lr" in result for _, result in rows):
        return COLUMNS
    lr: layout.Column[layout.Entry] = layout.Column(
        "lr", lambda entry: f"{entry[1].get('lr', cfg.train.lr):g}"
    )
    return [*COLUMNS[:3], lr, *COLUMNS[3:]]


def markdown(cfg: Any, results: dict[str, dict[str, Any]], suffixes: list[str], command: str) -> str:
    rows = [(key, result) for key, result in results.items() if result.get("seeds")]
    return "\n".join(
        [
            f"# {cfg.name}: accuracy (%) of the final LoRA + head in the full model ({cfg.model.name})",
            "",
            f"`{command}`",
            "",
            layout.table(columns(cfg, rows), rows),
            "",
            *(
                [
                    "(one class): every seed's model predicts one class of two (macro-F1 = acc / (1 + acc)).",
                    "",
                ]
                if any(r.get("constant") for r in results.values())
                else []
            ),
            "Ordering (expected: FedOT < FedPFT <= FedPETuning; each distillation step helps):",
            *ordering(results, suffixes),
        ]
    )


SHORT = {
    "fedot_kd": "FedOT\ndistilled",
    "fedot": "FedOT",
    "fedpft": "FedPFT",
    "fedpetuning": "FedPETuning",
    "no_layer": "w/o layer\ndistillation",
    "no_neuron": "w/o neuron\ndistillation",
    "fedpft_rel": "FedPFT\ntoken-relative",
    "fedot_emu": "FedOT, LoRA\non emulator",
}
"""Tick labels of the plot."""


def plot(cfg: Any, results: dict[str, dict[str, Any]], suffixes: list[str], path: Path) -> Path | None:
    """One panel per dataset and partition: per method the accuracy of the LoRA + head in the full
    model and the sub-model's own, mean ± std as a marker with whiskers and each seed as a dot. The
    axis is zoomed to the data (differences are a few points), so bars would hide them."""

    def shown(method: str, suffix: str) -> bool:
        return bool(results.get(f"{method}-{suffix}", {}).get("seeds"))

    series = (
        ("accuracy", -0.13, "#1f77b4", "o", "in the full model"),
        ("sub/accuracy", 0.13, "#ff7f0e", "s", "sub-model"),
    )
    panels = []
    for suffix in (s for s in suffixes if any(shown(m, s) for m in LABELS)):
        rows = [results[f"{m}-{suffix}"] for m in LABELS if shown(m, suffix)]
        one_class = ": every model predicts one class" if all(r["constant"] for r in rows) else ""
        dataset, part = suffix.split("-")
        seeds = tables.seeds_text(max(r["seeds"] for r in rows))
        panels.append(
            plots.Panel(
                f"{dataset}, {part} ({seeds}){one_class}",
                [SHORT[m] for m in LABELS if shown(m, suffix)],
                [
                    plots.Series(
                        label, colour, marker, shift, [r.get(f"{key}_by_seed", {}).values() for r in rows]
                    )
                    for key, shift, colour, marker, label in series
                ],
            )
        )
    if not panels:
        return None
    title = f"{cfg.name}: {cfg.model.name}, mean ± std over seeds; faint dots: each seed"
    return plots.seed_panels(panels, width=4.2, height=3.4, ylabel="accuracy (%)", title=title, path=path)


def main(argv: list[str] | None = None) -> None:
    parser = tables.table_parser(__doc__, keep_earlier=True)
    default_rows = [row for row in ROWS if row not in ON_DEMAND]
    parser.add_argument("--rows", nargs="+", default=default_rows, choices=list(ROWS))
    parser.add_argument("--datasets", nargs="+", default=["lexclass"], choices=list(DATASETS))
    parser.add_argument("--partitions", nargs="+", default=["iid"], choices=list(PARTITIONS))
    parser.add_argument(
        "--lrs", nargs="+", type=float, help="sweep train.lr (validation split); picks one lr for all rows"
    )
    tables.row_lr_option(parser, "fedot=0.01")
    args = tables.parse_args(parser, argv)
    own_lr = tables.row_lrs(parser, args.row_lr, ROWS)
    if args.render:
        renderers = {"table-": render_table, "sweep-lr-": fedpft_lr.render_lr_sweep}
        tables.render(args.render, parser, renderers, args.results_dir)
        return
    cfg = tables.load_config(args)
    base = args.runs_dir / cfg.name
    command = tables.command_line(__file__, argv)
    suffixes = suffixes_of(args)
    if args.lrs:
        fedpft_lr.lr_sweep(args, cfg, base, suffixes, command)
        return
    rows = {f"{row}-{suffix}": row_overrides(row, suffix) for suffix in suffixes for row in args.rows}
    stems = tables.at_own_lr(rows, own_lr, lambda key: key.split("-")[0])
    runs = tables.plan(base, rows, args.seeds, args.set, stems=stems, seed_major=True)
    tables.start(args, runs.runs)
    results = {key: summarise(paths) for key, paths in runs.dirs.items()}
    stem = args.results_dir / f"table-{cfg.name}"
    kept = tables.keep_earlier_rows(results, stem) if args.keep_earlier else []
    text = markdown(cfg, results, suffixes, command)
    text += tables.closing_notes(runs.dirs, stem, args, kept_rows=kept_names(kept))
    tables.write_table(stem, text, cfg.name, command, results, args)
    plot(cfg, results, suffixes, tables.sibling(stem, ".png"))


def kept_names(kept: list[str]) -> list[str]:
    """The rows ``--keep-earlier`` took from the previous results file, named as the table does."""
    return [" ".join([LABELS[row], dataset, part]) for row, dataset, part in (key.split("-") for key in kept)]


def render_table(recorded: tables.Recorded) -> str:
    return markdown(recorded.cfg, recorded.results, suffixes_of(recorded.args), recorded.command)


if __name__ == "__main__":
    main()
