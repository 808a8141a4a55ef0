"""FedBiOT's Tables 1-3 at small scale: Offsite-tuning, FedOT and FedBiOT side by side on one task.

    python bench/fedbiot_table.py configs/paper/fedbiot-math.yaml                 # run what is missing
    python bench/fedbiot_table.py configs/paper/fedbiot-math.yaml --seeds 0 1 2 --dropouts 0.2
    python bench/fedbiot_table.py configs/paper/fedbiot-math.yaml --ablation     # Appendix C: lambda, eps
    python bench/fedbiot_table.py configs/paper/fedbiot-math.yaml --table-only

Methods (each a normal run directory ``--runs-dir/<config name>/<method>-d<dropout>-s<seed>``):
- ``offsite``: Offsite-tuning: one client holding all data (``fed.mode=centralized``), adapter = first 2 +
  last 2 layers, emulator distilled once (``align_steps=0``), no proximal term;
- ``fedot``: FedOT, the same split and fixed emulator, federated;
- ``fedbiot_a2`` / ``fedbiot_a4``: FedBiOT with the last 2 / 4 layers as the adapter.
Each is evaluated as AdapEmu (adapter + emulator) and AdapFu (adapter + full model) at the last round;
the table gives mean ± std over seeds (population std), bytes per round and what a client holds.
Every run is a subprocess (``python -m fedtune run``): a crash loses only that run; rerunning resumes
unfinished runs and skips finished ones.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import DEFAULT_RESULTS_DIR, markdown_table, sibling, write_table
from bench.fedpt_table import final_eval, read_rows

OFFSITE = [
    "fedbiot.split=first_last",
    "fedbiot.adapter_layers=4",
    "fedbiot.align_steps=0",
    "fedbiot.prox_eps=0",
]
METHODS: dict[str, list[str]] = {
    "offsite": [*OFFSITE, "fed.mode=centralized"],
    "fedot": OFFSITE,
    "fedbiot_a2": ["fedbiot.split=last", "fedbiot.adapter_layers=2"],
    "fedbiot_a4": ["fedbiot.split=last", "fedbiot.adapter_layers=4"],
}
LABELS = {
    "offsite": "Offsite-tuning",
    "fedot": "FedOT",
    "fedbiot_a2": "FedBiOT (Adapter 2)",
    "fedbiot_a4": "FedBiOT (Adapter 4)",
}
# Appendix C on one task: lambda (Table 5) and eps (Table 7), FedBiOT adapter 2 at dropout 0.2.
ABLATION: dict[str, list[str]] = {
    "lambda0": ["fedbiot.align_lambda=0"],
    "lambda0.25": ["fedbiot.align_lambda=0.25"],
    "lambda1": ["fedbiot.align_lambda=1.0"],
    "eps0": ["fedbiot.prox_eps=0"],
    "eps1": ["fedbiot.prox_eps=1.0"],
}


def run_one(config: Path, overrides: list[str], run_dir: Path) -> None:
    if (run_dir / "artifacts" / "fedbiot.json").is_file():
        print(f"finished earlier: {run_dir}", flush=True)
        return
    command = [sys.executable, "-m", "fedtune"]
    if (run_dir / "checkpoints").is_dir():
        command += ["resume", str(run_dir)]
    else:
        # Runs that differ only in what the initial emulator distillation does not depend on
        # (method rows sharing a split, eps, seeds of other steps) share it through this cache.
        shared = f"fedbiot.init_cache={run_dir.parent / 'emulator-init'}"
        command += ["run", str(config), shared, *overrides, "-o", str(run_dir)]
    print(" ".join(command), flush=True)
    subprocess.run(command, check=True)


def primary_metric(cfg: Any) -> str:
    generation = [m for m in cfg.eval.metrics if m != "perplexity"]
    return generation[0] if generation else "perplexity"


def summarise(run_dirs: list[Path], metric: str) -> dict[str, Any]:
    """Mean / std over seeds of AdapEmu and AdapFu, plus traffic and client size of the first run."""
    # A seed also draws the test subset (eval.max_examples), so methods are compared seed by seed too.
    by_seed = {d.name.rsplit("-s", 1)[-1]: final_eval(read_rows(d)) for d in run_dirs}
    by_seed = {seed: f for seed, f in by_seed.items() if f}
    out: dict[str, Any] = {"seeds": len(by_seed)}
    for model in ("adapemu", "adapfu"):
        for name in (metric, "perplexity"):
            key = f"{model}/{name}"
            values = {seed: f[key] for seed, f in by_seed.items() if key in f}
            if values:
                out[key] = float(np.mean(list(values.values())))
                out[f"{key}_std"] = float(np.std(list(values.values())))
                out[f"{key}_by_seed"] = values
    done = [d for d in run_dirs if read_rows(d)]
    if done:
        rows = [r for r in read_rows(done[0]) if r.get("round", 0) > 0]
        out["mb_down_per_round"] = float(np.mean([r["bytes_down"] for r in rows])) / 2**20
        out["mb_up_per_round"] = float(np.mean([r["bytes_up"] for r in rows])) / 2**20
        out["emulator_sends"] = int(sum(r.get("emulator_sends", 0) for r in rows))
        info_path = done[0] / "artifacts" / "fedbiot.json"
        if info_path.is_file():
            info = json.loads(info_path.read_text())
            out["client"] = info.get("params", {})
            out["split"] = info.get("split", {})
    return out


def _fmt(result: dict[str, Any], key: str, scale: float = 1.0, seeds: int = 0) -> str:
    """mean ± std, with the number of seeds when it is not the table's ``seeds``."""
    if key not in result:
        return "-"
    std = result.get(f"{key}_std", 0.0)
    count = f" (n={result['seeds']})" if seeds and result.get("seeds") != seeds else ""
    return f"{result[key] * scale:.2f} ± {std * scale:.2f}{count}"


def ordering_checks(results: dict[str, dict[str, Any]], metric: str, dropouts: list[float]) -> list[str]:
    """Whether each FedBiOT row is at least as good as the baselines (higher is better but for
    perplexity): on the means over the seeds all three rows have (a seed also draws the test subset),
    and seed by seed."""
    sign = -1.0 if metric == "perplexity" else 1.0
    key_of = {"AdapEmu": f"adapemu/{metric}", "AdapFu": f"adapfu/{metric}"}
    checks = []
    for d in dropouts:
        for name, key in key_of.items():
            present = {m: results.get(f"{m}-d{d}", {}).get(f"{key}_by_seed", {}) for m in LABELS}
            compared = [m for m in ("offsite", "fedot") if present[m]]
            for method in ("fedbiot_a2", "fedbiot_a4"):
                names = [method, *compared]
                rows = [present[m] for m in names]
                seeds = sorted(set(rows[0]).intersection(*rows[1:]))
                if not compared or not seeds:
                    continue
                ours, *baselines = [float(np.mean([row[s] for s in seeds])) for row in rows]
                beaten = [
                    LABELS[m] for m, v in zip(names[1:], baselines, strict=True) if sign * ours < sign * v
                ]
                if all(v == ours for v in baselines):
                    verdict = "tie (nothing separates them)"
                else:
                    verdict = "holds" if not beaten else f"does not hold (worse than {', '.join(beaten)})"
                numbers = ", ".join(f"{LABELS[m]} {v:.4g}" for m, v in zip(names[1:], baselines, strict=True))
                wins = sum(all(sign * rows[0][s] >= sign * other[s] for other in rows[1:]) for s in seeds)
                checks.append(
                    f"d={d}, {name}, {len(seeds)} seed(s): {LABELS[method]} {ours:.4g} vs {numbers}: "
                    f"{verdict}; at least as good as every baseline in {wins} of {len(seeds)} seed(s)"
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
    seeds = max((r.get("seeds", 0) for r in results.values()), default=0)
    rows = []
    for method, label in LABELS.items():
        cells = [label]
        first: dict[str, Any] = {}
        for d in dropouts:
            result = results.get(f"{method}-d{d}", {})
            first = first or result
            cells += [
                _fmt(result, f"adapemu/{metric}", scale, seeds),
                _fmt(result, f"adapfu/{metric}", scale, seeds),
            ]
        if not first:
            continue
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
        markdown_table(header, rows),
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
            _fmt(v, "adapemu/perplexity", seeds=seeds),
            _fmt(v, "adapfu/perplexity", seeds=seeds),
        ]
        for k, v in results.items()
        if "adapfu/perplexity" in v
    ]
    if ppl:
        lines += [
            "",
            "Perplexity on the test set:",
            "",
            markdown_table(["method", "dropout", "AdapEmu", "AdapFu"], ppl),
        ]
    return "\n".join(lines)


def plot(
    cfg: Any, metric: str, results: dict[str, dict[str, Any]], dropouts: list[float], path: Path
) -> Path:
    """Grouped bars: per dropout one panel, per method AdapEmu and AdapFu, mean with a ± std whisker."""
    from matplotlib.figure import Figure

    scale = 100.0 if metric != "perplexity" else 1.0
    figure = Figure(figsize=(4.6 * len(dropouts), 3.6), layout="constrained")
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
        ax.set_title(f"dropout {d} ({seeds} seed{'s' if seeds != 1 else ''})")
        ax.grid(True, axis="y", alpha=0.3)
        ax.set_axisbelow(True)
    axes[0].set_ylabel(f"{metric}{' (%)' if scale == 100.0 else ''}")
    handles, labels = axes[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="outside lower center", ncols=2, frameon=False)
    figure.suptitle(f"{cfg.name}: {cfg.model.name}, mean ± std over seeds")
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("config", type=Path)
    parser.add_argument("--runs-dir", type=Path, default=Path("runs/paper"))
    parser.add_argument("--results-dir", type=Path, default=DEFAULT_RESULTS_DIR)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--dropouts", nargs="+", type=float, default=[0.2, 0.5])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument(
        "--ablation", action="store_true", help="Appendix C: lambda and eps, adapter 2, d = 0.2"
    )
    parser.add_argument("--table-only", action="store_true", help="tabulate existing runs, start nothing")
    parser.add_argument("--set", action="append", default=[], help="a config override for every run")
    args = parser.parse_args(argv)
    from fedtune.config import load_config

    cfg = load_config(args.config, args.set)
    metric = primary_metric(cfg)
    base = args.runs_dir / cfg.name
    command = "python bench/fedbiot_table.py " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.ablation:
        variants = {"default": [], **ABLATION}
        # The default variant is the table's FedBiOT (adapter 2, d = 0.2) run: the same run, shared.
        dirs = {
            name: [
                base / (f"fedbiot_a2-d0.2-s{seed}" if name == "default" else f"ablation-{name}-s{seed}")
                for seed in args.seeds
            ]
            for name in variants
        }
        if not args.table_only:
            for name, overrides in variants.items():
                for seed, run_dir in zip(args.seeds, dirs[name], strict=True):
                    run_one(
                        args.config,
                        [
                            *METHODS["fedbiot_a2"],
                            "fedbiot.dropout=0.2",
                            *overrides,
                            f"seed={seed}",
                            *args.set,
                        ],
                        run_dir,
                    )
        results = {name: summarise(paths, metric) for name, paths in dirs.items()}
        rows = [
            [
                name,
                " ".join(variants[name]) or "(config)",
                _fmt(r, f"adapemu/{metric}", 100),
                _fmt(r, f"adapfu/{metric}", 100),
                _fmt(r, "adapemu/perplexity"),
                _fmt(r, "adapfu/perplexity"),
                str(r["seeds"]),
            ]
            for name, r in results.items()
            if r.get("seeds")
        ]
        text = "\n".join(
            [
                f"# {cfg.name}: ablation of lambda and eps (FedBiOT adapter 2, dropout 0.2), {metric} (%)",
                "",
                f"`{command}`",
                "",
                markdown_table(
                    ["variant", "overrides", "AdapEmu", "AdapFu", "AdapEmu ppl", "AdapFu ppl", "seeds"],
                    rows,
                ),
            ]
        )
        stem = args.results_dir / f"ablation-{cfg.name}"
    else:
        dirs = {
            f"{method}-d{d}": [base / f"{method}-d{d}-s{seed}" for seed in args.seeds]
            for d in args.dropouts
            for method in args.methods
        }
        if not args.table_only:
            for d in args.dropouts:
                for method in args.methods:
                    for seed, run_dir in zip(args.seeds, dirs[f"{method}-d{d}"], strict=True):
                        run_one(
                            args.config,
                            [*METHODS[method], f"fedbiot.dropout={d}", f"seed={seed}", *args.set],
                            run_dir,
                        )
        results = {key: summarise(paths, metric) for key, paths in dirs.items()}
        text = markdown(cfg, metric, results, args.dropouts, command)
        stem = args.results_dir / f"table-{cfg.name}"
        plot(cfg, metric, results, args.dropouts, sibling(stem, ".png"))
    write_table(stem, text, cfg.name, command, results)


if __name__ == "__main__":
    main()
