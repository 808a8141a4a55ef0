"""A table's markdown layout, declared: a list of `Column`, each a header and how a row becomes its cell;
`table` lays rows out under them. A script names its columns once and fills them from its results,
instead of building a header list and, apart from it, each row's cells in the same order.

    columns = [Column("method", lambda r: LABELS[r.key]), Column("seeds", lambda r: r.seeds)]
    text = table(columns, rows)

A column that stands for several (one per test set, one per model) is a list comprehension of
`Column`. The formatters (`number`, `mean_std`; `experiments.tables.cell` for values by seed) are the cells
the tables share.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from bench.common import markdown_table

from experiments.tables.aggregate import cell, plus_minus

Row = TypeVar("Row")
Entry = tuple[str, dict[str, Any]]  # the row most tables lay out: a results key and its values


@dataclass(frozen=True)
class Column(Generic[Row]):
    """A column of a table: its ``header``, and ``cell``, what a row shows under it (written as ``str()``
    of it: a formatter says how many digits a number gets)."""

    header: str
    cell: Callable[[Row], Any]


def table(columns: Sequence[Column[Row]], rows: Iterable[Row]) -> str:
    """The markdown table of ``rows`` under ``columns``: a header line, its rule, a line per row."""
    cells = [[str(column.cell(row)) for column in columns] for row in rows]
    return markdown_table([column.header for column in columns], cells)


def number(value: float | None, digits: int = 2, suffix: str = "") -> str:
    """``value`` to ``digits`` decimals with ``suffix``; ``-`` for None."""
    return "-" if value is None else f"{value:.{digits}f}{suffix}"


def mean_std(metrics: Mapping[str, Any], key: str, digits: int = 4) -> str:
    """``metrics[key]``, ``± metrics[key_std]`` where there is one; ``-`` where there is no ``key``."""
    return plus_minus(metrics[key], metrics.get(f"{key}_std"), digits) if key in metrics else "-"


def seeds_cell(result: Mapping[str, Any], key: str, scale: float = 1.0, seeds: int = 0) -> str:
    """``result``'s values of ``key`` by seed as mean ± std (`experiments.tables.cell`) times ``scale``,
    with ``(n=<its seeds>)`` where a row has other than the table's ``seeds`` (0: never); ``-`` without."""
    if key not in result:
        return "-"
    count = f" (n={result['seeds']})" if seeds and result.get("seeds") != seeds else ""
    return cell(result[f"{key}_by_seed"], 2, scale) + count


def value(header: str, key: str, digits: int = 2) -> Column[Entry]:
    """A column of an `Entry`'s ``key``, to ``digits`` decimals."""
    return Column(header, lambda entry: number(entry[1][key], digits))


def over_seeds(header: str, key: str, digits: int = 1, scale: float = 1.0) -> Column[Entry]:
    """A column of an `Entry`'s ``<key>_by_seed`` as mean ± std (`experiments.tables.cell`)."""
    return Column(header, lambda entry: cell(entry[1][f"{key}_by_seed"], digits, scale))


SEEDS: Column[Entry] = Column("seeds", lambda entry: entry[1]["seeds"])
