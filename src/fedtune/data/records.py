"""The one record type every loader produces and every consumer reads."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Record:
    """One instruction example (Alpaca / Dolly shaped).

    ``instruction`` is the task, ``input`` optional context, ``output`` the reference
    response, ``category`` the label used for non-IID partitioning and per-category scores.
    For classification data ``output`` is the class label.
    """

    instruction: str
    output: str
    input: str = ""
    category: str = "general"
    id: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class DataError(ValueError):
    """Malformed data: the message names the file, line and field."""
