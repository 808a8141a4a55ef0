"""FedPT's alpha chosen again after training: by the proxy's validation perplexity, over a wider grid.

A FedPT or FedAvg+PT run picks alpha at its last round by validation Rouge-L (by default on 12 examples,
one sampling seed: noisy), in ``fedpt.alpha_grid``. alpha only scales the proxy at decoding; training never
reads the final search's value (FedPT's teacher follows earlier searches only, and with ``alpha_search:
final`` stays at ``fedpt.alpha``), so the search can be redone on a finished run's saved output (Alg. 1's
small model, ``artifacts/adapter``) without training again. For each run:

- validation perplexity at each alpha of ``--grid`` on ``--validation-examples`` validation examples
  (deterministic, nothing decoded) and the alpha it picks (the lowest);
- test perplexity at each alpha, on the test set and the config's extra test sets. At the run's own
  alpha this recomputes the number the run recorded, and the table shows both (a check that the saved
  output is the evaluated one);
- Rouge-L (and the config's other generation metrics) at the alpha the perplexity picks, with the
  run's sampling settings and seeds: where it picks the run's own alpha, the run's numbers are reused.

    python experiments/fedpt_alpha.py runs/paper/fedpt-smollm2-r20/{fedavg_pt,fedpt}{,-s1,-s2} \
        --name fedpt-smollm2-r20

Writes ``alpha-<name>.{md,json,png}`` in ``--results-dir``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import setup_torch

from experiments import plots, tables

GRID = (0.5, 0.8, 1.0, 1.3, 1.5, 1.8, 2.0, 2.5, 3.0)
LABELS = {"fedavg_pt": "FedAvg+PT", "fedpt": "FedPT"}


def method_of(run_dir: Path) -> str:
    """The table's method name of ``run_dir`` (``fedpt-s1`` -> ``fedpt``)."""
    return re.sub(r"-s\d+$", "", run_dir.name)


def recorded(run_dir: Path) -> dict[str, Any]:
    """The run's final evaluation as it recorded it."""
    row = tables.last_evaluated(tables.read_rows(run_dir), "rougeL")
    if row is None:
        raise SystemExit(f"{run_dir}: no finished evaluation in metrics.jsonl; finish the run first")
    return dict(row["eval"])


def study_run(run_dir: Path, grid: Sequence[float], validation_examples: int) -> dict[str, Any]:
    """One run's alpha study (see the module docstring)."""
    from fedtune.algorithms.base import derive_seed
    from fedtune.algorithms.fedpt.final import evaluate_proxy, load_proxy_model, proxy_perplexities
    from fedtune.rundata import prepare_data

    before = recorded(run_dir)
    proxy, cfg = load_proxy_model(run_dir)
    tokenizer = proxy.tokenizer
    data = prepare_data(cfg)
    wide = cfg.model_copy(deep=True)
    wide.eval.max_examples = validation_examples
    validation = prepare_data(wide).validation_records[:validation_examples]
    if not validation:
        raise SystemExit(f"{run_dir}: the dataset {cfg.data.dataset!r} has no validation split")
    sets = {"": data.eval_records, **data.extra_eval}
    seed = derive_seed(cfg.seed, cfg.fed.rounds, "eval")  # the run's final evaluation's sampling seeds
    ppl_only = cfg.eval.model_copy(update={"metrics": ["perplexity"]})

    shape = {"template": cfg.data.template, "max_length": cfg.data.max_length}
    perplexities = partial(proxy_perplexities, proxy, tokenizer, **shape)
    evaluate_at = partial(evaluate_proxy, proxy, tokenizer, **shape, seed=seed)

    def evaluate(records: Sequence[Any], alpha: float, settings: Any) -> dict[str, float]:
        return dict(evaluate_at(records, alpha, settings).metrics)

    curves: dict[str, dict[str, float]] = {}
    for name, records in {"validation": validation, **{n or "test": r for n, r in sets.items()}}.items():
        by_alpha = perplexities(records, grid, ppl_only)
        curves[name] = {f"{alpha:g}": value for alpha, value in by_alpha.items()}
        print(f"{run_dir}: {name} perplexity by alpha: {curves[name]}", flush=True)
    picked = min(grid, key=lambda a: curves["validation"][f"{a:g}"])
    run_alpha = float(before["alpha"])
    if f"{picked:g}" == f"{run_alpha:g}":
        at_picked = {k: v for k, v in before.items() if not k.startswith("alpha")}
    else:
        at_picked = {}
        generation = [m for m in cfg.eval.metrics if m != "perplexity"]
        settings = cfg.eval.model_copy(update={"metrics": generation})
        for name, records in sets.items():
            metrics = evaluate(records, picked, settings)
            at_picked.update({(f"{name}/{k}" if name else k): v for k, v in metrics.items()})
        for name in sets:
            at_picked[f"{name}/perplexity" if name else "perplexity"] = curves[name or "test"][f"{picked:g}"]
    return {
        "method": method_of(run_dir),
        "seed": str(cfg.seed),
        "run_dir": str(run_dir),
        "validation_examples": len(validation),
        "run_alpha": run_alpha,
        "run_alpha_study": {k.split("/", 1)[1]: v for k, v in before.items() if k.startswith("alpha_study/")},
        "recorded": {k: v for k, v in before.items() if not k.startswith("alpha")},
        "perplexity_by_alpha": curves,
        "alpha": picked,
        "at_alpha": at_picked,
        "extra_sets": sorted(data.extra_eval),
    }


def _ppl_key(name: str) -> str:
    return f"{name}/perplexity" if name else "perplexity"


def markdown(results: Sequence[Mapping[str, Any]], grid: Sequence[float], command: str) -> str:
    """The picks side by side with the runs' own, then the perplexity curves."""
    extra = list(results[0]["extra_sets"]) if results else []
    sets = ["", *extra]
    names = {"": "in domain", **{name: name for name in extra}}
    lines = [
        "# alpha by validation perplexity, after training",
        "",
        f"`{command}`",
        "",
        "Each run's alpha as it searched it (validation Rouge-L) and as the proxy's validation "
        f"perplexity picks it ({results[0]['validation_examples'] if results else 0} examples, grid "
        f"{', '.join(f'{a:g}' for a in grid)}), with the test metrics at each. The run's test perplexity "
        "is recomputed from its saved output at its own alpha (`recomputed`) beside what it recorded.",
        "",
    ]
    headers = ["method", "seed", "alpha (run)", "alpha (val ppl)"]
    for name in sets:
        headers += [f"Rouge-L {names[name]}, run", "at val-ppl alpha"]
        headers += [f"test ppl {names[name]}, run", "recomputed", "at val-ppl alpha"]
    rows = []
    for res in results:
        run_key = f"{res['run_alpha']:g}"
        row: list[Any] = [LABELS.get(res["method"], res["method"]), res["seed"], run_key, f"{res['alpha']:g}"]
        for name in sets:
            rouge = f"{name}/rougeL" if name else "rougeL"
            curve = res["perplexity_by_alpha"][name or "test"]
            row += [f"{res['recorded'][rouge]:.4f}", f"{res['at_alpha'][rouge]:.4f}"]
            row += [f"{res['recorded'][_ppl_key(name)]:.2f}", _maybe(curve.get(run_key), 2)]
            row += [f"{res['at_alpha'][_ppl_key(name)]:.2f}"]
        rows.append(row)
    lines += [tables.markdown_table(headers, rows), ""]
    lines += ["Mean over the runs of each method:", ""]
    lines += [tables.markdown_table(*_means(results, sets, names)), ""]
    for curve, title in [
        ("validation", "Validation perplexity"),
        *[(n or "test", f"Test perplexity, {names[n]}") for n in sets],
    ]:
        lines += [f"{title} by alpha:", ""]
        headers = ["method", "seed", *[f"{a:g}" for a in grid]]
        rows = [
            [
                LABELS.get(r["method"], r["method"]),
                r["seed"],
                *[_maybe(r["perplexity_by_alpha"][curve].get(f"{a:g}"), 2) for a in grid],
            ]
            for r in results
        ]
        lines += [tables.markdown_table(headers, rows), ""]
    return "\n".join(lines)


def _maybe(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _means(
    results: Sequence[Mapping[str, Any]], sets: Sequence[str], names: Mapping[str, str]
) -> tuple[list[str], list[list[Any]]]:
    headers = ["method", "runs"]
    for name in sets:
        headers += [
            f"Rouge-L {names[name]}, run",
            "at val-ppl alpha",
            f"test ppl {names[name]}, run",
            "at val-ppl alpha",
        ]
    rows = []
    for method in dict.fromkeys(r["method"] for r in results):
        mine = [r for r in results if r["method"] == method]
        row: list[Any] = [LABELS.get(method, method), len(mine)]
        for name in sets:
            for key in (f"{name}/rougeL" if name else "rougeL", _ppl_key(name)):
                digits = 4 if key.endswith("rougeL") else 2
                row.append(tables.cell([r["recorded"][key] for r in mine], digits))
                row.append(tables.cell([r["at_alpha"][key] for r in mine], digits))
        rows.append(row)
    return headers, rows


def plot(results: Sequence[Mapping[str, Any]], grid: Sequence[float], path: Path, title: str) -> Path:
    """Perplexity against alpha: validation, then each test set; a line per run, its pick marked."""
    curves = ["validation", "test", *(results[0]["extra_sets"] if results else [])]
    figure, axes, first = plots.panel_grid(len(curves), 3.6, 2.8)
    colours = {"fedavg_pt": "tab:blue", "fedpt": "tab:red"}
    for ax, curve in zip(axes, curves, strict=True):
        for res in results:
            xs = [a for a in grid if f"{a:g}" in res["perplexity_by_alpha"][curve]]
            ys = [res["perplexity_by_alpha"][curve][f"{a:g}"] for a in xs]
            colour = colours.get(res["method"], "tab:grey")
            label = f"{LABELS.get(res['method'], res['method'])} seed {res['seed']}"
            ax.plot(xs, ys, marker=".", color=colour, alpha=0.5 + 0.2 * (int(res["seed"]) % 3), label=label)
            ax.plot(
                [res["alpha"]],
                [res["perplexity_by_alpha"][curve][f"{res['alpha']:g}"]],
                "*",
                color=colour,
                markersize=11,
            )
        ax.set_yscale("log")  # the minimum sits low beside the high alphas' perplexity
        ax.set_title(curve if curve != "test" else "test (in domain)", fontsize=9)
    return plots.finish_grid(figure, axes, first, xlabel="alpha", ylabel="perplexity", title=title, path=path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("runs", nargs="*", type=Path, help="finished FedPT / FedAvg+PT run directories")
    parser.add_argument("--name", required=True, help="names the results: alpha-<name>.{md,json,png}")
    parser.add_argument("--grid", nargs="+", type=float, default=list(GRID))
    parser.add_argument("--validation-examples", type=int, default=96)
    parser.add_argument("--results-dir", type=Path, default=tables.RESULTS_DIR)
    parser.add_argument("--table-only", action="store_true", help="rewrite the table from the results json")
    parser.add_argument(
        "--add",
        action="store_true",
        help="keep the runs the results json already has (studied earlier) beside the ones given now",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="write the results without the runs the results json has and this command does not give",
    )
    args = parser.parse_args(argv)
    if not args.runs and not args.table_only:
        parser.error("name the finished runs to study (or --table-only)")
    stem = args.results_dir / f"alpha-{args.name}"
    command = tables.command_line(__file__, argv)
    if args.table_only:  # the study's own command stays the one quoted
        saved = json.loads(tables.sibling(stem, ".json").read_text())
        results, command = saved["results"], saved["command"]
        args.grid = sorted({float(a) for r in results for a in r["perplexity_by_alpha"]["validation"]})
    else:
        setup_torch(1)
        results = [study_run(run_dir, args.grid, args.validation_examples) for run_dir in args.runs]
        saved_json = tables.sibling(stem, ".json")
        if args.add and saved_json.is_file():
            earlier = json.loads(saved_json.read_text())["results"]
            studied = {r["run_dir"] for r in results}
            results = [r for r in earlier if r["run_dir"] not in studied] + results
            results.sort(key=lambda r: (r["method"] != "fedavg_pt", r["method"], int(r["seed"])))
    text = markdown(results, args.grid, command)
    tables.write_table(stem, text, args.name, command, results, args)
    plot(
        results, args.grid, tables.sibling(stem, ".png"), f"{args.name}: perplexity by alpha (star: the pick)"
    )


if __name__ == "__main__":
    main()
