"""Tables for ``fedtune align``: how well one vocabulary maps onto another, and one text's alignment."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from rich.table import Table

from fedtune.align.tokens import display_token
from fedtune.align.vocab import VocabMapStats

HISTOGRAM_ROWS = 10


def _share(count: int, total: int) -> str:
    return f"{count:,} ({100 * count / max(total, 1):.1f}%)"


def vocab_summary(source: str, target: str, stats: VocabMapStats, cached: bool) -> Table:
    table = Table(title=f"vocabulary map {source} -> {target}")
    table.add_column("")
    table.add_column("value", justify="right")
    when = "read from the cache" if cached else "computed"
    for label, value in (
        ("source tokens", f"{stats.num_source:,}"),
        ("target tokens", f"{stats.num_target:,}"),
        ("exact (distance 0)", _share(stats.exact, stats.num_source)),
        ("near (distance 1-2)", _share(stats.near, stats.num_source)),
        ("far (distance 3+)", _share(stats.far, stats.num_source)),
        (f"seconds ({when})", f"{stats.seconds:.2f}"),
    ):
        table.add_row(label, value)
    return table


def distance_histogram(stats: VocabMapStats) -> Table:
    """Source tokens per edit distance to their target; the tail in one row."""
    table = Table(title="edit distance to the mapped target")
    table.add_column("distance", justify="right")
    table.add_column("tokens", justify="right")
    for distance in range(HISTOGRAM_ROWS):
        table.add_row(str(distance), _share(stats.histogram.get(distance, 0), stats.num_source))
    tail = sum(count for distance, count in stats.histogram.items() if distance >= HISTOGRAM_ROWS)
    table.add_row(f"{HISTOGRAM_ROWS}+", _share(tail, stats.num_source))
    return table


def mapping_examples(
    source_strings: Sequence[str], target_strings: Sequence[str], vmap: np.ndarray, ids: Sequence[int]
) -> Table:
    table = Table(title="examples")
    for column in ("source id", "source token", "target id", "target token"):
        table.add_column(column)
    for source_id in ids:
        target_id = int(vmap[source_id])
        table.add_row(
            str(source_id),
            repr(display_token(source_strings[source_id])),
            str(target_id),
            repr(display_token(target_strings[target_id])),
        )
    return table


def alignment_table(
    source: str,
    target: str,
    source_strings: Sequence[str],
    target_strings: Sequence[str],
    path: Sequence[tuple[int, int]],
    match: np.ndarray,
) -> Table:
    """One row per step of the path; 1:1 matches (what `project_topk` transfers) are marked."""
    table = Table(title=f"alignment {source} -> {target} (1:1: both appear once on the path)")
    for column in ("source pos", source, "target pos", target, "1:1"):
        table.add_column(column)
    for i, j in path:
        table.add_row(
            str(i),
            repr(display_token(source_strings[i])),
            str(j),
            repr(display_token(target_strings[j])),
            "yes" if match[j] == i else "",
        )
    return table
