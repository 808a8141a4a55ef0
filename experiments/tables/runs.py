"""Rows and seeds, running and reading: a table's command line, the runs of its rows for each seed, and
what a finished run's metrics say.

- Rows and seeds (`plan`): a row's run for seed ``s`` is ``--runs-dir/<config name>/<row>-s<s>``, its
  overrides ``--set`` first, then the row's own (which win), then ``seed=<s>``; the seed is the name's
  part after the last ``-s``.
- Running (`start`, `run`): ``python -m fedtune run <config> <overrides> -o <run dir>`` in a subprocess of
  its own (a crash or an out-of-memory kill loses one run), its output appended to ``<run dir>.log``; a
  run with checkpoints is resumed, a finished one is skipped. ``--jobs`` runs at once, one thread each.
- Each row at its own lr (``--row-lr ROW=LR``: `row_lr_option`, `row_lrs`, `at_own_lr`): the named rows
  train at their lr, in run directories ``<row>-lr<lr>-s<seed>``; `run_lr` reads the lr a run trained at
  back from its saved config, so a table can say which lr each row used.
- Reading: a run counts once it has finished (its last metrics row is the config's last round). Metrics
  are read through ``fedtune.report.io.read_metrics`` (a round re-run after a resume counts once).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from bench.common import sibling

RESULTS_DIR = Path(__file__).resolve().parents[1] / "results"
Row = dict[str, Any]


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
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    logged(command, sibling(run_dir, ".log"), run_dir, threads=threads)  # not with_suffix: "s0.33"


def logged(command: Sequence[str], log: Path, what: Path, *, threads: int | None = 1) -> None:
    """Run ``command`` (a fedtune subprocess for ``what``) with its output appended to ``log``, at
    ``threads`` OpenMP/MKL threads (None: the default); an error naming the log if it fails."""
    print(f"{' '.join(command)}  (log: {log})", flush=True)
    env = dict(os.environ)
    if threads is not None:
        env |= {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    with open(log, "a") as handle:
        code = subprocess.run(command, env=env, stdout=handle, stderr=subprocess.STDOUT).returncode
    if code != 0:
        raise RuntimeError(f"{what}: fedtune exited with {code}; see {log}")


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


def row_lr_option(parser: argparse.ArgumentParser, example: str) -> None:
    """``--row-lr ROW=LR ...`` on a table's command line (``example``: one entry, e.g. ``fedot=0.01``)."""
    parser.add_argument(
        "--row-lr",
        nargs="+",
        default=[],
        metavar="ROW=LR",
        help=f"train these rows at their own lr (e.g. {example}: the lr sweep's best for the row); their "
        "run directories are <row>-lr<lr>-s<seed>, and the table's lr column says which lr each row used",
    )


def row_lrs(parser: argparse.ArgumentParser, given: Sequence[str], rows: Iterable[str]) -> dict[str, float]:
    """``--row-lr ROW=LR ...`` as row -> lr; a malformed entry, an unknown row or an lr <= 0 is a usage
    error naming the entry."""
    known = list(rows)
    out: dict[str, float] = {}
    for entry in given:
        row, _, value = entry.partition("=")
        try:
            lr = float(value)
        except ValueError:
            parser.error(f"--row-lr {entry!r}: give ROW=LR, e.g. {known[0]}=0.01")
        if row not in known:
            parser.error(f"--row-lr {entry!r}: unknown row {row!r} (rows: {', '.join(known)})")
        if not lr > 0:
            parser.error(f"--row-lr {entry!r}: the lr must be > 0")
        out[row] = lr
    return out


AtLr = Callable[[Sequence[str], float], list[str]]
"""A row's overrides and an lr -> the overrides that train the row at that lr."""


def train_lr(overrides: Sequence[str], lr: float) -> list[str]:
    """The usual `AtLr`: `lr_override` appended last (it wins over ``--set`` and the row's own keys)."""
    return [*overrides, lr_override(lr)]


def at_own_lr(
    rows: dict[str, list[str]],
    own: Mapping[str, float],
    row_of: Callable[[str], str],
    at_lr: AtLr = train_lr,
) -> dict[str, str]:
    """Give each table row (key -> overrides) whose row (``row_of(key)``) is in ``own`` its lr (``at_lr``:
    by default ``train.lr`` appended to its overrides, in place: after ``--set`` and the row's own keys, so
    it wins), and its runs' stem ``<key>-lr<lr>`` (returned, key -> stem, for `plan`), so runs at two lrs
    never mix."""
    stems = {}
    for key, overrides in rows.items():
        lr = own.get(row_of(key))
        if lr is not None:
            rows[key] = at_lr(overrides, lr)
            stems[key] = lr_stem(key, lr)
    return stems


def lr_stem(key: str, lr: float) -> str:
    """The stem of a row's runs at its own lr: ``<key>-lr<lr>``."""
    return f"{key}-lr{lr:g}"


# a seed's run directory: ``<key>-s<seed>``, or ``<key>-lr<lr>-s<seed>`` at the row's own lr (`lr_stem`)
SEED_RUN = re.compile(r"(?P<key>.+?)(?:-lr(?P<lr>\d[\d.e+-]*))?-s(?P<seed>\d+)")


def run_name_parts(name: str) -> tuple[str, float | None]:
    """A seed's run directory name's key and the lr it names (None: the config's lr); a name that is
    no seed's run is all key."""
    match = SEED_RUN.fullmatch(name)
    if match is None:
        return name, None
    return match["key"], None if match["lr"] is None else float(match["lr"])


def asked_lr(run_dirs: Iterable[Path]) -> float | None:
    """The lr a row's runs are asked at where their directories say it (`lr_stem` then ``-s<seed>``);
    None where they name none (the config's lr) or disagree."""
    lrs = {run_name_parts(Path(d).name)[1] for d in run_dirs}
    return lrs.pop() if len(lrs) == 1 else None


def lr_override(lr: float) -> str:
    """The override that trains a row at its own lr (append it last: it wins over ``--set``)."""
    return f"train.lr={lr}"


def saved_value(run_dir: Path, dotted_key: str) -> Any:
    """What the config a run saved (``config.yaml``) holds at ``dotted_key``, e.g. ``train.lr`` or
    ``_run.threads``; None where the run saved no config or its config has no such key."""
    from fedtune.report.io import config_value

    path = run_dir / "config.yaml"
    saved = yaml.safe_load(path.read_text()) if path.is_file() else None
    return config_value(saved if isinstance(saved, dict) else {}, dotted_key)


def run_lr(run_dir: Path) -> float | None:
    """The learning rate a run trained at, from the config it saved (None: no config saved with one)."""
    lr = saved_value(run_dir, "train.lr")
    return None if lr is None else float(lr)


def runs_lr(run_dirs: Iterable[Path]) -> dict[str, float | None]:
    """A row's ``lr`` entry, from the configs its runs saved: ``{"lr": lr}`` where they agree,
    ``{"lr": None}`` where they differ, ``{}`` where none saved one."""
    lrs = {lr for lr in map(run_lr, run_dirs) if lr is not None}
    if not lrs:
        return {}
    return {"lr": lrs.pop() if len(lrs) == 1 else None}


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


def per_round_mb(rows: Iterable[Row], key: str, unit: float = 1e6) -> float:
    """The mean of ``key`` (bytes) over the trained rounds, in units of ``unit`` bytes."""
    return float(np.mean([row[key] for row in trained_rows(rows)])) / unit


def finals(run_dirs: Iterable[Path], metric: str | None = None) -> dict[str, Row]:
    """Seed -> the last row after training began that evaluated ``metric`` (any evaluation: None), of
    each run of ``run_dirs`` that finished; an unfinished run (still going, or stopped) is no seed."""
    found = {seed_of(d): last_evaluated(finished_rows(d), metric) for d in run_dirs}
    return {seed: row for seed, row in found.items() if row is not None}
