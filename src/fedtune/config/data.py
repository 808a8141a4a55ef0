"""The ``data:`` section: the dataset, its prompt template, and its partition over the clients."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, field_validator

from fedtune.config.base import Section
from fedtune.data.records import ROW_FIELDS
from fedtune.suggest import closest


class PartitionConfig(Section):
    scheme: Literal["iid", "dirichlet", "pathological", "natural"] = "iid"
    """How the training data is split over clients."""
    num_clients: int = Field(4, ge=1)
    """Clients in the federation."""
    by: str = "category"
    """The record field that Dirichlet, pathological and natural partitions split by."""
    alpha: float = Field(0.5, gt=0)
    """The Dirichlet concentration (smaller: more skewed)."""
    classes_per_client: int = Field(2, ge=1)
    """Pathological partitions: categories per client."""
    min_partition_size: int = Field(1, ge=0)
    """Dirichlet partitions: the smallest partition a client may get."""


PERSONAL_SPLITS = ("test", "validation")
"""What ``data.eval_split`` may name with ``eval.personal``: the client's held-out records, or a
validation split carved from the records it trains on."""


class DataConfig(Section):
    dataset: str = "wordnet-instruct"
    """A built-in name (`fedtune data list`), a file: jsonl, json, csv, parquet or a Hugging Face dataset
    directory, or a Hugging Face Hub dataset id (`owner/name`, when no such file exists; its `train`
    split)."""
    format: Literal["auto", "jsonl", "json", "csv", "parquet", "hf"] = "auto"
    """The file format (`auto`: from the file name; `hf` for a hub id)."""
    schema_: Literal["auto", "alpaca", "dolly"] = Field("auto", alias="schema")
    """The record layout of a file: Alpaca (`instruction/input/output`) or Dolly
    (`instruction/context/response/category`)."""
    template: Literal["alpaca", "chat", "plain"] = "alpaca"
    """The prompt wrapper training and evaluation use."""
    max_length: int = Field(256, ge=8)
    """Tokens per example; longer examples are cut."""
    max_train_examples: int | None = Field(None, ge=1)
    """Use at most this many training records (a seeded sample)."""
    eval_dataset: str | None = None
    """Evaluate on this dataset instead of the training dataset's `eval_split` (e.g. `humaneval`)."""
    eval_split: str = "test"
    """The split the run evaluates on. With eval.personal, also the clients' split: `test` (each client's
    held-out records, data.holdout) or `validation` (the held-out records set aside unread, and
    data.holdout of the rest held out again: a search on validation never reads a test record)."""
    length_bucketing: bool = True
    """Batch examples of similar length together (less padding)."""
    holdout: float = Field(0.2, ge=0, lt=1)
    """With eval.personal: the fraction of each client's partition held out (seeded per client) for
    the client-side evaluation; the rest is what the client trains on."""
    columns: dict[str, str] = Field(default_factory=dict)
    """Renames data.dataset's columns before the schema applies: `{question: instruction, answer: output}`.
    A column renamed onto a name the file already has replaces that column (FlowerTune's medical set:
    `{input: instruction}` makes the question the instruction, its fixed instruction dropped). The
    same for the hub dataset and a local copy of it; data.eval_dataset and eval.extra_datasets are
    read as they are."""
    partition: PartitionConfig = PartitionConfig()

    @field_validator("columns")
    @classmethod
    def _columns_name_row_fields(cls, columns: dict[str, str]) -> dict[str, str]:
        for source, target in columns.items():
            if target not in ROW_FIELDS:
                close = closest(target, ROW_FIELDS)
                hint = f" (did you mean '{close}'?)" if close else ""
                raise ValueError(
                    f"column '{source}' -> '{target}': not a row field{hint}; valid: {', '.join(ROW_FIELDS)}"
                )
        targets = list(columns.values())
        repeated = sorted({target for target in targets if targets.count(target) > 1})
        if repeated:
            raise ValueError(f"two columns renamed to '{repeated[0]}'")
        return columns

    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True)
