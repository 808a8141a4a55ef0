"""Score finished runs' final models again, on more test examples than the runs evaluated on as they trained.

A run scores its model on ``eval.max_examples`` examples while it trains (24 HumanEval problems in the
FedBiOT code table, to keep a round short). This scores the final models of finished runs afterwards
from the artifacts they saved, on ``--max-examples`` examples (164: the whole of HumanEval), without
training again:

    python experiments/reeval.py runs/paper/fedbiot-code-k30 --rows fedbiot_a2-d0.2-lr0.02 \\
        offsite_lm-d0.2-lr0.01 fedot_lm-d0.2-lr0.01 fedbiot_a4-d0.2-lr0.01 --seeds 0 1 2 \\
        --variants adapfu --max-examples 164 --jobs 2

``--rows`` are run names without their ``-s<seed>``; the first is the row the paper claims best, and the
results say, for each variant and metric, whether it beats each other row by the paired difference over
the seeds both have (a 95% t interval, as the tables: holds / tie / reversed). Each (run, variant) is one
subprocess, ``fedtune eval RUN --variant V --max-examples N --output reeval-<variant>-<split><N>.json``
(its output in ``<run dir>.reeval.log``), ``--jobs`` at a time with one thread each; a file already there is
kept, so rerunning resumes. ``reeval-<runs dir name>-<split><N>`` (.md, .json) in ``--results-dir``
holds each row's values per seed, mean ± sample std, the claims, and the seconds each evaluation took.
``--render RESULTS_JSON`` writes that .md again from the .json alone (no run directory is read), so a
change in how a claim reads reaches a committed file.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments import tables
from experiments.tables.runs import RESULTS_DIR, logged

LOWER_IS_BETTER = ("perplexity", "loss")


def lower_is_better(metric: str) -> bool:
    """Whether a lower value of ``metric`` (``adapfu/perplexity`` as a run names it) is the better."""
    return metric.rsplit("/", 1)[-1] in LOWER_IS_BETTER


def scale_of(metric: str) -> float:
    """Scores in [0, 1] are shown x 100; perplexity and loss as they are."""
    return 1.0 if lower_is_better(metric) else 100.0


def output_name(variant: str | None, split: str, examples: int) -> str:
    """The file ``fedtune eval`` writes in the run directory, e.g. ``reeval-adapfu-test164.json``."""
    return f"reeval-{variant or 'final'}-{split}{examples}.json"


def evaluate(run_dir: Path, variant: str | None, split: str, examples: int) -> None:
    """``fedtune eval`` of ``run_dir``'s final model (``variant``) on ``examples`` of ``split``, one thread;
    nothing where its file is there (an earlier call finished it)."""
    out = output_name(variant, split, examples)
    if (run_dir / out).is_file():
        print(f"scored earlier: {run_dir / out}", flush=True)
        return
    if not tables.finished_rows(run_dir):
        raise RuntimeError(f"{run_dir}: not a finished run (its metrics.jsonl has no final round)")
    command = [sys.executable, "-m", "fedtune", "eval", str(run_dir), "--split", split]
    command += ["--max-examples", str(examples), "--output", out]
    command += ["--variant", variant] if variant else []
    logged(command, tables.sibling(run_dir, ".reeval.log"), run_dir)


def read_scores(run_dir: Path, variant: str | None, split: str, examples: int) -> dict[str, Any] | None:
    """The scores one evaluation wrote (None until it has): its metrics, example count and seconds."""
    path = run_dir / output_name(variant, split, examples)
    if not path.is_file():
        return None
    found = json.loads(path.read_text())
    return {"metrics": found["metrics"], "examples": found["examples"], "seconds": found.get("seconds")}


def collect(
    runs_dir: Path,
    rows: Sequence[str],
    seeds: Sequence[int],
    variants: Sequence[str | None],
    split: str,
    n: int,
) -> dict[str, Any]:
    """row -> variant -> {"values": metric -> seed -> value, "examples": ..., "seconds": seed -> s}."""
    results: dict[str, Any] = {}
    for row in rows:
        for variant in variants:
            entry: dict[str, Any] = {"values": {}, "examples": {}, "seconds": {}}
            for seed in seeds:
                found = read_scores(runs_dir / f"{row}-s{seed}", variant, split, n)
                if found is None:
                    continue
                for metric, value in found["metrics"].items():
                    entry["values"].setdefault(metric, {})[str(seed)] = float(value)
                entry["examples"][str(seed)] = found["examples"]
                entry["seconds"][str(seed)] = found["seconds"]
            results.setdefault(row, {})[variant or "final"] = entry
    return results


def cell(values: dict[str, float], metric: str) -> str:
    """``0.61 ± 0.61 (0.00 / 1.22 / 0.61)``: mean ± sample std over seeds, then each seed's value."""
    if not values:
        return "-"
    scale = scale_of(metric)
    each = " / ".join(f"{scale * values[seed]:.2f}" for seed in sorted(values, key=int))
    return f"{tables.cell(values, scale=scale)} ({each})"


def claims(results: dict[str, Any], rows: Sequence[str]) -> list[str]:
    """The first row over each other row, per variant and metric, by the paired interval over seeds."""
    best, lines = rows[0], []
    for variant, entry in results[best].items():
        for metric, values in entry["values"].items():
            for other in rows[1:]:
                theirs = results[other].get(variant, {}).get("values", {}).get(metric, {})
                if not theirs:
                    continue
                text = tables.interval_texts(
                    [theirs, values], lower_is_better=lower_is_better(metric), scale=scale_of(metric)
                )[0]
                lines.append(f"- {variant} {metric}: {best} over {other}: {text}")
    return lines


def markdown(results: dict[str, Any], rows: Sequence[str], args: argparse.Namespace, command: str) -> str:
    """The results file's text: one table per variant, the claims, the cost."""
    runs_dir, n = args.runs_dir, args.max_examples
    counts = sorted({c for row in results.values() for e in row.values() for c in e["examples"].values()})
    lines = [
        f"# {runs_dir.name}: final models on {n} {args.split} examples a seed",
        "",
        f"`{command}`",
        "",
        f"Examples scored a seed: {', '.join(map(str, counts)) or '-'} (asked: {n}). Cells: mean ± sample "
        "std over seeds (each seed's value in brackets); scores in [0, 1] x 100, perplexity as it is.",
    ]
    for variant in dict.fromkeys(v for row in results.values() for v in row):
        metrics = list(
            dict.fromkeys(m for row in results.values() for m in row.get(variant, {}).get("values", {}))
        )
        lines += [
            "",
            f"## {variant}",
            "",
            "| row | " + " | ".join(metrics) + " |",
            "|---|" + "---|" * len(metrics),
        ]
        for row in rows:
            values = results[row].get(variant, {}).get("values", {})
            lines.append(f"| {row} | " + " | ".join(cell(values.get(m, {}), m) for m in metrics) + " |")
    found = claims(results, rows)
    if found:
        lines += [
            "",
            f"Paired over seeds (95% t interval of the gain of {rows[0]}; above 0: it is better):",
            "",
        ]
        lines += found
    seconds = [s for row in results.values() for e in row.values() for s in e["seconds"].values() if s]
    if seconds:
        lines += [
            "",
            f"Cost: {len(seconds)} evaluations, {np.median(seconds):.0f} s each (median; "
            f"{min(seconds):.0f}-{max(seconds):.0f} s), one thread each, the model's loading included.",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "runs_dir", type=Path, nargs="?", help="the directory holding the runs (<row>-s<seed>)"
    )
    parser.add_argument(
        "--rows", nargs="+", help="run names without -s<seed>; the first is claimed best (required)"
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument(
        "--variants", nargs="+", default=[None], help="final-model variants (e.g. adapfu adapemu)"
    )
    parser.add_argument("--max-examples", type=int, help="examples scored a seed (required)")
    parser.add_argument("--split", default="test")
    parser.add_argument("--jobs", type=int, default=1, help="evaluations at once, one thread each")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--table-only", action="store_true", help="tabulate existing scores, start nothing")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="write the results even where they drop values recorded before",
    )
    parser.add_argument(
        "--render",
        type=Path,
        metavar="RESULTS_JSON",
        help="rewrite the .md of this results file from its numbers alone, into --results-dir: nothing is "
        "run or read but the .json (its recorded command gives the options)",
    )
    args = parser.parse_args(argv)
    if args.render is not None:
        print(render(args.render, parser, args.results_dir))
        return
    absent = [name for name in ("runs_dir", "rows", "max_examples") if getattr(args, name) is None]
    if absent:
        parser.error(f"these are required but with --render: {', '.join(absent)}")
    missing = [
        f"{row}-s{seed}"
        for row in args.rows
        for seed in args.seeds
        if not (args.runs_dir / f"{row}-s{seed}").is_dir()
    ]
    if missing:
        parser.error(f"no run directory in {args.runs_dir} for: {', '.join(missing)}")
    if args.max_examples < 1:
        parser.error(f"--max-examples {args.max_examples}: at least 1")
    if not args.table_only:
        jobs = [
            (args.runs_dir / f"{row}-s{seed}", variant)
            for row in args.rows
            for seed in args.seeds
            for variant in args.variants
        ]
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            futures = [pool.submit(evaluate, d, v, args.split, args.max_examples) for d, v in jobs]
            for future in futures:
                future.result()
    results = collect(args.runs_dir, args.rows, args.seeds, args.variants, args.split, args.max_examples)
    command = tables.command_line(__file__, argv)
    stem = args.results_dir / f"reeval-{args.runs_dir.name}-{args.split}{args.max_examples}"
    text = markdown(results, args.rows, args, command)
    tables.write_table(stem, text, args.runs_dir.name, command, results, args)


def render(path: Path, parser: argparse.ArgumentParser, out: Path) -> Path:
    """``--render``: the .md of the results file ``path`` written again into ``out`` from the file's own
    numbers and the options of the command it records (a change in how claims read reaches it so)."""
    record, command, args = tables.recorded_command(path, parser)
    if args.runs_dir is None or not args.rows or args.max_examples is None:
        raise SystemExit(f"{path}: its command names no runs directory, rows or --max-examples: {command}")
    try:
        text = markdown(record["results"], args.rows, args, command)
    except (KeyError, TypeError, ValueError) as error:
        why = f"{type(error).__name__}: {error}"
        raise SystemExit(f"{path}: these results lack what the file shows today ({why})") from error
    return tables.write_rendered(path, out, text)


if __name__ == "__main__":
    main()
