"""Split training records over clients with flwr-datasets partitioners.

Schemes: ``iid`` (shuffled equal shards), ``dirichlet`` (Dir(alpha) over the ``by`` field, e.g.
category), ``pathological`` (each client gets ``classes_per_client`` values of ``by``) and
``natural`` (one client per distinct value of ``by``).
"""

from __future__ import annotations

import logging
import warnings
import zlib
from collections import Counter
from collections.abc import Sequence

import datasets
import numpy as np
from flwr_datasets.partitioner import (
    DirichletPartitioner,
    IidPartitioner,
    NaturalIdPartitioner,
    Partitioner,
    PathologicalPartitioner,
)

from fedtune.config.data import PERSONAL_SPLITS
from fedtune.data.records import DataError, Record

_INDEX = "_row"
log = logging.getLogger("fedtune.data")


_SETTING_KEYS = {
    "dirichlet": "see data.partition.alpha, data.partition.min_partition_size",
    "pathological": "see data.partition.classes_per_client",
}


def client_id(index: int) -> str:
    return f"c{index:02d}" if index < 100 else f"c{index}"


def _partitioner(
    scheme: str, num_clients: int, by: str, alpha: float, classes_per_client: int, min_size: int, seed: int
) -> Partitioner:
    if scheme == "iid":
        return IidPartitioner(num_partitions=num_clients)
    if scheme == "dirichlet":
        return DirichletPartitioner(
            num_partitions=num_clients,
            partition_by=by,
            alpha=alpha,
            min_partition_size=min_size,
            self_balancing=False,
            seed=seed,
        )
    if scheme == "pathological":
        return PathologicalPartitioner(
            num_partitions=num_clients,
            partition_by=by,
            num_classes_per_partition=classes_per_client,
            class_assignment_mode="first-deterministic",
            seed=seed,
        )
    if scheme == "natural":
        return NaturalIdPartitioner(partition_by=by)
    raise DataError(f"unknown partition scheme {scheme!r}; choose iid, dirichlet, pathological or natural")


def partition_records(
    records: Sequence[Record],
    *,
    scheme: str,
    num_clients: int,
    by: str = "category",
    alpha: float = 0.5,
    classes_per_client: int = 2,
    min_partition_size: int = 1,
    seed: int = 0,
) -> dict[str, list[Record]]:
    """Client id -> its records. Deterministic for a given seed; every client gets >= 1 record."""
    if not records:
        raise DataError("cannot partition an empty training set")
    if scheme != "natural" and len(records) < num_clients:
        raise DataError(
            f"{len(records)} training records cannot be spread over {num_clients} clients without data; "
            "lower data.partition.num_clients"
        )
    if by not in Record.__dataclass_fields__:
        raise DataError(f"data.partition.by: records have no field {by!r}")
    table = datasets.Dataset.from_dict(
        {_INDEX: list(range(len(records))), by: [str(getattr(rec, by)) for rec in records]}
    )
    if scheme == "iid":
        table = table.shuffle(seed=seed)
    values = len(set(table[by]))
    if scheme == "pathological" and classes_per_client > values:
        raise DataError(
            f"data.partition.classes_per_client={classes_per_client} but the data has only {values} "
            f"distinct '{by}' values: set data.partition.scheme=iid (or dirichlet) for data without "
            f"'{by}' labels, or lower data.partition.classes_per_client to {values}"
        )
    if scheme == "natural" and values == 1:
        only = table[by][0]
        raise DataError(
            f"data.partition.scheme natural needs records that differ in data.partition.by ('{by}'), but "
            f"every record has {by} = {only!r} (does the data have a '{by}' field?)"
        )
    partitioner = _partitioner(scheme, num_clients, by, alpha, classes_per_client, min_partition_size, seed)
    partitioner.dataset = table
    parts: dict[str, list[Record]] = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            for index in range(partitioner.num_partitions):
                rows = partitioner.load_partition(index)[_INDEX]
                parts[client_id(index)] = [records[i] for i in sorted(rows)]
        except ValueError as error:  # the partitioner could not satisfy the settings with this data
            raise DataError(
                f"data.partition (scheme {scheme}, {len(records)} records, num_clients {num_clients}, "
                f"{_SETTING_KEYS.get(scheme, 'num_clients')}): {error}"
            ) from None
    for warning in caught:
        if scheme == "pathological" and "will NOT be used" in str(warning.message):
            continue  # said below in the run's own terms
        log.info("partition: %s", str(warning.message).split(" If it is")[0])
    if scheme == "pathological":
        note = unused_values_note(sorted(set(table[by])), parts, by, classes_per_client)
        if note:
            log.info("partition: %s", note)
    empty = [cid for cid, part in parts.items() if not part]
    if empty:
        raise DataError(
            f"partition scheme {scheme!r} left clients {', '.join(empty)} without data; "
            "use fewer clients, more data or another scheme"
        )
    return parts


def unused_values_note(
    values: Sequence[str], parts: dict[str, list[Record]], by: str, classes_per_client: int
) -> str:
    """One line on the ``by`` values no client trains on, or "" when every value is used.

    flwr-datasets' pathological scheme (``first-deterministic``) gives client ``i`` the ``i``-th value in
    sorted order plus ``classes_per_client - 1`` more drawn with the seed; draws may coincide, so ``n``
    clients cover at most ``n * classes_per_client`` values and often fewer.
    """
    used = {str(getattr(rec, by)) for part in parts.values() for rec in part}
    unused = [value for value in values if value not in used]
    if not unused:
        return ""
    kind = "categories" if by == "category" else f"'{by}' values"
    return (
        f"{len(parts)} clients x {classes_per_client} {kind} each cover {len(values) - len(unused)} of "
        f"{len(values)} {kind}; not used for training: {', '.join(unused)} (see "
        "data.partition.classes_per_client)"
    )


def category_counts(parts: dict[str, list[Record]]) -> dict[str, dict[str, int]]:
    """Client id -> category -> number of records (the partition table)."""
    return {cid: dict(sorted(Counter(rec.category for rec in part).items())) for cid, part in parts.items()}


def holdout_split(
    records: Sequence[Record], fraction: float, seed: int, client: str, *, salt: int = 0x40
) -> tuple[list[Record], list[Record]]:
    """A client's partition split into (training, held-out) records, seeded by (seed, client).

    ``round(fraction * n)`` records are held out, at least one when ``fraction > 0`` and at most
    ``n - 1`` (a client always keeps something to train on); both parts keep the partition's order.
    Another ``salt`` draws another split of the same records.
    """
    if not 0 <= fraction < 1:
        raise ValueError(f"data.holdout must be in [0, 1), got {fraction}")
    count = len(records)
    held = 0 if fraction == 0 or count < 2 else min(count - 1, max(1, round(fraction * count)))
    rng = np.random.default_rng([seed, zlib.crc32(client.encode()), salt])
    chosen = set(rng.choice(count, size=held, replace=False).tolist()) if held else set()
    train = [r for i, r in enumerate(records) if i not in chosen]
    evaluation = [r for i, r in enumerate(records) if i in chosen]
    return train, evaluation


def personal_split(
    records: Sequence[Record], fraction: float, seed: int, client: str, split: str = "test"
) -> tuple[list[Record], list[Record]]:
    """A client's partition as (training, evaluation) records for ``eval.personal``.

    ``split="test"``: `holdout_split` (the held-out records). ``split="validation"``: the same held-out
    records are set aside unread, and ``fraction`` of what remains is held out again (seeded apart) as the
    client's validation split; the client trains on the rest. A search on validation (a learning rate)
    thus never reads a test record, at the cost of training on ``(1 - fraction)`` of its usual records.
    """
    if split not in PERSONAL_SPLITS:
        raise ValueError(
            f"data.eval_split with eval.personal must be one of {PERSONAL_SPLITS}, got {split!r}"
        )
    train, held = holdout_split(records, fraction, seed, client)
    if split == "test":
        return train, held
    return holdout_split(train, fraction, seed, client, salt=0x41)
