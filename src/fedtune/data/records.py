"""The one record type every loader produces and every consumer reads."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

NO_LABEL = -1
CHOICE_FIELDS = ("choices", "label")
ROW_FIELDS = ("instruction", "input", "output", "category", "id", *CHOICE_FIELDS)
"""The fields a data row may have (Alpaca names); ``data.columns`` renames a file's columns to these."""


@dataclass(frozen=True)
class Record:
    """One instruction example (Alpaca / Dolly shaped).

    ``instruction`` is the task, ``input`` optional context, ``output`` the reference
    response, ``category`` the label used for non-IID partitioning and per-category scores.
    For classification data ``output`` is the class label.

    A multiple-choice record also has ``choices`` (two or more distinct texts) and ``label``, the
    index of the right one; its ``output`` is that choice's text, so supervised fine-tuning trains
    on the answer that ``acc`` / ``acc_norm`` score. Other records keep ``choices == ()`` and
    ``label == NO_LABEL``.
    """

    instruction: str
    output: str
    input: str = ""
    category: str = "general"
    id: str = ""
    choices: tuple[str, ...] = ()
    label: int = NO_LABEL

    def __post_init__(self) -> None:
        if not self.choices:
            if self.label != NO_LABEL:
                raise ValueError(f"record {self.id!r}: label {self.label} without choices")
            return
        if len(self.choices) < 2 or len(set(self.choices)) != len(self.choices):
            raise ValueError(f"record {self.id!r}: choices must be two or more distinct texts")
        if not 0 <= self.label < len(self.choices):
            raise ValueError(f"record {self.id!r}: label {self.label} is not an index of its choices")

    @property
    def is_multiple_choice(self) -> bool:
        return bool(self.choices)

    def to_dict(self) -> dict[str, Any]:
        """The record as JSON-ready fields; the choice fields only on multiple-choice records.

        Leaving them out elsewhere keeps every other record's dict, and so the partition hash
        pinned by a run (``fingerprint.partition_sha256``), what it was before they existed.
        """
        fields = asdict(self)
        if not self.choices:
            for name in CHOICE_FIELDS:
                del fields[name]
        else:
            fields["choices"] = list(self.choices)
        return fields

    @classmethod
    def from_dict(cls, fields: Mapping[str, Any]) -> Record:
        """The inverse of ``to_dict`` (``choices`` may be any sequence of strings)."""
        values = dict(fields)
        if "choices" in values:
            values["choices"] = tuple(values["choices"])
        return cls(**values)


class DataError(ValueError):
    """Malformed data: the message names the file, line and field."""
