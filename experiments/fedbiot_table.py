"""FedBiOT's Tables 1-3 at small scale: Offsite-tuning, FedOT and FedBiOT side by side on one task.

    python experiments/fedbiot_table.py configs/paper/fedbiot-math.yaml             # run what is missing
    python experiments/fedbiot_table.py configs/paper/fedbiot-math.yaml --seeds 0 1 2 --dropouts 0.2 --jobs 2
    python experiments/fedbiot_table.py configs/paper/fedbiot-math.yaml --ablation  # Appendix C: lambda, eps
    python experiments/fedbiot_table.py configs/paper/fedbiot-math.yaml --table-only
    python experiments/fedbiot_table.py configs/paper/fedbiot-math.yaml --init-sweep 30 100 300 500

Methods (each a normal run directory ``--runs-dir/<config name>/<method>-d<dropout>-s<seed>``):
- ``offsite``: Offsite-tuning: one client holding all data (``fed.mode=centralized``), adapter = first 2 +
  last 2 layers, emulator distilled once (``align_steps=0``) by the hidden-state MSE alone (no FedBiOT KL
  term: ``align_lambda=0``), no proximal term;
- ``fedot``: FedOT, the same split and fixed emulator, federated;
- ``offsite_lm`` / ``fedot_lm`` (run when ``--methods`` names them): the two baselines with their papers'
  LM term beside the MSE in the emulator's distillation (``fedbiot.align_lm``, 1/30 of it);
- ``fedbiot_a2`` / ``fedbiot_a4``: FedBiOT with the last 2 / 4 layers as the adapter.
Each is evaluated as AdapEmu (adapter + emulator) and AdapFu (adapter + full model) at the last round;
the table gives mean ± std over seeds (the sample std), bytes per round and what a client holds.

``--lrs LR ...`` searches the lr of each method on the validation split at the first dropout
(`experiments.fedbiot_lr`: ``sweep-lr-<config name>``, each method's best lr); ``--row-lr METHOD=LR ...``
then runs the table's methods at their own lr (run directories ``<method>-d<dropout>-lr<lr>-s<seed>``),
and the table's lr column says which lr each row trained at.
``--init-sweep I_0 ...`` measures how many steps the initial emulator distillation needs
(`experiments.fedbiot_init`); ``--ablation`` is Appendix C's lambda and eps (`experiments.fedbiot_ablation`).

``--trajectory`` also writes ``trajectory-<config name>`` (.md, .json, .png): AdapEmu and AdapFu of each
method at every round the runs evaluated (round 0: right after the initial distillation), with each
method's best round beside its last, as the paper reports the best checkpoint of a long run
(``configs/paper/fedbiot-math-traj.yaml``: 30 rounds, every client every round, evaluated every 10).
``--keep-earlier`` keeps, for a row none of whose runs is in ``--runs-dir`` (made on another machine), the
value the previous results file recorded, and the table says which rows it kept; in a row with runs here,
a seed asked for whose run is not here takes the previous file's values for that seed (mean ± std over the
merged seeds), and the table names those seeds (the trajectory keeps whole rows only).
``--set`` applies to every run, but never over what defines a row (a method's split, its ``align_steps``,
the dropout, an ablation's key, I_0): ``--set fedbiot.align_steps=10`` sets FedBiOT's E and leaves
Offsite-tuning's and FedOT's fixed emulator fixed.
Every run is a subprocess (``python -m fedtune run``, its output in ``<run dir>.log``): a crash loses
only that run; rerunning resumes unfinished runs and skips finished ones. ``--jobs N`` runs N at once, one
thread each (``--jobs 2`` on two cores); runs sharing an initial distillation wait for the first to save it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments import fedbiot_ablation, fedbiot_init, fedbiot_lr, plots, tables
from experiments.fedbiot_rows import BASELINES, LABELS, METHODS, ON_DEMAND, primary_metric, start
from experiments.fedbiot_trajectory import plot_trajectory, trajectory_markdown, trajectory_summary
from experiments.tables import layout


def summarise(run_dirs: list[Path], metric: str) -> dict[str, Any]:
    """Mean / std over seeds of AdapEmu and AdapFu, plus traffic and client size of the first run."""
    # A seed also draws the test subset (eval.max_examples), so methods are compared seed by seed too.
    by_seed = {seed: final["eval"] for seed, final in tables.finals(run_dirs).items()}
    out: dict[str, Any] = {"seeds": len(by_seed)}
    names = (metric, "perplexity")
    out |= tables.seed_values(
        by_seed, [f"{model}/{name}" for model in ("adapemu", "adapfu") for name in names]
    )
    done = [d for d in run_dirs if tables.seed_of(d) in by_seed]
    if done:
        rows = tables.trained_rows(tables.read_rows(done[0]))
        out["mb_down_per_round"] = tables.per_round_mb(rows, "bytes_down", 2**20)
        out["mb_up_per_round"] = tables.per_round_mb(rows, "bytes_up", 2**20)
        out["emulator_sends"] = int(sum(r.get("emulator_sends", 0) for r in rows))
        lr = tables.run_lr(done[0])
        if lr is not None:
            out["lr"] = lr
    # How far the clients moved the adapter (what the proximal term acts on): per seed the mean over
    # the trained rounds, then mean ± std over seeds; runs that predate the metric have none.
    trained = {tables.seed_of(d): tables.trained_rows(tables.read_rows(d)) for d in done}
    for key in ("adapter_shift", "adapter_shift_pct"):
        shifts = {
            seed: float(np.mean(values))
            for seed, seed_rows in trained.items()
            if (values := [r[key] for r in seed_rows if key in r])
        }
        if shifts:
            out |= tables.over_seeds(key, shifts)
    info_path = done[0] / "artifacts" / "fedbiot.json" if done else None
    if info_path is not None and info_path.is_file():
        info = json.loads(info_path.read_text())
        out["client"] = info.get("params", {})
        out["split"] = info.get("split", {})
    return out


def _intervals(present: dict[str, dict[str, float]], method: str, baselines: list[str], metric: str) -> str:
    """The paired interval of ``method`` against each baseline, on the seeds the two share (``present``:
    row -> seed -> value of ``metric``): a baseline run at fewer seeds than the others does not cut every
    other pair down to its seeds."""
    parts = []
    for m in baselines:
        pair = tables.common_seeds([present[m], present[method]])
        texts = tables.interval_texts(
            [{s: present[m][s] for s in pair}, {s: present[method][s] for s in pair}],
            lower_is_better=metric == "perplexity",
            digits=2 if metric == "perplexity" else 4,
        )
        parts.append(f"vs {LABELS[m]} {texts[0]}")
    return "by interval: " + "; ".join(parts)


def ordering_checks(results: dict[str, dict[str, Any]], metric: str, dropouts: list[float]) -> list[str]:
    """Whether each FedBiOT row is at least as good as the baselines (higher is better but for
    perplexity): on the means over the seeds all three rows have (a seed also draws the test subset),
    and seed by seed."""
    sign = -1.0 if metric == "perplexity" else 1.0
    checks = []
    for d in dropouts:
        for name, model in (("AdapEmu", "adapemu"), ("AdapFu", "adapfu")):
            key = f"{model}/{metric}_by_seed"
            present = {m: results.get(f"{m}-d{d}", {}).get(key, {}) for m in LABELS}
            compared = [m for m in BASELINES if present[m]]
            for method in ("fedbiot_a2", "fedbiot_a4"):
                names = [method, *compared]
                seeds = tables.common_seeds([present[m] for m in names])
                if not compared or not seeds:
                    continue
                ours, *baselines = [float(np.mean([present[m][s] for s in seeds])) for m in names]
                against = {
                    m: tables.verdict([sign * v, sign * ours], strict=False)
                    for m, v in zip(compared, baselines, strict=True)
                }
                beaten = [LABELS[m] for m, v in against.items() if v == "does not hold"]
                if all(v == "tie" for v in against.values()):
                    verdict = "tie (nothing separates them)"
                else:
                    verdict = "holds" if not beaten else f"does not hold (worse than {', '.join(beaten)})"
                numbers = ", ".join(f"{LABELS[m]} {v:.4g}" for m, v in zip(compared, baselines, strict=True))
                wins = sum(
                    all(
                        tables.rises([sign * present[m][s], sign * present[method][s]], False)
                        for m in compared
                    )
                    for s in seeds
                )
                checks.append(
                    f"d={d}, {name}, {len(seeds)} seed(s): {LABELS[method]} {ours:.4g} vs {numbers}: "
                    f"{verdict}; at least as good as every baseline in {wins} of {len(seeds)} seed(s); "
                    + _intervals(present, method, compared, metric)
                )
    return checks


def markdown(
    cfg: Any, metric: str, results: dict[str, dict[str, Any]], dropouts: list[float], command: str
) -> str:
    scale = 100.0 if metric != "perplexity" else 1.0
    unit = " (%)" if scale == 100.0 else ""
    header = ["method"]
    for d in dropouts:
        header += [f"AdapEmu d={d}", f"AdapFu d={d}"]
    header += ["MB down / round", "MB up / round", "client params (M)", "adapter params (M)"]
    with_lr = any("lr" in r for r in results.values())
    if with_lr:
        header.insert(1, "lr")
    seeds = max((r.get("seeds", 0) for r in results.values()), default=0)
    rows = []
    for method, label in LABELS.items():
        cells = [label]
        first: dict[str, Any] = {}
        for d in dropouts:
            result = results.get(f"{method}-d{d}", {})
            first = first or result
            cells += [
                layout.seeds_cell(result, f"adapemu/{metric}", scale, seeds),
                layout.seeds_cell(result, f"adapfu/{metric}", scale, seeds),
            ]
        if not first:
            continue
        if with_lr:  # a row kept from a results file that predates the column ran at the config's lr
            cells.insert(1, f"{first.get('lr', cfg.train.lr):g}")
        client = first.get("client", {})
        cells += [
            f"{first.get('mb_down_per_round', 0):.1f}",
            f"{first.get('mb_up_per_round', 0):.1f}",
            f"{client.get('client_params', 0) / 1e6:.1f}",
            f"{client.get('adapter_params', 0) / 1e6:.1f}",
        ]
        rows.append(cells)
    lines = [
        f"# {cfg.name}: {metric}{unit} of AdapEmu / AdapFu, mean ± std over {seeds} seed(s)",
        "",
        f"`{command}`; model {cfg.model.name}, {cfg.fed.rounds} rounds, K = {cfg.train.max_steps} "
        f"local steps (batch {cfg.train.batch_size}), {cfg.eval.max_examples} test examples. MB per "
        "round are for the first seed and the first dropout listed (all clients of a round together).",
        "",
        tables.markdown_table(header, rows),
    ]
    for name in dict.fromkeys([metric, "perplexity"]):
        checks = ordering_checks(results, name, dropouts)
        if checks:
            better = "lower" if name == "perplexity" else "higher"
            heading = "The paper's ordering, FedBiOT at least as good as Offsite-tuning and FedOT"
            lines += ["", f"{heading}, on mean {name} ({better} is better):", ""]
            lines += [f"- {check}" for check in checks]
    ppl = [
        [
            LABELS.get(k.split("-d")[0], k),
            k.split("-d")[1],
            layout.seeds_cell(v, "adapemu/perplexity", seeds=seeds),
            layout.seeds_cell(v, "adapfu/perplexity", seeds=seeds),
        ]
        for k, v in results.items()
        if "adapfu/perplexity" in v
    ]
    if ppl:
        lines += [
            "",
            "Perplexity on the test set:",
            "",
            tables.markdown_table(["method", "dropout", "AdapEmu", "AdapFu"], ppl),
        ]
    return "\n".join(lines)


def plot(
    cfg: Any, metric: str, results: dict[str, dict[str, Any]], dropouts: list[float], path: Path
) -> Path:
    """Grouped bars: per dropout one panel, per method AdapEmu and AdapFu, mean with a ± std whisker."""
    from matplotlib.figure import Figure

    scale = 100.0 if metric != "perplexity" else 1.0
    # At least 6.4 inches wide: one dropout's panel alone is narrower than the title.
    figure = Figure(figsize=(max(6.4, 4.6 * len(dropouts)), 3.6), layout="constrained")
    axes = figure.subplots(1, len(dropouts), squeeze=False, sharey=True)[0]
    methods = [m for m in LABELS if any(f"{m}-d{d}" in results for d in dropouts)]
    for ax, d in zip(axes, dropouts, strict=True):
        for shift, model, colour in ((-0.2, "adapemu", "#ff7f0e"), (0.2, "adapfu", "#1f77b4")):
            key = f"{model}/{metric}"
            rows = [results.get(f"{m}-d{d}", {}) for m in methods]
            ax.bar(
                [i + shift for i in range(len(methods))],
                [r.get(key, np.nan) * scale for r in rows],
                0.4,
                yerr=[r.get(f"{key}_std", 0.0) * scale for r in rows],
                capsize=3,
                color=colour,
                label="AdapEmu" if model == "adapemu" else "AdapFu",
            )
        ax.set_xticks(range(len(methods)), [LABELS[m].replace(" (", "\n(") for m in methods], fontsize=8)
        seeds = max((results.get(f"{m}-d{d}", {}).get("seeds", 0) for m in methods), default=0)
        ax.set_title(f"dropout {d} ({tables.seeds_text(seeds)})")
        ax.grid(True, axis="y", alpha=0.3)
        ax.set_axisbelow(True)
    axes[0].set_ylabel(f"{metric}{' (%)' if scale == 100.0 else ''}")
    handles, labels = axes[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="outside lower center", ncols=2, frameon=False)
    plots.suptitle(figure, f"{cfg.name}: {cfg.model.name}, mean ± std over seeds", fontsize=None)
    return plots.save_figure(figure, path)


def main(argv: list[str] | None = None) -> None:
    parser = tables.table_parser(__doc__, keep_earlier=True)
    default_methods = [m for m in METHODS if m not in ON_DEMAND]
    parser.add_argument("--methods", nargs="+", default=default_methods, choices=list(METHODS))
    parser.add_argument(
        "--dropouts", nargs="+", type=float, help="emulator dropouts (default: 0.2 0.5; --init-sweep: 0.5)"
    )
    parser.add_argument(
        "--ablation", action="store_true", help="Appendix C: lambda and eps, adapter 2, d = 0.2"
    )
    parser.add_argument(
        "--init-sweep", nargs="+", type=int, metavar="I_0", help="initial distillation steps to compare"
    )
    parser.add_argument(
        "--trajectory",
        action="store_true",
        help="also tabulate and plot every evaluated round of each method (trajectory-<config name>)",
    )
    parser.add_argument(
        "--lrs", nargs="+", type=float, help="search train.lr per method (validation split, first dropout)"
    )
    tables.row_lr_option(parser, "fedot=0.01")
    args = tables.parse_args(parser, argv)
    own_lr = tables.row_lrs(parser, args.row_lr, METHODS)
    if args.render:
        renderers: dict[str, tables.Renderer] = {
            "table-": render_table,
            "ablation-": fedbiot_ablation.render_ablation,
            "sweep-i0-": fedbiot_init.render_init_sweep,
            "trajectory-": render_trajectory,
            "sweep-lr-": fedbiot_lr.render_sweep,
        }
        tables.render(args.render, parser, renderers, args.results_dir)
        return
    cfg = tables.load_config(args)
    metric = primary_metric(cfg)
    base = args.runs_dir / cfg.name
    command = tables.command_line(__file__, argv)
    if args.init_sweep:
        fedbiot_init.init_sweep(args, cfg, base, command)
        return
    args.dropouts = args.dropouts or [0.2, 0.5]
    if args.lrs:
        fedbiot_lr.check_sweepable(parser, cfg)
        fedbiot_lr.lr_sweep(args, cfg, base, metric, command, summarise)
        return
    if args.ablation:
        variants = {"default": [], **fedbiot_ablation.ABLATION}
        fedbiot = [*METHODS["fedbiot_a2"], "fedbiot.dropout=0.2"]
        rows = {name: [*fedbiot, *overrides] for name, overrides in variants.items()}
        # The default variant is the table's FedBiOT (adapter 2, d = 0.2) run: the same run, shared.
        stems = {name: "fedbiot_a2-d0.2" if name == "default" else f"ablation-{name}" for name in variants}
    else:
        rows = {
            f"{method}-d{d}": [*METHODS[method], f"fedbiot.dropout={d}"]
            for d in args.dropouts
            for method in args.methods
        }
        stems = tables.at_own_lr(rows, own_lr, lambda key: key.rpartition("-d")[0])
    runs = tables.plan(base, rows, args.seeds, args.set, stems=stems)
    start(args, runs)
    dirs = runs.dirs
    results = {key: summarise(paths, metric) for key, paths in dirs.items()}
    stem = args.results_dir / f"{'ablation' if args.ablation else 'table'}-{cfg.name}"
    kept = tables.keep_earlier_rows(results, stem) if args.keep_earlier else []
    seeds_kept = tables.keep_earlier_seeds(results, stem, args.seeds, kept) if args.keep_earlier else {}
    if args.ablation:
        text = fedbiot_ablation.ablation_markdown(cfg, metric, variants, results, command)
    else:
        text = markdown(cfg, metric, results, args.dropouts, command)
        plot(cfg, metric, results, args.dropouts, tables.sibling(stem, ".png"))
    named_seeds = {row_name(k): v for k, v in seeds_kept.items()}
    text += tables.closing_notes(dirs, stem, args, kept_rows=kept_names(kept), kept_seeds=named_seeds)
    tables.write_table(stem, text, cfg.name, command, results, args)
    table_stem = stem
    if args.trajectory and not args.ablation:
        curves = {key: trajectory_summary(paths, metric) for key, paths in dirs.items()}
        stem = args.results_dir / f"trajectory-{cfg.name}"
        kept = tables.keep_earlier_rows(curves, stem) if args.keep_earlier else []
        plot_trajectory(cfg, metric, curves, LABELS, tables.sibling(stem, ".png"))
        # the replies rejected are the table's: its runs, and with --keep-earlier its previous notes
        notes = tables.closing_notes(dirs, table_stem, args, kept_rows=kept_names(kept))
        text = trajectory_markdown(cfg, metric, curves, LABELS, command) + notes
        tables.write_table(stem, text, cfg.name, command, curves, args)


def row_name(key: str) -> str:
    """A results key as the notes name it: ``fedot-d0.5`` -> ``FedOT d=0.5`` (an ablation's key as is)."""
    method, _, dropout = key.rpartition("-d")
    return f"{LABELS[method]} d={dropout}" if method in LABELS else key


def kept_names(kept: list[str]) -> list[str]:
    return [row_name(k) for k in kept]


def render_table(recorded: tables.Recorded) -> str:
    cfg, args = recorded.cfg, recorded.args
    dropouts = args.dropouts or [0.2, 0.5]
    return markdown(cfg, primary_metric(cfg), recorded.results, dropouts, recorded.command)


def render_trajectory(recorded: tables.Recorded) -> str:
    cfg = recorded.cfg
    return trajectory_markdown(cfg, primary_metric(cfg), recorded.results, LABELS, recorded.command)


if __name__ == "__main__":
    main()
