"""Markdown tables: a generic formatter and the partition table shown by ``fedtune data stats``."""

from __future__ import annotations

import math
import re

from fedtune.report.io import CategoryCounts

MISSING = "–"
NOT_RECORDED = "n/a"
"""A cell for a quantity the run's files do not record (as opposed to one that does not apply)."""
NUMBER = re.compile(r"[+-]?[\d,]*\.?\d+(e[+-]?\d+)?|[+-]?(inf|nan)")


def format_cell(value: object) -> str:
    """One table cell: floats to 4 significant digits, large numbers with thousands separators."""
    if value is None:
        return MISSING
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return _format_float(value)
    return str(value).replace("|", "\\|").replace("\n", " ")


def _format_float(value: float) -> str:
    if not math.isfinite(value):
        return str(value)
    magnitude = abs(value)
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if 0 < magnitude < 1e-3:
        return f"{value:.2e}"
    return f"{value:.4g}"


def format_delta(value: float | None) -> str:
    """A signed difference, so an improvement and a regression read differently at a glance."""
    if value is None:
        return MISSING
    return "+" + _format_float(value) if value >= 0 else _format_float(value)


def markdown_table(headers: list[str], rows: list[list[object]]) -> str:
    """A GitHub markdown table, padded so it also reads well as plain text.

    Columns whose values are all numbers are right-aligned.
    """
    cells = [[format_cell(value) for value in row] for row in rows]
    for number, row in enumerate(cells):
        if len(row) != len(headers):
            raise ValueError(f"row {number} has {len(row)} cells, expected {len(headers)}")
    widths = [max([len(header)] + [len(row[i]) for row in cells]) for i, header in enumerate(headers)]
    numeric = [_is_numeric_column([row[i] for row in cells]) for i in range(len(headers))]
    lines = [_table_line(headers, widths, numeric)]
    lines.append("| " + " | ".join(_rule(w, right) for w, right in zip(widths, numeric, strict=True)) + " |")
    lines.extend(_table_line(row, widths, numeric) for row in cells)
    return "\n".join(lines) + "\n"


def _is_numeric_column(cells: list[str]) -> bool:
    present = [cell for cell in cells if cell not in (MISSING, NOT_RECORDED)]
    return bool(present) and all(NUMBER.fullmatch(cell) for cell in present)


def _rule(width: int, right_aligned: bool) -> str:
    return "-" * (width - 1) + ":" if right_aligned else "-" * width


def _table_line(cells: list[str], widths: list[int], numeric: list[bool]) -> str:
    padded = [c.rjust(w) if right else c.ljust(w) for c, w, right in zip(cells, widths, numeric, strict=True)]
    return "| " + " | ".join(padded) + " |"


def natural_sort_key(name: str) -> tuple[tuple[int, int | str], ...]:
    """Orders ``client_2`` before ``client_10``."""
    parts = re.split(r"(\d+)", name)
    return tuple((0, int(part)) if part.isdigit() else (1, part) for part in parts if part)


def categories_of(counts: CategoryCounts) -> list[str]:
    """Every category any client holds, largest overall first."""
    totals: dict[str, int] = {}
    for per_category in counts.values():
        for category, n in per_category.items():
            totals[category] = totals.get(category, 0) + n
    return sorted(totals, key=lambda category: (-totals[category], category))


def partition_table(counts: CategoryCounts) -> str:
    """Clients x categories example counts, with a total per client and per category."""
    categories = categories_of(counts)
    clients = sorted(counts, key=natural_sort_key)
    rows: list[list[object]] = []
    for client in clients:
        per_category = [counts[client].get(category, 0) for category in categories]
        rows.append([client, *per_category, sum(per_category)])
    column_totals = [sum(counts[client].get(category, 0) for client in clients) for category in categories]
    rows.append(["**total**", *column_totals, sum(column_totals)])
    return markdown_table(["client", *categories, "total"], rows)
