"""Keeping earlier results: ``--keep-earlier`` takes what has no run here from the table's previous ``.json``,
a row whole (`keep_earlier_rows`) or seed by seed (`fill_seeds`, the one way a seed is kept, and its
walks over a table's shapes: `fill_cells`, `keep_earlier_seeds`; `seed_slice` reads one seed back out);
a write that would drop a value the previous ``.json`` has is refused unless ``--overwrite`` says so
(`write_table`)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from bench.common import sibling
from bench.common import write_table as write_files

from experiments.tables.aggregate import over_seeds, seed_count, seeds_of

KEEP_FLAGS = {"--keep-earlier": "keep_earlier", "--add": "add"}  # what keeps a table's earlier values


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
        if not seed_count(result) and isinstance(earlier.get(key), dict) and seed_count(earlier[key])
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
        if key in skipped or not seed_count(result) or not isinstance(before, dict):
            continue
        elsewhere = seeds_of(before) - seeds_of(result)
        refuse_lr_mix(key, before, result.get("lr"), [seed for seed in asked if seed in elsewhere])
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
            result["seeds"] = len(seeds_of(result))
            kept[key] = sorted(taken, key=int)
    return kept


def refuse_lr_mix(
    row: str,
    earlier: Mapping[str, Any],
    lr: float | None,
    seeds: Iterable[str],
    config_lr: float | None = None,
) -> None:
    """Refuse carrying ``seeds`` from ``earlier`` (a row's entry in the previous results file) into the row
    now at ``lr`` when that file measured them at another lr: the row's mean would mix two lrs under one lr
    cell. A side that names no lr is at ``config_lr`` (a row without ``--row-lr`` trains at the config's
    lr). Nothing to refuse where no seed is carried or a side's lr is still unknown."""
    carried, before = list(seeds), earlier.get("lr")
    lr = config_lr if lr is None else lr
    before = config_lr if before is None else before
    if carried and lr is not None and before is not None and not np.isclose(float(before), lr):
        was = f"{float(before):g}"
        raise SystemExit(
            f"{row}: --keep-earlier would carry seeds {', '.join(carried)}, measured at lr {was}, into the "
            f"row now at lr {lr:g}; run those seeds here at lr {lr:g}, or ask for the row at lr {was}"
        )


def carried_seeds(earlier: dict[str, Any], key: str, wanted: Iterable[str], done: Iterable[str]) -> list[str]:
    """The seeds asked for that have no finished run here but a value of ``key`` in ``earlier``."""
    have = set(done)
    return [seed for seed in wanted if seed not in have and seed in earlier.get(f"{key}_by_seed", {})]
