"""PerFIT's Tables 1-3 at small scale: FIT vs PerFIT in personalised perplexity, side by side.

    python experiments/perfit_table.py configs/paper/perfit-smollm2.yaml --jobs 2        # run what is missing
    python experiments/perfit_table.py configs/paper/perfit-smollm2.yaml --partitions pathological dirichlet
    python experiments/perfit_table.py configs/paper/perfit-smollm2.yaml --rows fit perfit_s0.5 --seeds 0 1 2
    python experiments/perfit_table.py configs/paper/perfit-smollm2.yaml --table-only
    python experiments/perfit_table.py configs/paper/perfit-smollm2.yaml --seeds 0 1 2 --keep-earlier

Partitions (``--partitions``): ``pathological``, ``dirichlet`` (alpha 0.5) and ``iid`` (random equal
shards, the paper's domain sets: ``configs/paper/perfit-smollm2-arith.yaml``).
Rows (each a normal run directory ``--runs-dir/<config name>/<row>-<partition>-s<seed>``):
- ``fit``: FIT = FedIT with the budget rank r on the same modules (the same trainable count),
  evaluated the same way (each client on its own held-out split, the global adapter);
- ``standalone``: every client trains its own rank-r LoRA on its own data only, when sampled (the
  same sampling as the federated rows), nothing is aggregated: personalisation without federation;
- ``perfit_s0.33`` / ``perfit_s0.5``: PerFIT searching in rank r / (1 - s), as the paper: every
  sampled client starts from the server's global expanded module at its mask, LoRA alpha = r_e;
- ``perfit_hetero``: heterogeneous resources, a third of the clients each at rank 8 / 12 / 16 in a
  common expanded rank 16 (FIT must use the weakest client's rank 8 everywhere: the ``fit`` row);
- ``perfit_second`` / ``perfit_mixed``: the importance variants (s = 0.5), an ablation;
- ``<row>_own``: the earlier reading as an ablation (``perfit.start=own``, ``perfit.alpha=lora``): a
  client resumes from its own values of the last round it trained in, at scaling lora.alpha / r_e;
- ``perfit_s0.5_own_alpha``: own starts with alpha = r_e (scaling 1);
- ``perfit_s0.5_local``: own starts with ``perfit.aggregate=false`` (no Alg. 3, each client trains its
  sparse LoRA on its own data only; compare with ``standalone``'s dense rank r).
The table gives the final personalised perplexity (mean over clients, then mean ± std over seeds),
its example-weighted variant, MB up and down per round, and checks PerFIT < FIT. A plot of the
masks of one PerFIT run (kept share per layer and module, overlap between clients) goes beside it.
With ``--keep-earlier``, a seed whose run directory is gone (made on another machine) keeps the
value the table's previous ``.json`` recorded, and the table lists every seed so kept.
Runs are subprocesses (``python -m fedtune``), ``--jobs`` at a time with one thread each; rerunning
resumes unfinished runs and skips finished ones.

Each row at its own lr: ``--lrs 3e-4 1e-3 3e-3`` searches every row of ``--rows`` at each lr on each
client's validation split (held out from what the client trains on; its test records are not read) and
writes ``sweep-lr-<config name>``, whose last line is the ``--row-lr fit=... perfit_s0.5=...`` that runs
the table with each row at its best lr (its runs ``<row>-<partition>-lr<lr>-s<seed>``; the table gains an
lr column).
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments import tables
from experiments.perfit_masks import mask_plot, overlap_lines
from experiments.tables import layout, search

OWN = ["perfit.start=own", "perfit.alpha=lora"]
ROWS: dict[str, list[str]] = {
    "fit": ["algorithm=fedit", "perfit=null"],
    "standalone": ["algorithm=fedit", "perfit=null", "fed.mode=standalone"],
    "perfit_s0.33": ["perfit.sparsity=0.33"],
    "perfit_s0.5": ["perfit.sparsity=0.5"],
    "perfit_hetero": ["perfit.sparsity=0.5", "perfit.budgets=[8,12,16]"],
    "perfit_second": ["perfit.sparsity=0.5", "perfit.importance=second"],
    "perfit_mixed": ["perfit.sparsity=0.5", "perfit.importance=mixed"],
    # The earlier reading, as ablations: a client resumes from its own values, LoRA alpha = lora.alpha.
    **{
        f"{row}_own": [*overrides, *OWN]
        for row, overrides in {
            "perfit_s0.33": ["perfit.sparsity=0.33"],
            "perfit_s0.5": ["perfit.sparsity=0.5"],
            "perfit_hetero": ["perfit.sparsity=0.5", "perfit.budgets=[8,12,16]"],
            "perfit_second": ["perfit.sparsity=0.5", "perfit.importance=second"],
            "perfit_mixed": ["perfit.sparsity=0.5", "perfit.importance=mixed"],
        }.items()
    },
    "perfit_s0.5_own_alpha": ["perfit.sparsity=0.5", "perfit.start=own", "perfit.alpha=rank"],
    "perfit_s0.5_local": ["perfit.sparsity=0.5", *OWN, "perfit.aggregate=false"],
}
LABELS = {
    "fit": "FIT (FedIT, rank r)",
    "standalone": "Standalone (rank r, own data only)",
    "perfit_s0.33": "PerFIT s = 0.33",
    "perfit_s0.5": "PerFIT s = 0.5",
    "perfit_hetero": "PerFIT, ranks 8/12/16",
    "perfit_second": "PerFIT s = 0.5, 2nd-order importance",
    "perfit_mixed": "PerFIT s = 0.5, mixed importance",
    "perfit_s0.33_own": "ablation: own starts, s = 0.33",
    "perfit_s0.5_own": "ablation: own starts, s = 0.5",
    "perfit_hetero_own": "ablation: own starts, ranks 8/12/16",
    "perfit_second_own": "ablation: own starts, s = 0.5, 2nd-order importance",
    "perfit_mixed_own": "ablation: own starts, s = 0.5, mixed importance",
    "perfit_s0.5_own_alpha": "ablation: own starts, s = 0.5, alpha = r_e (scaling 1)",
    "perfit_s0.5_local": "ablation: own starts, s = 0.5, no aggregation",
}
PARTITIONS: dict[str, list[str]] = {
    "pathological": ["data.partition.scheme=pathological"],
    "dirichlet": ["data.partition.scheme=dirichlet", "data.partition.alpha=0.5"],
    "iid": ["data.partition.scheme=iid"],  # random equal shards: the paper's domain sets (its Table 1)
}
METRIC = "personal/perplexity"
ROUGE = "personal/rougeL"  # in runs whose eval.metrics hold rougeL (greedy answers to held-out prompts)
SCORE = search.Score(METRIC, "personalised perplexity", lower_is_better=True)


def row_of(key: str) -> str:
    """A table key ``<row>-<partition>``'s row."""
    return key.rsplit("-", 1)[0]


def label_of(key: str) -> str:
    row, part = key.rsplit("-", 1)
    return f"{LABELS[row]}, {part}"


def summarise(
    run_dirs: list[Path], earlier: dict[str, Any] | None = None, config_lr: float | None = None
) -> dict[str, Any]:
    """Final personalised perplexity over seeds; per-client values and traffic of the smallest seed.

    With ``earlier`` (this row's entry in the table's previous results file), a seed asked for whose
    run is not here keeps the value that file recorded for it; ``carried_seeds`` lists those seeds,
    refused where that file measured them at another lr than the row's now (its runs', else the one its
    directories name, else ``config_lr``: a row without ``--row-lr`` trains at the config's lr).
    """
    finals = tables.finals(run_dirs, METRIC)
    earlier = earlier or {}
    wanted = [tables.seed_of(d) for d in run_dirs]
    carried = tables.carried_seeds(earlier, METRIC, wanted, finals)
    from_runs = tables.runs_lr(run_dirs)  # read once: it checks the carried seeds and names the row's lr
    here = from_runs.get("lr") or tables.asked_lr(run_dirs)
    if run_dirs:
        tables.refuse_lr_mix(tables.run_name_parts(run_dirs[0].name)[0], earlier, here, carried, config_lr)
    out: dict[str, Any] = {"seeds": len(finals) + len(carried)}
    if not out["seeds"]:
        return out
    for key in (METRIC, f"{METRIC}_weighted", ROUGE):
        values = {seed: row["eval"][key] for seed, row in finals.items() if key in row["eval"]}
        tables.fill_seeds(values, earlier.get(f"{key}_by_seed", {}), carried)
        out |= tables.over_seeds(key, values)
    if carried:
        out["carried_seeds"] = carried
    # the lr is read off the runs here; a row all of whose seeds are carried keeps the one recorded
    out |= from_runs or ({"lr": earlier["lr"]} if carried and "lr" in earlier else {})
    if not finals or (carried and min(map(int, carried)) < min(map(int, finals))):
        # the row's first seed is carried: so are the facts read off its run (the previous table
        # took them from its own first seed)
        kept = ("by_client", "mb_up_per_round", "mb_down_per_round", "before", "sampled", "by_client_before")
        return out | {key: earlier[key] for key in kept if key in earlier}
    first_seed = min(finals, key=int)  # as above: the row's facts are those of its smallest seed
    first = finals[first_seed]
    out["by_client"] = {c: m["perplexity"] for c, m in first.get("eval_by_client", {}).items()}
    done = next(d for d in run_dirs if tables.seed_of(d) == first_seed)
    every = tables.read_rows(done)
    rows = tables.trained_rows(every)
    out["mb_up_per_round"] = tables.per_round_mb(rows, "bytes_up")
    out["mb_down_per_round"] = tables.per_round_mb(rows, "bytes_down")
    start = [r for r in every if r["round"] == 0 and METRIC in r.get("eval", {})]
    if start:
        out["before"] = start[0]["eval"][METRIC]
        out["by_client_before"] = {c: m["perplexity"] for c, m in start[0].get("eval_by_client", {}).items()}
    out["sampled"] = dict(Counter(client for row in rows for client in row.get("clients", [])))
    return out


def by_sampling(results: dict[str, dict[str, Any]], partitions: list[str]) -> list[str]:
    """Each row's personalised perplexity by how many rounds a client was sampled, from each row's
    first seed (the rows of one seed sample the same clients in the same rounds): where a personal
    model gains or loses against FIT's global one."""
    lines: list[str] = []
    for part in partitions:
        rows = {k: r for k, r in results.items() if k.endswith(f"-{part}") and r.get("by_client")}
        if len(rows) < 2:
            continue
        first = next(iter(rows.values()))
        clients = sorted(first["by_client"])
        if not all(r.get("sampled") for r in rows.values()):
            why = "a row's first seed was kept from an earlier results file that did not record it"
            lines += ["", f"({part}: no breakdown by sampling: {why})"]
            continue
        if any(sorted(r["by_client"]) != clients or r["sampled"] != first["sampled"] for r in rows.values()):
            why = "the rows' first seeds sampled different clients"
            lines += ["", f"({part}: no breakdown by sampling: {why})"]
            continue
        buckets: dict[str, list[str]] = {}
        for client in clients:
            n = first["sampled"].get(client, 0)
            buckets.setdefault(str(n) if n < 4 else "4+", []).append(client)
        table = []
        for bucket in sorted(buckets, key=lambda b: int(b.rstrip("+"))):
            members = buckets[bucket]
            before = [first.get("by_client_before", {}).get(c) for c in members]
            table.append(
                [
                    bucket,
                    str(len(members)),
                    f"{np.mean(before):.2f}" if None not in before else "-",
                    *(f"{np.mean([r['by_client'][c] for c in members]):.2f}" for r in rows.values()),
                ]
            )
        labels = [LABELS[k.rsplit("-", 1)[0]] for k in rows]
        lines += [
            "",
            f"{part}: personalised perplexity by the number of rounds a client was sampled (each row's first "
            "seed; a client never sampled is scored on G at its mask, or on the base model under own "
            "starts):",
            "",
            tables.markdown_table(["rounds sampled", "clients", "base", *labels], table),
        ]
    return lines


def _cell(result: dict[str, Any], key: str, scale: float = 1.0) -> str:
    by_seed = result.get(f"{key}_by_seed", {})
    note = f" ({len(by_seed)} of {result['seeds']} seeds)" if 0 < len(by_seed) < result["seeds"] else ""
    return tables.cell(by_seed, 2, scale) + note


def ordering(results: dict[str, dict[str, Any]], partitions: list[str]) -> list[str]:
    lines = []
    for part in partitions:
        fit = results.get(f"fit-{part}", {})
        for row in ROWS:
            other = results.get(f"{row}-{part}", {})
            if row == "fit" or METRIC not in fit or METRIC not in other:
                continue
            ours, theirs = other[f"{METRIC}_by_seed"], fit[f"{METRIC}_by_seed"]
            claim = tables.check([ours, theirs], means=[other[METRIC], fit[METRIC]])
            noise = tables.claim_text([theirs, ours], lower_is_better=True)  # perplexity: lower is better
            lines.append(
                f"- {part}, {LABELS[row]} < FIT: {claim.verdict} on the mean "
                f"({other[METRIC]:.2f} vs {fit[METRIC]:.2f}); lower in {claim.holding} of {claim.seeds} "
                f"seeds; {noise}"
            )
    return lines


COLUMNS: list[layout.Column[layout.Entry]] = [
    layout.Column("method", lambda entry: LABELS[entry[0].rsplit("-", 1)[0]]),
    layout.Column("partition", lambda entry: entry[0].rsplit("-", 1)[1]),
    layout.Column("ppl before", lambda entry: f"{entry[1].get('before', float('nan')):.2f}"),
    layout.Column("personal ppl", lambda entry: _cell(entry[1], METRIC)),
    layout.Column("weighted", lambda entry: _cell(entry[1], f"{METRIC}_weighted")),
    layout.Column("personal Rouge-L x 100", lambda entry: _cell(entry[1], ROUGE, 100.0)),
    layout.value("MB up/round", "mb_up_per_round"),
    layout.value("MB down/round", "mb_down_per_round"),
    layout.SEEDS,
]
LR = layout.Column[layout.Entry](
    "lr", lambda entry: "-" if entry[1].get("lr") is None else f"{entry[1]['lr']:g}"
)


def markdown(cfg: Any, results: dict[str, dict[str, Any]], partitions: list[str], command: str) -> str:
    rows = [(key, result) for key, result in results.items() if result.get("seeds")]
    return "\n".join(
        [
            f"# {cfg.name}: personalised perplexity (lower is better)",
            "",
            "Each client's own model on its own held-out split, averaged over clients (Rouge-L: greedy"
            " answers, '-' where the runs did not score it).",
            "",
            f"`{command}`",
            "",
            layout.table(columns(rows), rows),
            "",
            "Ordering (the paper: PerFIT < FIT at equal trainable parameters):",
            *ordering(results, partitions),
            *_carried_note(results),
        ]
    )


def columns(rows: list[layout.Entry]) -> list[layout.Column[layout.Entry]]:
    """The table's columns, with the lr each row trained at where its results record it (tables made
    before the lr search did not)."""
    return [*COLUMNS[:2], LR, *COLUMNS[2:]] if any("lr" in result for _, result in rows) else COLUMNS


def _carried_note(results: dict[str, dict[str, Any]]) -> list[str]:
    carried = {key: r["carried_seeds"] for key, r in results.items() if r.get("carried_seeds")}
    if not carried:
        return []
    lines = ["", "Seeds kept from this table's previous results file (their runs are not in --runs-dir):"]
    for key, seeds in carried.items():
        row, part = key.rsplit("-", 1)
        lines.append(f"- {LABELS[row]}, {part}: seed{'s' if len(seeds) > 1 else ''} {', '.join(seeds)}")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = tables.table_parser(__doc__, keep_earlier=True)
    parser.add_argument(
        "--rows", nargs="+", default=["fit", "perfit_s0.33", "perfit_s0.5"], choices=list(ROWS)
    )
    parser.add_argument("--partitions", nargs="+", default=["pathological"], choices=list(PARTITIONS))
    tables.row_lr_option(parser, "fit=0.003")
    search.lrs_option(parser)
    args = tables.parse_args(parser, argv)
    if args.render:
        renderers = {"table-": render_table, search.PREFIX: render_search}
        tables.render(args.render, parser, renderers, args.results_dir)
        return
    own = search.own_lrs(parser, args, ROWS)
    cfg = tables.load_config(args)
    base = args.runs_dir / cfg.name
    command = tables.command_line(__file__, argv)
    rows = {f"{row}-{part}": [*ROWS[row], *PARTITIONS[part]] for part in args.partitions for row in args.rows}
    if args.lrs:
        found = search.Search(cfg, list(rows), args.lrs, SCORE, label_of, row_of)
        search.lr_search(args, found, base, rows, command, summarise)
        return
    stems = tables.at_own_lr(rows, own, row_of)
    runs = tables.plan(base, rows, args.seeds, args.set, stems=stems)
    tables.start(args, runs.runs)
    stem = args.results_dir / f"table-{cfg.name}"
    earlier = tables.earlier_results(stem) if args.keep_earlier else {}
    results = {key: summarise(paths, earlier.get(key), cfg.train.lr) for key, paths in runs.dirs.items()}
    # a run still going may hold no masks yet, and a finished one whose checkpoints (where the masks
    # live) were removed none any more: then the plot on disk is still that of the earlier run
    studied = mask_study_run(runs.dirs, args.partitions[0])
    masks = mask_plot(studied, tables.sibling(stem, "-masks.png")) if studied else {}
    if masks:
        results["masks"] = masks
    elif "masks" in earlier:
        results["masks"] = earlier["masks"]
    text = table_text(cfg, results, args.partitions, command) + tables.closing_notes(runs.dirs, stem, args)
    tables.write_table(stem, text, cfg.name, command, results, args)


def mask_study_run(dirs: dict[str, list[Path]], partition: str) -> Path | None:
    """The run whose masks the table studies: the first finished PerFIT s = 0.5 run of the table's first
    partition (the overlap is grouped by the data categories clients share, which that partition fixes);
    None where it has none here (a partition whose runs are elsewhere keeps its earlier study). Where the
    table has the paper's row, its run, whatever the order of the rows; else an s = 0.5 ablation's."""
    paper = f"perfit_s0.5-{partition}"
    ablations = [key for key in dirs if key.startswith("perfit_s0.5_") and key.endswith(f"-{partition}")]
    keys = [paper] if paper in dirs else ablations
    finished = [path for key in keys for path in dirs[key] if tables.finished_rows(path)]
    return finished[0] if finished else None


def table_text(cfg: Any, results: dict[str, Any], partitions: list[str], command: str) -> str:
    """The table's markdown from its results (the rows, and the masks' study under ``masks``)."""
    rows = {key: result for key, result in results.items() if key != "masks"}
    return "\n".join(
        [
            markdown(cfg, rows, partitions, command),
            *by_sampling(rows, partitions),
            *overlap_lines(results.get("masks", {})),
        ]
    )


def render_table(recorded: tables.Recorded) -> str:
    return table_text(recorded.cfg, recorded.results, recorded.args.partitions, recorded.command)


def render_search(recorded: tables.Recorded) -> str:
    args = recorded.args
    keys = [f"{row}-{part}" for part in args.partitions for row in args.rows]
    return search.render_search(
        recorded, search.Search(recorded.cfg, keys, args.lrs, SCORE, label_of, row_of)
    )


if __name__ == "__main__":
    main()
