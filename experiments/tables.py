"""The table machine every paper-table script stands on: a script holds its rows (name -> config
overrides), what it reads off a finished run, its claims (the paper's orderings) and its table's layout;
this module does the rest.

- Rows and seeds (`plan`): a row's run for seed ``s`` is ``--runs-dir/<config name>/<row>-s<s>``, its
  overrides ``--set`` first, then the row's own (which win), then ``seed=<s>``; the seed is the name's
  part after the last ``-s``.
- Running (`start`, `run`): ``python -m fedtune run <config> <overrides> -o <run dir>`` in a subprocess of
  its own (a crash or an out-of-memory kill loses one run), its output appended to ``<run dir>.log``; a
  run with checkpoints is resumed, a finished one is skipped. ``--jobs`` runs at once, one thread each.
- Reading: a run counts once it has finished (its last metrics row is the config's last round). Metrics
  are read through ``fedtune.report.io.read_metrics`` (a round re-run after a resume counts once).
- Over seeds (`finals`, `seed_values`, `over_seeds`): a value ``key`` of a row is ``key`` (the mean),
  ``key_std`` (the population std) and ``key_by_seed``; a cell is ``mean ± std`` (the mean alone for one
  seed, ``-`` for none).
- Claims (`check`, `verdict`): orderings compare means rounded to 12 decimals, so that means of the same
  fractions summed in another order compare equal: "holds", "does not hold", or "tie" where every mean is
  the same (a tie is never "holds"); and in how many of the seeds every row has they hold.
- Keeping earlier results: ``--keep-earlier`` takes what has no run here from the table's previous
  ``.json`` (a row whole, `keep_earlier_rows`, or seed by seed, `keep_earlier_seeds`); a write that would
  drop a value the previous ``.json`` has is refused unless ``--overwrite`` says so (`write_table`).
- Notes (`closing_notes`): a table names what it kept and every reply its runs' servers rejected (such a
  row is not the method's plain average).
- Rendering (`render`): ``--render RESULTS_JSON`` rewrites a table's ``.md`` from its ``.json`` alone.
- Plots: `experiments.plots`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import command_line, markdown_table, sibling
from bench.common import write_table as write_files

__all__ = [
    "RESULTS_DIR",
    "Plan",
    "Recorded",
    "Renderer",
    "Verdict",
    "carried_seeds",
    "cell",
    "check",
    "closing_notes",
    "command_line",
    "common_seeds",
    "dropped_values",
    "earlier_rejections",
    "earlier_results",
    "fill_cells",
    "fill_seeds",
    "finals",
    "finished_rows",
    "keep_earlier_rows",
    "keep_earlier_seeds",
    "kept_rows_note",
    "kept_seeds_note",
    "last_evaluated",
    "load_config",
    "markdown_table",
    "mean_std",
    "on_common_seeds",
    "over_seeds",
    "parse_args",
    "per_round_mb",
    "plan",
    "plus_minus",
    "read_rows",
    "rejected_note",
    "rejected_replies",
    "render",
    "rises",
    "run",
    "run_all",
    "run_notes",
    "seed_dirs",
    "seed_of",
    "seed_slice",
    "seed_values",
    "seeds_holding",
    "seeds_text",
    "sibling",
    "stamp_of",
    "start",
    "table_parser",
    "trained_rows",
    "verdict",
    "write_table",
]

RESULTS_DIR = Path(__file__).resolve().parent / "results"
Row = dict[str, Any]
KEEP_FLAGS = {"--keep-earlier": "keep_earlier", "--add": "add"}  # what keeps a table's earlier values


# ---------------------------------------------------------------- command line
def table_parser(
    description: str | None, *, seeds: bool = True, jobs: bool = True, keep_earlier: bool = False
) -> argparse.ArgumentParser:
    """The options every table script shares; the script adds its rows and settings."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("config", type=Path, nargs="?")
    parser.add_argument("--runs-dir", type=Path, default=Path("runs/paper"))
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument(
        "--render",
        type=Path,
        metavar="RESULTS_JSON",
        help="rewrite the .md of this results file from its numbers alone, into --results-dir: nothing is "
        "run or read but the .json (its command gives the options) and the .md beside it (its notes)",
    )
    if seeds:
        parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    if jobs:
        parser.add_argument("--jobs", type=int, default=1, help="runs at once, one thread each")
    parser.add_argument("--table-only", action="store_true", help="tabulate existing runs, start nothing")
    parser.add_argument("--set", action="append", default=[], help="a config override for every run")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="write the table even where it drops values its previous results file has (whose runs are "
        "not here); without it such a write is refused",
    )
    if keep_earlier:
        parser.add_argument(
            "--keep-earlier",
            action="store_true",
            help="what has no run in --runs-dir (made on another machine) keeps the value the table's "
            "previous results file recorded (a seed, or for FedBiOT and FedPFT a whole row); the table "
            "names what it kept",
        )
    return parser


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """``parser``'s options; CONFIG is required but with ``--render`` (the results file names it)."""
    args = parser.parse_args(argv)
    if args.config is None and args.render is None:
        parser.error("the following arguments are required: config")
    return args


def load_config(args: argparse.Namespace) -> Any:
    """The table's config with ``--set`` applied (its name names the runs directory and the table)."""
    from fedtune.config import load_config as load

    return load(args.config, args.set)


# ---------------------------------------------------------------- running
def run(config: Path, overrides: Sequence[str], run_dir: Path, *, threads: int | None = 1) -> None:
    """Run ``config`` with ``overrides`` into ``run_dir`` (resume it if it has checkpoints, skip it if
    it has finished); ``threads``: OpenMP/MKL threads of the run (None: the default)."""
    if finished_rows(run_dir):
        print(f"finished earlier: {run_dir}", flush=True)
        return
    command = [sys.executable, "-m", "fedtune"]
    if (run_dir / "checkpoints").is_dir():
        command += ["resume", str(run_dir)]
    else:
        command += ["run", str(config), *overrides, "progress=false", "-o", str(run_dir)]
    log = sibling(run_dir, ".log")  # not with_suffix: "s0.33" would be cut
    print(f"{' '.join(command)}  (log: {log})", flush=True)
    env = dict(os.environ)
    if threads is not None:
        env |= {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as handle:
        code = subprocess.run(command, env=env, stdout=handle, stderr=subprocess.STDOUT).returncode
    if code != 0:
        raise RuntimeError(f"{run_dir}: fedtune exited with {code}; see {log}")


def run_all(
    config: Path, runs: Mapping[Path, Sequence[str]], *, jobs: int = 1, threads: int | None = 1
) -> None:
    """``run`` every run directory -> overrides of ``runs``, ``jobs`` at a time, in the order given."""
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(run, config, o, d, threads=threads) for d, o in runs.items()]
        for future in futures:
            future.result()


@dataclass(frozen=True)
class Plan:
    """A table's runs: ``dirs``, row -> its run directories (one per seed, in the seeds' order), and
    ``runs``, run directory -> its overrides, in the order they start."""

    dirs: dict[str, list[Path]]
    runs: dict[Path, list[str]]


def plan(
    base: Path,
    rows: Mapping[str, Sequence[str]],
    seeds: Sequence[int],
    extra: Sequence[str] = (),
    *,
    stems: Mapping[str, str] | None = None,
    seed_major: bool = False,
) -> Plan:
    """The runs of ``rows`` (row -> its overrides) for each of ``seeds``: ``base/<stem>-s<seed>`` with
    ``[*extra, *overrides, "seed=<seed>"]`` (``extra``, ``--set``, first: what defines a row wins over
    it). A row's stem is its name unless ``stems`` gives another (a run shared with another table).
    ``seed_major``: every row of a seed starts before the next seed (else every seed of a row)."""
    named = stems or {}
    dirs = {row: seed_dirs(base, named.get(row, row), seeds) for row in rows}
    pairs = [(row, index) for row in rows for index in range(len(seeds))]
    if seed_major:
        pairs.sort(key=lambda pair: pair[1])  # stable: the rows keep their order within a seed
    runs = {dirs[row][i]: [*extra, *rows[row], f"seed={seeds[i]}"] for row, i in pairs}
    return Plan(dirs, runs)


def start(
    args: argparse.Namespace,
    runs: Mapping[Path, Sequence[str]],
    *,
    jobs: int | None = None,
    threads: int | None = 1,
) -> None:
    """`run_all` of ``runs`` on ``args.config``, ``jobs`` (default ``--jobs``, else 1) at a time; nothing
    with ``--table-only``."""
    if not args.table_only:
        at_once = jobs if jobs is not None else int(getattr(args, "jobs", 1))
        run_all(args.config, runs, jobs=at_once, threads=threads)


def seed_dirs(base: Path, key: str, seeds: Iterable[int]) -> list[Path]:
    return [base / f"{key}-s{seed}" for seed in seeds]


def seed_of(run_dir: Path) -> str:
    return run_dir.name.rsplit("-s", 1)[-1]


# ---------------------------------------------------------------- reading
def read_rows(run_dir: Path) -> list[Row]:
    """The run's metrics rows, one per round (``read_metrics``); none for a run that has not written one."""
    from fedtune.report.io import read_metrics

    path = run_dir / "metrics.jsonl"
    if not path.is_file() or b"\n" not in path.read_bytes():  # nothing yet, or a first line cut off
        return []
    return read_metrics(run_dir)


def finished_rows(run_dir: Path) -> list[Row]:
    """The metrics rows of a finished run (its last row is the config's last round); [] otherwise."""
    from fedtune.report.io import config_value, read_config

    rows = read_rows(run_dir)
    if rows and rows[-1]["round"] == config_value(read_config(run_dir), "fed.rounds"):
        return rows
    return []


def trained_rows(rows: Iterable[Row]) -> list[Row]:
    return [row for row in rows if row["round"] > 0]


def last_evaluated(rows: Iterable[Row], metric: str | None = None) -> Row | None:
    """The last row after training began whose evaluation has ``metric`` (any evaluation: None)."""
    evaluated = [r for r in trained_rows(rows) if r.get("eval") and (metric is None or metric in r["eval"])]
    return evaluated[-1] if evaluated else None


def rejected_replies(run_dir: Path) -> list[tuple[int, str, str]]:
    """(round, client, the server's reason) for every reply the run's server rejected (``fed.screen``,
    ``fed.norm_bound``, a reply failing its checks), in round order; [] for a run not here."""
    return [
        (int(row["round"]), str(client), str(reason))
        for row in read_rows(run_dir)
        for client, reason in (row.get("rejected") or {}).items()
    ]


REJECTED_HEAD = "Replies the server rejected, left out of their round's aggregate (run, round, client: why):"
FROM_EARLIER = " (previous results file)"


def rejected_note(run_dirs: Iterable[Path], under: Path | None = None, earlier: Path | None = None) -> str:
    """A table's note naming each reply its runs' servers rejected: such a row is not the method's plain
    average over the round's clients (the default median screen can turn away an honest client whose
    update diverged). A run is named by its directory's name, or by its path under ``under`` where runs
    of one name live in several directories. "" when no run rejected any.

    ``earlier`` (``--keep-earlier``: the table's stem): a run of the table that is not here (made on
    another machine; its values kept from the previous write) keeps the lines the previous ``<stem>.md``
    gave it, marked as such; a run here is always read again."""

    def name(run_dir: Path) -> str:
        return run_dir.name if under is None else run_dir.relative_to(under).as_posix()

    kept = earlier_rejections(earlier) if earlier is not None else None
    lines = []
    for run_dir in run_dirs:
        if kept is not None and not read_rows(run_dir):
            lines += [line for line in kept if line.startswith(f"- {name(run_dir)}, round ")]
        else:
            replies = rejected_replies(run_dir)
            lines += [f"- {name(run_dir)}, round {rnd}, {client}: {why}" for rnd, client, why in replies]
    if not lines:
        return ""
    return "\n\n" + REJECTED_HEAD + "\n\n" + "\n".join(lines) + "\n"


def earlier_rejections(stem: Path) -> list[str]:
    """The lines of the previous ``<stem>.md``'s rejection note (read once a table), marked as kept."""
    path = sibling(stem, ".md")
    if not path.is_file():
        return []
    text = path.read_text()
    if REJECTED_HEAD not in text:
        return []
    note = text.split(REJECTED_HEAD, 1)[1].lstrip("\n").split("\n\n", 1)[0]  # the list under the heading
    return [
        line if line.endswith(FROM_EARLIER) else line + FROM_EARLIER
        for line in note.splitlines()
        if line.startswith("- ")
    ]


def write_table(
    stem: Path, text: str, config: str, command: str, results: Any, args: argparse.Namespace
) -> None:
    """``bench.common.write_table``, refusing (before anything is written) a table that would drop a value
    its previous ``<stem>.json`` recorded, unless ``args.overwrite``: a seed or row whose run is not here
    (made on another machine, or asked for no more) would otherwise vanish from the results file. Only
    numbers count as values (a list of kept seeds is not one); a value that changes is no loss."""
    if not getattr(args, "overwrite", False):
        lost = dropped_values(earlier_results(stem), results)
        if lost:
            raise SystemExit(_refusal(sibling(stem, ".json"), lost, args))
    write_files(stem, text, config, command, results)


def _refusal(path: Path, lost: list[str], args: argparse.Namespace) -> str:
    shown = ", ".join(lost[:5]) + (f" and {len(lost) - 5} more" if len(lost) > 5 else "")
    flag = next((flag for flag, name in KEEP_FLAGS.items() if hasattr(args, name)), None)
    if flag is not None and getattr(args, KEEP_FLAGS[flag]):
        why = f"their runs are not here and {flag} did not keep them (it keeps what is asked for, in tables)"
        keep = "ask for them to keep them, or pass "
    else:
        why = "their runs are not here"
        keep = f"pass {flag} to keep them, or " if flag else "pass "
    count = f"{len(lost)} value{'' if len(lost) == 1 else 's'}"
    return (
        f"{path}: this write would drop {count} it records ({shown}): {why}; {keep}--overwrite to drop them"
    )


def dropped_values(earlier: Any, results: Any) -> list[str]:
    """The paths (``key/key/...``) of the finite numbers in ``earlier`` that ``results`` lacks."""
    now = json.loads(json.dumps(results))  # the keys as the file will have them
    have = {path for path, value in _leaves(now) if _is_value(value)}
    return ["/".join(path) for path, value in _leaves(earlier) if _is_value(value) and path not in have]


def _leaves(tree: Any, path: tuple[str, ...] = ()) -> Iterable[tuple[tuple[str, ...], Any]]:
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from _leaves(value, (*path, str(key)))
    else:
        yield path, tree


def _is_value(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and bool(np.isfinite(value))


def per_round_mb(rows: Iterable[Row], key: str, unit: float = 1e6) -> float:
    """The mean of ``key`` (bytes) over the trained rounds, in units of ``unit`` bytes."""
    return float(np.mean([row[key] for row in trained_rows(rows)])) / unit


# ---------------------------------------------------------------- over seeds
def mean_std(values: Iterable[float]) -> tuple[float, float]:
    data = list(values)
    return float(np.mean(data)), float(np.std(data))


def over_seeds(key: str, by_seed: Mapping[str, float]) -> dict[str, Any]:
    """``{key: mean, key_std: std, key_by_seed: {seed: value}}`` (seeds in numeric order); {} for none."""
    if not by_seed:
        return {}
    ordered = {seed: float(by_seed[seed]) for seed in sorted(by_seed, key=int)}
    mean, std = mean_std(ordered.values())
    return {key: mean, f"{key}_std": std, f"{key}_by_seed": ordered}


def finals(run_dirs: Iterable[Path], metric: str | None = None) -> dict[str, Row]:
    """Seed -> the last row after training began that evaluated ``metric`` (any evaluation: None), of
    each run of ``run_dirs`` that finished; an unfinished run (still going, or stopped) is no seed."""
    found = {seed_of(d): last_evaluated(finished_rows(d), metric) for d in run_dirs}
    return {seed: row for seed, row in found.items() if row is not None}


def seed_values(
    evaluations: Mapping[str, Mapping[str, Any]], keys: Iterable[str], scale: float = 1.0
) -> dict[str, Any]:
    """`over_seeds` of each of ``keys`` over ``evaluations`` (seed -> evaluation), times ``scale``; a
    seed whose evaluation lacks a key does not count for it, a key no seed has is left out."""
    out: dict[str, Any] = {}
    for key in keys:
        out |= over_seeds(key, {seed: scale * e[key] for seed, e in evaluations.items() if key in e})
    return out


def plus_minus(mean: float, std: float | None = None, digits: int = 2) -> str:
    return f"{mean:.{digits}f}" + ("" if std is None else f" ± {std:.{digits}f}")


def cell(values: Mapping[str, float] | Iterable[float] | None, digits: int = 2, scale: float = 1.0) -> str:
    """``mean ± std`` of ``values`` (by seed, or a list) times ``scale``; the mean alone for one value,
    ``-`` for none."""
    data = list(values.values() if isinstance(values, Mapping) else values or [])
    if not data:
        return "-"
    mean, std = mean_std(scale * value for value in data)
    return plus_minus(mean, std if len(data) > 1 else None, digits)


def seeds_text(count: int | str) -> str:
    return f"{count} seed{'' if str(count) == '1' else 's'}"


def earlier_results(stem: Path) -> dict[str, Any]:
    """The per-row results of a table's previous write (``<stem>.json``), or {} when there is none."""
    path = sibling(stem, ".json")
    if not path.is_file():
        return {}
    try:
        results = json.loads(path.read_text())["results"]
    except (ValueError, KeyError, TypeError) as error:
        message = f"{path}: not a table's results file ({error}); move it away or drop --keep-earlier"
        raise SystemExit(message) from error
    return results if isinstance(results, dict) else {}


def keep_earlier_rows(results: dict[str, dict[str, Any]], stem: Path) -> list[str]:
    """``--keep-earlier`` for tables kept row by row: a row none of whose runs is in ``--runs-dir`` (made
    on another machine) takes the value the previous ``<stem>.json`` recorded for it, whole (its seeds
    are not mixed with new ones); returns the rows so kept."""
    earlier = earlier_results(stem)
    kept = [
        key
        for key, result in results.items()
        if not result.get("seeds") and earlier.get(key, {}).get("seeds")
    ]
    for key in kept:
        results[key] = earlier[key]
    return kept


def fill_seeds(here: dict[str, float], earlier: Mapping[str, Any], wanted: Iterable[str]) -> list[str]:
    """The one way a table keeps an earlier seed: add to ``here`` (seed -> value, read from runs here)
    each seed of ``wanted`` it lacks that ``earlier`` (seed -> value, from the previous results file)
    has; a seed here is never replaced. Returns the seeds so added, in ``wanted``'s order."""
    added = [seed for seed in wanted if seed not in here and seed in earlier]
    here.update({seed: float(earlier[seed]) for seed in added})
    return added


def fill_cells(
    here: dict[str, dict[str, dict[str, float]]],
    earlier: Mapping[str, Any],
    wanted: Iterable[str],
    groups: Iterable[str] | None = None,
) -> dict[str, list[str]]:
    """`fill_seeds` over a table kept as group -> column -> seed -> value (a row's cells, a round's):
    every cell of ``earlier`` (of the groups named in ``groups``; default all) fills the same cell of
    ``here``, created where the seeds it adds are its first. Returns group -> the seeds so added (in
    numeric order; groups that added none left out)."""
    asked, named = list(wanted), None if groups is None else set(groups)
    kept: dict[str, set[str]] = {}
    for group, cells in earlier.items():
        if (named is not None and group not in named) or not isinstance(cells, dict):
            continue
        for column, by_seed in cells.items():
            if not isinstance(by_seed, dict):
                continue
            cell = dict(here.get(group, {}).get(column, {}))
            added = fill_seeds(cell, by_seed, asked)
            if added:
                here.setdefault(group, {})[column] = cell
                kept.setdefault(group, set()).update(added)
    return {group: sorted(seeds, key=int) for group, seeds in kept.items()}


def seed_slice(values: Mapping[str, Any], seed: str) -> dict[str, Any]:
    """One seed's values out of a results entry: ``<key>_by_seed[seed]`` as ``key``, for each such key
    that has the seed (the reader for a seed kept from a file that recorded several)."""
    return {
        key.removesuffix("_by_seed"): by_seed[seed]
        for key, by_seed in values.items()
        if key.endswith("_by_seed") and isinstance(by_seed, dict) and seed in by_seed
    }


def keep_earlier_seeds(
    results: dict[str, dict[str, Any]], stem: Path, wanted: Iterable[int | str], skip: Iterable[str] = ()
) -> dict[str, list[str]]:
    """``--keep-earlier`` seed by seed, for the rows of ``results`` (not those in ``skip``) that have a
    run here: a seed in ``wanted`` with no value here takes, in every per-seed value of the row
    (``<key>_by_seed``), the one the previous ``<stem>.json`` recorded; each such key's mean and std are
    recomputed (`over_seeds`) and ``seeds`` counts the row's seeds after the merge. A seed with a run
    here is read from it, never from the file. Returns row -> the seeds so kept (rows that kept none
    are left out)."""
    earlier = earlier_results(stem)
    asked, skipped = [str(seed) for seed in wanted], set(skip)
    kept: dict[str, list[str]] = {}
    for key, result in results.items():
        before = earlier.get(key, {})
        if key in skipped or not result.get("seeds") or not isinstance(before, dict):
            continue
        taken: set[str] = set()
        for name, values in before.items():
            if not name.endswith("_by_seed") or not isinstance(values, dict):
                continue
            here = dict(result.get(name, {}))
            extra = fill_seeds(here, values, asked)
            if extra:
                result |= over_seeds(name.removesuffix("_by_seed"), here)
                taken |= set(extra)
        if taken:
            everyone = {seed for name, v in result.items() if name.endswith("_by_seed") for seed in v}
            result["seeds"] = len(everyone)
            kept[key] = sorted(taken, key=int)
    return kept


def kept_seeds_note(kept: Mapping[str, list[str]]) -> str:
    """The line a table adds for the seeds ``keep_earlier_seeds`` kept, per row under the name given."""
    if not kept:
        return ""
    rows = "; ".join(f"{name}: {', '.join(seeds)}" for name, seeds in kept.items())
    return f"\n\nSeeds kept from the previous results file (their runs not here, `--keep-earlier`): {rows}.\n"


def kept_rows_note(names: list[str]) -> str:
    """The line a table adds for the rows ``keep_earlier_rows`` kept, each under the name given."""
    if not names:
        return ""
    rows = ", ".join(names)
    return f"\n\nKept from the previous results file (no run of theirs here, `--keep-earlier`): {rows}.\n"


def carried_seeds(earlier: dict[str, Any], key: str, wanted: Iterable[str], done: Iterable[str]) -> list[str]:
    """The seeds asked for that have no finished run here but a value of ``key`` in ``earlier``."""
    have = set(done)
    return [seed for seed in wanted if seed not in have and seed in earlier.get(f"{key}_by_seed", {})]


# ---------------------------------------------------------------- orderings
def _rounded(values: Iterable[float]) -> list[float]:
    # equal means of fractions must compare equal whatever order float summed them in
    return [round(float(value), 12) for value in values]


def rises(values: Sequence[float], strict: bool = True) -> bool:
    """Whether ``values`` rise from first to last (``<``, or ``<=`` with ``strict=False``), rounded."""
    pairs = itertools.pairwise(_rounded(values))
    return all(a < b for a, b in pairs) if strict else all(a <= b for a, b in pairs)


def verdict(means: Sequence[float], strict: bool = True) -> str:
    """Whether the paper's ordering, ``means`` rising, holds: "tie" when every rounded mean is the same
    (for ``<`` and ``<=`` alike: nothing separates the rows), else "holds" or "does not hold"."""
    if len(set(_rounded(means))) == 1:
        return "tie"
    return "holds" if rises(means, strict) else "does not hold"


def common_seeds(columns: Sequence[Mapping[str, float]]) -> list[str]:
    """The seeds every column (seed -> value) has, in numeric order."""
    if not columns:
        return []
    return sorted(set(columns[0]).intersection(*columns[1:]), key=int)


def seeds_holding(columns: Sequence[Mapping[str, float]], strict: bool = True) -> tuple[int, int]:
    """Of the seeds every column has: in how many the values rise from the first column to the last,
    and how many there are."""
    seeds = common_seeds(columns)
    return sum(rises([column[seed] for column in columns], strict) for seed in seeds), len(seeds)


@dataclass(frozen=True)
class Verdict:
    """A claim that values rise from the first column to the last, checked: ``verdict`` on the means
    ("holds", "does not hold" or "tie"), and in how many of the ``seeds`` every column has it holds."""

    means: tuple[float, ...]
    verdict: str
    holding: int
    seeds: int


def on_common_seeds(columns: Sequence[Mapping[str, float]]) -> tuple[list[dict[str, float]], str]:
    """``columns`` (seed -> value each) cut to the seeds they all have, and a note naming those seeds when
    a column had others (the rows' runs were made at different times): rows are compared seed by seed."""
    both = common_seeds(columns)
    cut = [{seed: values[seed] for seed in both} for values in columns]
    if not both or all(len(values) == len(both) for values in columns):
        return cut, ""
    which = f"seed {both[0]}" if len(both) == 1 else f"seeds {', '.join(both)}"
    return cut, f" (on {which}, which every row compared has)"


def check(
    columns: Sequence[Mapping[str, float]], means: Sequence[float] | None = None, strict: bool = True
) -> Verdict:
    """Whether ``columns`` (seed -> value each, from the row claimed lowest to the highest) rise: on
    ``means`` (default: each column's mean over its seeds) and seed by seed (`seeds_holding`)."""
    shown = tuple(means) if means is not None else tuple(mean_std(c.values())[0] for c in columns)
    holding, seeds = seeds_holding(columns, strict)
    return Verdict(shown, verdict(shown, strict), holding, seeds)


# ---------------------------------------------------------------- notes closing a table
def closing_notes(
    dirs: Mapping[Any, Iterable[Path]],
    stem: Path,
    args: argparse.Namespace,
    *,
    kept_rows: list[str] | None = None,
    kept_seeds: Mapping[str, list[str]] | None = None,
) -> str:
    """What closes a table's .md: the rows and seeds ``--keep-earlier`` kept (`kept_rows_note`,
    `kept_seeds_note`, each under the name given) and the replies the servers of the runs of ``dirs``
    (row -> run directories) rejected, those of runs not here from the previous ``<stem>.md`` with
    ``--keep-earlier``."""
    keep = getattr(args, "keep_earlier", False)
    runs = (run_dir for row_dirs in dirs.values() for run_dir in row_dirs)
    rejected = rejected_note(runs, earlier=stem if keep else None)
    return kept_rows_note(kept_rows or []) + kept_seeds_note(kept_seeds or {}) + rejected


# ---------------------------------------------------------------- rendering from a results file
# What a table's .md holds that its .json does not: notes on the runs found (kept from an earlier file,
# rejected replies). They close the .md; --render keeps them as the .md beside the .json has them.
RUN_NOTES = (
    "\n\nKept from the previous results file",
    "\n\nSeeds kept from the previous results file (their runs not here",
    "\n\n" + REJECTED_HEAD,
)


@dataclass(frozen=True)
class Recorded:
    """A table as its results file recorded it: the options of its command, the config they load, its
    numbers, the command, and the .md written beside it ("" for none)."""

    args: argparse.Namespace
    cfg: Any
    results: Any
    command: str
    markdown: str


Renderer = Callable[[Recorded], str]


def stamp_of(recorded: Recorded) -> str | None:
    """The time the .md beside the results file says it was made (after its command); None for none."""
    head = f"`{recorded.command}` — "
    line = next((line for line in recorded.markdown.splitlines() if line.startswith(head)), None)
    return None if line is None else line.removeprefix(head)


def run_notes(markdown: str) -> str:
    """The notes that close a table's .md (from the first of `RUN_NOTES` on); "" for none."""
    found = [markdown.find(head) for head in RUN_NOTES if head in markdown]
    return markdown[min(found) :] if found else ""


def render(path: Path, parser: argparse.ArgumentParser, renderers: Mapping[str, Renderer], out: Path) -> Path:
    """``--render``: rewrite the .md of the results file ``path`` into the directory ``out``, from the
    file's numbers alone. Its recorded command gives the options (parsed by ``parser``); the renderer is
    the one of ``renderers`` (file name prefix -> renderer) whose prefix is the longest that the file's
    name starts with. Nothing is run and no run directory is read; the notes on runs that close the .md
    beside it are kept as they are (`run_notes`)."""
    prefixes = [prefix for prefix in renderers if path.name.startswith(prefix)]
    if not prefixes:
        raise SystemExit(f"{path}: no table of this script is named so (one of {', '.join(renderers)}*)")
    record = json.loads(path.read_text())
    command = str(record["command"])
    try:
        args = parser.parse_args(shlex.split(command)[2:])  # after "python <script>"
    except SystemExit as error:
        raise SystemExit(f"{path}: its command no longer parses (above): {command}") from error
    if args.config is not None and not args.config.is_absolute():  # as given in the checkout's root
        args.config = RESULTS_DIR.parents[1] / args.config
    before = path.with_suffix(".md")
    markdown = before.read_text() if before.is_file() else ""
    recorded = Recorded(args, load_config(args), record["results"], command, markdown)
    try:
        text = renderers[max(prefixes, key=len)](recorded) + run_notes(markdown)
    except (KeyError, TypeError, ValueError) as error:
        why = f"{type(error).__name__}: {error}"
        raise SystemExit(f"{path}: these results lack what the table shows today ({why})") from error
    target = out / before.name
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text if text.endswith("\n") else text + "\n")
    return target
