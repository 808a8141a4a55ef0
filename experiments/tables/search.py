"""A table's learning-rate search on validation (``--lrs``), for a table whose rows train with ``train.lr``:
each row at each lr with ``data.eval_split=validation`` (the test split is not read: with
``eval.personal``, each client's validation split is held out from what it trains on), scored on one
value of the row's results, and each row's own best lr. Written to ``sweep-lr-<config name>`` (.md,
.json, and a plot of the score against the lr); the .md ends with the ``--row-lr`` that runs the table at
those lrs. FedBiOT and FedPFT keep their own searches (two outputs a run; one lr for every row).
"""

from __future__ import annotations

import argparse
import textwrap
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import markdown_table, sibling

from experiments.tables.aggregate import (
    FEWER_SEEDS_NOTE,
    cell,
    fewer_seeds,
    over_seeds,
    seed_count,
    seeds_text,
)
from experiments.tables.keep import keep_earlier_rows, keep_earlier_seeds, write_table
from experiments.tables.notes import closing_notes
from experiments.tables.runs import AtLr, finals, plan, row_lrs, start, train_lr

VALIDATION = "data.eval_split=validation"
PREFIX = "sweep-lr-"


@dataclass(frozen=True)
class Score:
    """What a search ranks the lrs of a row by: ``key`` of the row's results (its mean over seeds, with
    ``key_by_seed`` beside it), shown as ``label`` times ``scale``."""

    key: str
    label: str
    lower_is_better: bool
    scale: float = 1.0


def final_values(key: str) -> Callable[[list[Path]], dict[str, Any]]:
    """A summariser for `lr_search`: the value of ``key`` each finished run last evaluated, over seeds
    (`over_seeds`)."""

    def summarise(paths: list[Path]) -> dict[str, Any]:
        return over_seeds(key, {seed: row["eval"][key] for seed, row in finals(paths, key).items()})

    return summarise


def lrs_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--lrs",
        nargs="+",
        type=float,
        metavar="LR",
        help="search the lr instead of running the table: every row at each LR on the validation split "
        "(the test split is not read); writes sweep-lr-<config name> and the --row-lr of each row's best",
    )


def own_lrs(
    parser: argparse.ArgumentParser, args: argparse.Namespace, rows: Iterable[str]
) -> dict[str, float]:
    """``--row-lr`` as row -> lr (`row_lrs`); given with ``--lrs`` (which searches every row's lr), a usage
    error."""
    own = row_lrs(parser, args.row_lr, rows)
    if args.lrs and own:
        parser.error("--lrs searches the lr of every row: give it without --row-lr")
    return own


def search_key(lr: float, row: str) -> str:
    return f"lr{lr:g}-{row}"


def search_rows(
    rows: Mapping[str, Sequence[str]], lrs: Sequence[float], at_lr: AtLr = train_lr
) -> dict[str, list[str]]:
    """Each row (key -> overrides) at each lr (``at_lr``), on validation: ``lr<lr>-<key>`` -> overrides,
    lr-major."""
    return {
        search_key(lr, key): [*at_lr(overrides, lr), VALIDATION]
        for lr in lrs
        for key, overrides in rows.items()
    }


def best_lrs(
    results: Mapping[str, Any], rows: Sequence[str], lrs: Sequence[float], score: Score
) -> dict[str, float]:
    """Row key -> its best lr among those whose runs finished (a tie goes to the smaller lr)."""
    sign = -1.0 if score.lower_is_better else 1.0
    best = {}
    for row in rows:
        done = [
            (sign * results[search_key(lr, row)][score.key], -lr)
            for lr in lrs
            if score.key in results.get(search_key(lr, row), {})
        ]
        if done:
            best[row] = -max(done)[1]
    return best


def row_lr_line(
    best: Mapping[str, float],
    row_of: Callable[[str], str],
    own_key: Callable[[str], str | None] | None = None,
) -> str:
    """The ``--row-lr`` of ``best`` (row key -> lr), by row; a row whose keys (one per setting, partition
    or model) disagree is left out, named in a note instead, unless ``own_key`` gives each of them a
    ``--row-lr`` name of its own (a model's runs) that keeps one lr: then those names stand in for it."""
    by_row: dict[str, set[float]] = {}
    for key, lr in best.items():
        by_row.setdefault(row_of(key), set()).add(lr)
    agreed = {row: next(iter(lrs)) for row, lrs in by_row.items() if len(lrs) == 1}
    split = sorted(row for row, lrs in by_row.items() if len(lrs) > 1)
    for row in list(split):
        apart: dict[str | None, set[float]] = {}
        for key, lr in best.items():
            if row_of(key) == row:
                apart.setdefault(None if own_key is None else own_key(key), set()).add(lr)
        if None not in apart and all(len(lrs) == 1 for lrs in apart.values()):
            agreed.update({str(name): next(iter(lrs)) for name, lrs in apart.items()})
            split.remove(row)
    line = (
        f"The table at these lrs: `--row-lr {' '.join(f'{row}={lr:g}' for row, lr in agreed.items())}`"
        if agreed
        else ""
    )
    if split:
        line += f"{chr(10) * 2 if line else ''}Best lr differs between the runs of: {', '.join(split)}"
    return line


@dataclass(frozen=True)
class Search:
    """What a search's outputs show: the table's config, its row keys and lrs, the score, a row key's
    label and its row (the ``--row-lr`` name), and a key's own ``--row-lr`` name where its row's keys
    disagree (`row_lr_line`)."""

    cfg: Any
    rows: Sequence[str]
    lrs: Sequence[float]
    score: Score
    label: Callable[[str], str]
    row_of: Callable[[str], str]
    own_key: Callable[[str], str | None] | None = None  # `row_lr_line`'s
    # lines under the table from the results (e.g. what a reference answer scores on the same draws)
    notes: Callable[[Mapping[str, Any]], list[str]] | None = None


def search_text(search: Search, results: Mapping[str, Any], command: str, seeds: int) -> str:
    """The search's markdown: the score by lr per row (mean ± sample std over seeds), each row's best lr,
    and the ``--row-lr`` line."""
    cfg, lrs, score = search.cfg, search.lrs, search.score
    best = results.get("best_lr", {})

    def shown(result: Mapping[str, Any]) -> str:
        value = cell(result.get(f"{score.key}_by_seed"), 2, score.scale)
        return value if value == "-" else value + fewer_seeds(result, seeds)

    cells = {(row, lr): results.get(search_key(lr, row), {}) for row in search.rows for lr in lrs}
    table = [
        [search.label(row), *(shown(cells[row, lr]) for lr in lrs), f"{best[row]:g}" if row in best else "-"]
        for row in search.rows
    ]
    better = "lower" if score.lower_is_better else "higher"
    lines = [
        f"# {cfg.name}: learning-rate search per row, validation {score.label}",
        "",
        f"`{command}`; {cfg.fed.rounds} round{'' if cfg.fed.rounds == 1 else 's'}, {seeds_text(seeds)} "
        "(mean ± sample std over seeds). "
        "Every run evaluates on the validation split (`data.eval_split=validation`); the test split is "
        "not read.",
        "",
        markdown_table(["row", *(f"lr {lr:g}" for lr in lrs), "best lr"], table),
        "",
        f"A row's best lr has the {better} mean {score.label} (a tie: the smaller lr).",
    ]
    if any(fewer_seeds(result, seeds) for result in cells.values()):
        lines += ["", FEWER_SEEDS_NOTE]
    notes = search.notes(results) if search.notes is not None else []
    if notes:
        lines += ["", *notes]
    line = row_lr_line(best, search.row_of, search.own_key)
    return "\n".join([*lines, *(["", line] if line else [])])


def plot_search(search: Search, results: Mapping[str, Any], path: Path) -> Path:
    """The score against the lr (log axis), a line per row, its seeds as dots."""
    from experiments import plots

    cfg, score = search.cfg, search.score
    figure, axes, first = plots.panel_grid(1, 5.0, 3.4)
    ax = axes[0]
    for row in search.rows:
        found = [(lr, results.get(search_key(lr, row), {})) for lr in search.lrs]
        found = [(lr, r) for lr, r in found if score.key in r]
        if not found:
            continue
        line = ax.plot(
            [lr for lr, _ in found],
            [r[score.key] * score.scale for _, r in found],
            marker="o",
            label=search.label(row),
        )
        for lr, r in found:
            values = [v * score.scale for v in r.get(f"{score.key}_by_seed", {}).values()]
            ax.scatter([lr] * len(values), values, s=10, alpha=0.45, color=line[0].get_color())
    title = f"{cfg.name}: {cfg.model.name}, lr search (validation)"
    return plots.finish_grid(
        figure,
        axes,
        first,
        xlabel="lr",
        ylabel="\n".join(textwrap.wrap(f"validation {score.label}", 26)),  # a long label fits the height
        title=title,
        path=path,
        log_x=True,
    )


def lr_search(
    args: argparse.Namespace,
    search: Search,
    base: Path,
    rows: Mapping[str, Sequence[str]],
    command: str,
    summarise: Callable[[list[Path]], dict[str, Any]],
    at_lr: AtLr = train_lr,
    starts: Callable[[Mapping[Path, Sequence[str]]], Mapping[Path, Sequence[str]]] | None = None,
    reference: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Run (unless ``--table-only``) and write ``search``: ``rows`` (its keys -> their overrides) at its lrs
    (``at_lr``: how a row trains at an lr); ``summarise``: the table's, a row's run directories -> its
    values over seeds; ``starts``: the runs of those planned (run directory -> overrides) that start
    (default every one; the others are read where they are); ``reference``: entries the results file
    keeps beside the cells (what ``search.notes`` reads). Returns the results.

    With ``--keep-earlier`` a row and lr none of whose runs is here keeps what the previous file recorded,
    whole; one with some seeds' runs here takes the other seeds asked for from that file, seed by seed (a
    search extended on another machine, or a row searched since the others' runs went); the file names
    both."""
    runs = plan(base, search_rows(rows, search.lrs, at_lr), args.seeds, args.set)
    start(args, runs.runs if starts is None else starts(runs.runs))
    results: dict[str, Any] = {key: summarise(paths) for key, paths in runs.dirs.items()}
    for result in results.values():  # how many seeds a cell has, as every table records it
        result.setdefault("seeds", seed_count(result))
    stem = args.results_dir / f"{PREFIX}{search.cfg.name}"
    labels = {
        search_key(lr, row): f"{search.label(row)} at lr {lr:g}" for lr in search.lrs for row in search.rows
    }
    kept = keep_earlier_cells(args, results, stem, labels.__getitem__)
    results["best_lr"] = best_lrs(results, search.rows, search.lrs, search.score)
    results.update(reference or {})
    text = search_text(search, results, command, len(args.seeds))
    text += closing_notes(runs.dirs, stem, args, **kept)
    write_table(stem, text, search.cfg.name, command, results, args)
    plot_search(search, results, sibling(stem, ".png"))
    return results


def keep_earlier_cells(
    args: argparse.Namespace, results: dict[str, Any], stem: Path, label: Callable[[str], str]
) -> dict[str, Any]:
    """``--keep-earlier`` for a search, kept cell by cell (a row at an lr): a cell none of whose runs is
    here takes what the previous ``<stem>.json`` recorded, whole (`keep_earlier_rows`); one with some
    seeds' runs here takes the other seeds asked for from that file, seed by seed (`keep_earlier_seeds`).
    Returns the `closing_notes` keywords that name them, each cell as ``label(key)`` names it (none
    without ``--keep-earlier``)."""
    if not getattr(args, "keep_earlier", False):
        return {}
    rows = keep_earlier_rows(results, stem)
    seeds = keep_earlier_seeds(results, stem, args.seeds, rows)
    return {"kept_rows": [label(key) for key in rows], "kept_seeds": {label(k): s for k, s in seeds.items()}}


def render_search(recorded: Any, search: Search) -> str:
    """``--render`` of a search's results file (``search``: as its command made it)."""
    return search_text(search, recorded.results, recorded.command, len(recorded.args.seeds))
