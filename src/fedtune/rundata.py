"""What a run reads: client partitions, test sets and the public set, all deterministic in the seed.

Above ``config`` and ``data``, below the algorithms and the runner: a client process derives the same test
sets from the config as the server does (test sets are not private), so both call ``prepare_data``.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field

from fedtune.config import ExperimentConfig
from fedtune.data.fingerprint import absolute_data_path
from fedtune.data.partition import partition_records, personal_split
from fedtune.data.records import DataError, Record

log = logging.getLogger("fedtune.data")
FEW_TEST_RECORDS = 20
"""A test set smaller than this gives metrics too noisy to compare runs by: the run warns."""


@dataclass
class RunData:
    clients: dict[str, list[Record]]
    eval_records: list[Record]
    public_records: list[Record]
    validation_records: list[Record] = field(default_factory=list)
    extra_eval: dict[str, list[Record]] = field(default_factory=dict)
    client_eval: dict[str, list[Record]] = field(default_factory=dict)
    """Each client's held-out split (``eval.personal``); empty otherwise."""


def _load(spec: str, split: str, cfg: ExperimentConfig) -> list[Record]:
    from fedtune.data.loaders import load_dataset_records

    # data.columns describes data.dataset's columns, not those of the other test sets
    columns = cfg.data.columns if spec == cfg.data.dataset else None
    return load_dataset_records(spec, split, format=cfg.data.format, schema=cfg.data.schema_, columns=columns)


def _subsample(records: list[Record], limit: int | None, seed: int) -> list[Record]:
    if limit is None or len(records) <= limit:
        return records
    order = list(range(len(records)))
    random.Random(seed).shuffle(order)
    return [records[i] for i in sorted(order[:limit])]


def _warn_if_few(eval_records: list[Record], eval_dataset: str | None) -> None:
    if len(eval_records) >= FEW_TEST_RECORDS:
        return
    source = (
        f"data.eval_dataset {eval_dataset!r}"
        if eval_dataset
        else "the 10% of data.dataset held out for testing"
    )
    log.warning(
        "the test set has only %d records (%s): its metrics will be noisy; give data.eval_dataset a "
        "file of its own with %d or more rows, or add rows to the data",
        len(eval_records),
        source,
        FEW_TEST_RECORDS,
    )


def prepare_data(cfg: ExperimentConfig) -> RunData:
    """Client partitions, the evaluation set and the public set, all deterministic in the seed."""
    from fedtune.data.builtin import list_builtin

    data = cfg.data
    builtin = {info.name: info for info in list_builtin()}
    train = _subsample(_load(data.dataset, "train", cfg), data.max_train_examples, cfg.seed)
    eval_spec = data.eval_dataset or data.dataset
    if eval_spec in builtin or data.eval_dataset:
        eval_records = _load(eval_spec, data.eval_split, cfg)
    else:
        # A single user file: hold out 10% of it (seeded) for evaluation.
        held = set(random.Random(cfg.seed).sample(range(len(train)), max(1, len(train) // 10)))
        eval_records = [r for i, r in enumerate(train) if i in held]
        train = [r for i, r in enumerate(train) if i not in held]
    _warn_if_few(eval_records, data.eval_dataset)
    eval_records = _subsample(eval_records, cfg.eval.max_examples, cfg.seed + 1)
    info = builtin.get(data.dataset)
    public = _load(data.dataset, "public", cfg) if info and "public" in info.splits else []
    validation = (
        _subsample(_load(data.dataset, "validation", cfg), cfg.eval.max_examples, cfg.seed + 2)
        if info and "validation" in info.splits
        else []
    )
    extra = {
        name: _subsample(_load(name, data.eval_split, cfg), cfg.eval.max_examples, cfg.seed + 1)
        for name in cfg.eval.extra_datasets
    }
    if cfg.fed.mode == "centralized":
        clients = {"central": train}
    else:
        part = data.partition
        clients = partition_records(
            train,
            scheme=part.scheme,
            num_clients=part.num_clients,
            by=part.by,
            alpha=part.alpha,
            classes_per_client=part.classes_per_client,
            min_partition_size=part.min_partition_size,
            seed=cfg.seed,
        )
    client_eval: dict[str, list[Record]] = {}
    if cfg.eval.personal:
        for cid in list(clients):
            clients[cid], client_eval[cid] = personal_split(
                clients[cid], data.holdout, cfg.seed, cid, data.eval_split
            )
        empty = sorted(cid for cid, held in client_eval.items() if not held)
        if empty and data.holdout > 0:  # with holdout 0 a method scores clients elsewhere (fedmkt.slm_eval)
            raise DataError(
                f"eval.personal: {len(empty)} client(s) hold too few records for a held-out split "
                f"(e.g. {empty[0]}, with {len(clients[empty[0]])}): lower data.partition.num_clients, raise "
                "data.max_train_examples or data.holdout, or set eval.personal: false"
            )
    return RunData(clients, eval_records, public, validation, extra, client_eval)


DATA_FINGERPRINT = "data_fingerprint.json"


def data_specs(cfg: ExperimentConfig) -> dict[str, str]:
    """Every dataset the run reads, by the config key that names it."""
    specs = {"data.dataset": cfg.data.dataset}
    if cfg.data.eval_dataset:
        specs["data.eval_dataset"] = cfg.data.eval_dataset
    specs.update({f"eval.extra_datasets[{i}]": name for i, name in enumerate(cfg.eval.extra_datasets)})
    return specs


def pin_data_paths(cfg: ExperimentConfig) -> None:
    """Make data file paths absolute, so a resume from another directory reads the same files."""
    cfg.data.dataset = absolute_data_path(cfg.data.dataset)
    if cfg.data.eval_dataset:
        cfg.data.eval_dataset = absolute_data_path(cfg.data.eval_dataset)
    cfg.eval.extra_datasets = [absolute_data_path(name) for name in cfg.eval.extra_datasets]
