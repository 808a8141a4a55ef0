"""Values over seeds: a value ``key`` of a row is ``key`` (the mean), ``key_std`` (the sample std, ddof 1)
and ``key_by_seed``; a cell is ``mean ± sample std`` (the mean alone for one seed, ``-`` for none)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np


def mean_std(values: Iterable[float], ddof: int = 1) -> tuple[float, float]:
    """The mean and standard deviation of ``values``: the sample one (``ddof`` 1, the default: seeds are a
    sample of the runs one could make; 0.0 for a single value) or the population one (``ddof`` 0, what the
    tables made before the paired intervals recorded in their results files)."""
    data = list(values)
    if len(data) <= ddof:
        return float(np.mean(data)), 0.0
    return float(np.mean(data)), float(np.std(data, ddof=ddof))


def over_seeds(key: str, by_seed: Mapping[str, float]) -> dict[str, Any]:
    """``{key: mean, key_std: sample std, key_by_seed: {seed: value}}`` (seeds in numeric order); {} for
    none."""
    if not by_seed:
        return {}
    ordered = {seed: float(by_seed[seed]) for seed in sorted(by_seed, key=int)}
    mean, std = mean_std(ordered.values())
    return {key: mean, f"{key}_std": std, f"{key}_by_seed": ordered}


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


def cell(
    values: Mapping[str, float] | Iterable[float] | None, digits: int = 2, scale: float = 1.0, ddof: int = 1
) -> str:
    """``mean ± std`` of ``values`` (by seed, or a list) times ``scale`` (the sample std; ``ddof`` as
    `mean_std`); the mean alone for one value, ``-`` for none."""
    data = list(values.values() if isinstance(values, Mapping) else values or [])
    if not data:
        return "-"
    mean, std = mean_std((scale * value for value in data), ddof)
    return plus_minus(mean, std if len(data) > 1 else None, digits)


def seeds_text(count: int | str) -> str:
    return f"{count} seed{'' if str(count) == '1' else 's'}"


def seeds_of(entry: Mapping[str, Any]) -> set[str]:
    """The seeds any per-seed value (``<key>_by_seed``) of a results entry has."""
    return {
        seed
        for name, by_seed in entry.items()
        if name.endswith("_by_seed") and isinstance(by_seed, dict)
        for seed in by_seed
    }


def seed_count(entry: Mapping[str, Any]) -> int:
    """How many seeds a results entry has: the ``seeds`` it records, else the seeds its per-seed values
    have (a file written before its entries recorded the count)."""
    return int(entry["seeds"]) if "seeds" in entry else len(seeds_of(entry))


def fewer_seeds(result: Mapping[str, Any], asked: int) -> str:
    """`` (n seeds)`` for a cell measured on fewer seeds than asked (a search extended to more seeds only
    where its choice was close, or a cell kept from a previous file), else nothing."""
    have = seed_count(result)
    return f" ({seeds_text(have)})" if 0 < have < asked else ""


FEWER_SEEDS_NOTE = (
    "A cell with fewer seeds than asked names how many it has (the others were not run): its mean is over "
    "those alone."
)
