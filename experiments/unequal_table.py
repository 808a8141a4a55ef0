"""Clients of unequal means at small scale: heterogeneous ranks, adaptive servers, a zeroth-order client.

    python experiments/unequal_table.py configs/paper/unequal-smollm2.yaml --search --jobs 2   # lr searches
    python experiments/unequal_table.py configs/paper/unequal-smollm2.yaml --seeds 0 1 2 --jobs 2
    python experiments/unequal_table.py configs/paper/unequal-smollm2.yaml --studies ranks --seeds 0 1 2
    python experiments/unequal_table.py configs/paper/unequal-smollm2.yaml --seeds 0 1 2 --table-only

Studies (``--studies``, rows in `experiments/unequal_rows.py`):
- ``ranks``: clients at LoRA ranks 4, 8 and 16 (round-robin): HetLoRA and FlexLoRA against FedIT at the
  weakest client's rank everywhere and FedIT at the strongest's (the papers' ordering: FlexLoRA >= HetLoRA
  > FedIT at the smallest rank);
- ``fedopt``: FedAdam, FedYogi and FedAdagrad against FedAvg (FedIT) and FedAvgM, each adaptive server's
  lr searched;
- ``kseed``: FedKSeed (every parameter, forward passes only, K scalars up) against FedIT's LoRA: quality,
  bytes per round, and what a client holds.

``--search`` runs the rows of ``experiments.unequal_rows.SEARCH`` at each lr of their grid on the
validation split (seed 0; the test split is not read) and writes ``search-<config name>`` (.md, .json):
each row's validation perplexity by lr and the lr chosen (the lowest). The table's runs of such a row use
the chosen lr (run directories ``<row>-lr<lr>-s<seed>``); a row not searched yet is left out, and the
table says so.

The table (``table-<config name>`` .md, .json, .png) gives per row the global model's final perplexity on
the test split (mean ± sample std over seeds, each seed's value), what one client sends up and is sent
down per round (the run's own byte counters, divided by the clients a round samples), the client's
seconds per round and the run's peak RSS (the simulation's process, which holds the server too; the
client's own peak memory is `bench/fedkseed_memory.py`'s). Each claim is judged by the paired difference
of perplexity over seeds (same seed: same partition, sampling and test subset) with a Student-t 95%
interval: holds (the interval lies below 0 in perplexity), reversed, or tie. Runs are subprocesses,
``--jobs`` at a time with one thread each; rerunning resumes unfinished runs and skips finished ones.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments import plots, tables
from experiments.tables import layout
from experiments.unequal_rows import CLAIMS, LABELS, ROWS, SEARCH, STUDIES

METRIC = "perplexity"


def summarise(run_dirs: list[Path]) -> dict[str, Any]:
    """A row's final test perplexity over seeds (sample std), and from its first finished seed the bytes
    a client sends and is sent per round, its seconds per round, the peak RSS and HetLoRA's ranks."""
    finals = tables.finals(run_dirs, METRIC)
    out: dict[str, Any] = {"seeds": len(finals)}
    if not finals:
        return out
    out |= tables.over_seeds(METRIC, {seed: row["eval"][METRIC] for seed, row in finals.items()})
    first = next(d for d in run_dirs if tables.seed_of(d) == min(finals, key=int))
    rows = tables.trained_rows(tables.read_rows(first))

    def per_client(key: str) -> float:  # a round's counter over the clients it sampled, mean over rounds
        return float(np.mean([row[key] / len(row["clients"]) for row in rows]))

    out["kb_up_per_client"] = per_client("bytes_up") / 1e3
    out["kb_down_per_client"] = per_client("bytes_down") / 1e3
    out["client_seconds"] = per_client("client_seconds")
    out["peak_rss_mb"] = max(float(r.get("peak_rss_mb", 0.0)) for r in rows)
    if any("mean_client_rank" in r for r in rows):
        out["mean_client_rank_last"] = float(rows[-1].get("mean_client_rank", float("nan")))
    return out


def search_key(row: str, lr: float) -> str:
    return f"{row}-lr{lr:g}"


def run_search(args: Any, cfg: Any, base: Path, command: str) -> None:
    """Every searched row of the studies at each lr of its grid, on the validation split, seed 0."""
    rows = [row for study in args.studies for row in STUDIES[study] if row in SEARCH]
    keys = {search_key(row, lr): (row, lr) for row in dict.fromkeys(rows) for lr in SEARCH[row][1]}
    overrides = {
        key: [*ROWS[row], f"{SEARCH[row][0]}={lr}", "data.eval_split=validation"]
        for key, (row, lr) in keys.items()
    }
    runs = tables.plan(base, overrides, [0], args.set, stems={key: f"val-{key}" for key in keys})
    tables.start(args, runs.runs)
    results: dict[str, Any] = {key: summarise(paths) for key, paths in runs.dirs.items()}
    stem = args.results_dir / f"search-{cfg.name}"
    earlier = tables.earlier_results(stem)
    for key, value in earlier.items():  # a search of other studies stays recorded
        if key != "chosen":
            results.setdefault(key, value)
    results["chosen"] = dict(earlier.get("chosen", {})) | chosen(results)
    tables.write_table(stem, search_text(cfg, results, command), cfg.name, command, results, args)


def chosen(results: dict[str, Any]) -> dict[str, float]:
    """Row -> the lr of its lowest validation perplexity, for rows every lr of whose grid finished."""
    out = {}
    for row, (_, grid) in SEARCH.items():
        found = [results.get(search_key(row, lr), {}) for lr in grid]
        if found and all(METRIC in r for r in found):
            out[row] = grid[int(np.argmin([r[METRIC] for r in found]))]
    return out


def search_text(cfg: Any, results: dict[str, Any], command: str) -> str:
    lines = [
        f"# {cfg.name}: learning-rate search, validation perplexity (seed 0; lower is better)",
        "",
        f"`{command}`",
        "",
    ]
    table = []
    for row, (key, grid) in SEARCH.items():
        cells = [results.get(search_key(row, lr), {}).get(METRIC) for lr in grid]
        if all(c is None for c in cells):
            continue
        pick = results["chosen"].get(row)
        shown = ["-" if c is None else f"{c:.3f}" for c in cells]
        shown = [f"**{text}**" if lr == pick else text for lr, text in zip(grid, shown, strict=True)]
        table.append(
            [LABELS[row], key, " / ".join(f"{lr:g}" for lr in grid), " / ".join(shown), _edge(row, pick)]
        )
    lines.append(
        tables.markdown_table(["row", "searched", "grid", "perplexity (chosen in bold)", "note"], table)
    )
    return "\n".join(lines)


def _edge(row: str, pick: float | None) -> str:
    """ "edge of the grid" where the chosen lr is the grid's largest or smallest."""
    grid = SEARCH[row][1]
    return "edge of the grid" if pick is not None and pick in (min(grid), max(grid)) else ""


def final_rows(
    studies: list[str], picked: dict[str, float]
) -> tuple[dict[str, list[str]], dict[str, str], list[str]]:
    """The table's rows (row -> overrides), their run stems, and the searched rows left out (no lr yet)."""
    rows, stems, missing = {}, {}, []
    for row in dict.fromkeys(r for study in studies for r in STUDIES[study]):
        if row not in SEARCH:
            rows[row] = ROWS[row]
        elif row in picked:
            rows[row] = [*ROWS[row], f"{SEARCH[row][0]}={picked[row]}"]
            stems[row] = search_key(row, picked[row])
        else:
            missing.append(row)
    return rows, stems, missing


def _lr(key: str, picked: dict[str, float]) -> str:
    if key not in picked or key not in SEARCH:
        return "-"
    edge = " (grid's edge)" if _edge(key, picked[key]) else ""
    return f"{SEARCH[key][0].split('.')[1]} {picked[key]:g}{edge}"


def _rank(entry: layout.Entry) -> str:
    """HetLoRA's sampled clients' mean rank after the last round's pruning (first seed); - elsewhere."""
    rank = entry[1].get("mean_client_rank_last")
    return "-" if rank is None else f"{rank:.2f}"


def columns(picked: dict[str, float]) -> list[layout.Column[layout.Entry]]:
    return [
        layout.Column("method", lambda e: LABELS[e[0]]),
        layout.Column("lr (searched)", lambda e: _lr(e[0], picked)),
        layout.Column("perplexity", lambda e: tables.cell(e[1][f"{METRIC}_by_seed"], 3)),
        layout.Column(
            "by seed", lambda e: " / ".join(f"{v:.3f}" for v in e[1][f"{METRIC}_by_seed"].values())
        ),
        layout.value("KB up/client/round", "kb_up_per_client", 1),
        layout.value("KB down/client/round", "kb_down_per_client", 1),
        layout.value("client s/round", "client_seconds", 1),
        layout.value("peak RSS MB (sim.)", "peak_rss_mb", 0),
        layout.Column("client rank, last round", _rank),
        layout.SEEDS,
    ]


def claim_lines(study: str, results: dict[str, Any]) -> list[str]:
    lines = []
    for worse, better, says in CLAIMS[study]:
        a, b = results.get(worse, {}), results.get(better, {})
        if METRIC not in a or METRIC not in b:
            continue
        interval = tables.paired_interval(
            a[f"{METRIC}_by_seed"], b[f"{METRIC}_by_seed"], lower_is_better=True
        )
        lines.append(f"- {says}: {interval.text(3)}")
    return lines


def markdown(
    cfg: Any, results: dict[str, Any], studies: list[str], picked: dict[str, float], command: str
) -> str:
    lines = [
        f"# {cfg.name}: clients of unequal means ({cfg.model.name}, {cfg.data.dataset}, "
        f"{cfg.data.partition.num_clients} clients, {cfg.fed.clients_per_round} a round, "
        f"{cfg.fed.rounds} rounds)",
        "",
        f"`{command}`",
        "",
        "Perplexity of the global model on the test split (lower is better): mean ± sample std over seeds. "
        "A claim's gain is the paired perplexity difference (worse row minus better row) per seed, with a "
        "Student-t 95% interval: holds (above 0), reversed (below 0), tie (contains 0).",
    ]
    for study in studies:
        shown = [(row, results[row]) for row in STUDIES[study] if results.get(row, {}).get("seeds")]
        if not shown:
            continue
        lines += ["", f"## {study}", "", layout.table(columns(picked), shown), "", "Claims:"]
        lines += claim_lines(study, results) or ["- (no claim has both rows yet)"]
    missing = results.get("not_searched", [])
    if missing:
        lines += [
            "",
            f"Left out, their lr not searched yet (`--search`): {', '.join(LABELS[m] for m in missing)}.",
        ]
    return "\n".join(lines)


SHORT = {
    "fedit": "FedIT r8",
    "fedit_r4": "FedIT r4",
    "fedit_r16": "FedIT r16",
    "hetlora": "HetLoRA",
    "flexlora": "FlexLoRA",
    "fedavgm": "FedAvgM",
    "fedadam": "FedAdam",
    "fedyogi": "FedYogi",
    "fedadagrad": "FedAdagrad",
    "fedkseed": "FedKSeed",
}
"""Tick labels of the plot."""


def plot(cfg: Any, results: dict[str, Any], studies: list[str], path: Path) -> Path | None:
    """One panel per study: each row's test perplexity, each seed a dot, the mean ± sample std."""
    panels = []
    for study in studies:
        rows = [row for row in STUDIES[study] if results.get(row, {}).get("seeds")]
        if rows:
            series = plots.Series(
                "final perplexity",
                "#1f77b4",
                "o",
                0.0,
                [results[row][f"{METRIC}_by_seed"].values() for row in rows],
            )
            panels.append(plots.Panel(study, [SHORT[row] for row in rows], [series]))
    if not panels:
        return None
    title = f"{cfg.name}: {cfg.model.name}, test perplexity (lower is better); dots: seeds"
    return plots.seed_panels(panels, width=4.0, height=3.2, ylabel="perplexity", title=title, path=path)


def main(argv: list[str] | None = None) -> None:
    parser = tables.table_parser(__doc__)
    parser.add_argument("--studies", nargs="+", default=list(STUDIES), choices=list(STUDIES))
    parser.add_argument("--search", action="store_true", help="search the lr of the rows that have a grid")
    args = tables.parse_args(parser, argv)
    if args.render:
        renderers = {"table-": render_table, "search-": render_search}
        tables.render(args.render, parser, renderers, args.results_dir)
        return
    cfg = tables.load_config(args)
    base = args.runs_dir / cfg.name
    command = tables.command_line(__file__, argv)
    if args.search:
        run_search(args, cfg, base, command)
        return
    picked = tables.earlier_results(args.results_dir / f"search-{cfg.name}").get("chosen", {})
    rows, stems, missing = final_rows(args.studies, picked)
    runs = tables.plan(base, rows, args.seeds, args.set, stems=stems, seed_major=True)
    tables.start(args, runs.runs)
    results: dict[str, Any] = {row: summarise(paths) for row, paths in runs.dirs.items()}
    results["chosen"] = {row: picked[row] for row in rows if row in picked}
    results["not_searched"] = missing
    stem = args.results_dir / f"table-{cfg.name}"
    text = markdown(cfg, results, args.studies, results["chosen"], command)
    text += tables.closing_notes(runs.dirs, stem, args)
    tables.write_table(stem, text, cfg.name, command, results, args)
    plot(cfg, results, args.studies, tables.sibling(stem, ".png"))


def render_table(recorded: tables.Recorded) -> str:
    results = recorded.results
    return markdown(recorded.cfg, results, recorded.args.studies, results["chosen"], recorded.command)


def render_search(recorded: tables.Recorded) -> str:
    return search_text(recorded.cfg, recorded.results, recorded.command)


if __name__ == "__main__":
    main()
