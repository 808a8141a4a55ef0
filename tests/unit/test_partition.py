from __future__ import annotations

import logging

import pytest

from fedtune.data.partition import category_counts, partition_records
from fedtune.data.records import DataError, Record

RECORDS = [Record(f"q{i}", f"a{i}", category=f"cat{i % 8}", id=str(i)) for i in range(400)]


@pytest.mark.parametrize("scheme", ["iid", "dirichlet", "pathological"])
def test_partitions_are_disjoint_complete_and_seeded(scheme: str) -> None:
    parts = partition_records(RECORDS, scheme=scheme, num_clients=4, seed=3)
    ids = [rec.id for part in parts.values() for rec in part]
    assert len(ids) == len(set(ids))
    assert set(parts) == {"c00", "c01", "c02", "c03"}
    assert parts == partition_records(RECORDS, scheme=scheme, num_clients=4, seed=3)
    if scheme == "iid":
        assert len(ids) == 400


def test_pathological_gives_each_client_k_categories() -> None:
    counts = category_counts(partition_records(RECORDS, scheme="pathological", num_clients=4, seed=0))
    assert all(len(cats) == 2 for cats in counts.values())


def test_dirichlet_small_alpha_is_skewed() -> None:
    skewed = category_counts(partition_records(RECORDS, scheme="dirichlet", num_clients=4, alpha=0.1, seed=0))
    even = category_counts(partition_records(RECORDS, scheme="dirichlet", num_clients=4, alpha=100.0, seed=0))
    assert sum(len(c) for c in skewed.values()) < sum(len(c) for c in even.values())


def test_natural_is_one_client_per_category() -> None:
    counts = category_counts(partition_records(RECORDS, scheme="natural", num_clients=1))
    assert len(counts) == 8 and all(len(cats) == 1 for cats in counts.values())


def test_errors_name_the_problem() -> None:
    with pytest.raises(DataError, match="classes_per_client"):
        partition_records(RECORDS, scheme="pathological", num_clients=4, classes_per_client=9)
    with pytest.raises(DataError, match="no field"):
        partition_records(RECORDS, scheme="iid", num_clients=4, by="colour")
    with pytest.raises(DataError, match="empty"):
        partition_records([], scheme="iid", num_clients=4)
    with pytest.raises(DataError, match="without data"):
        partition_records(RECORDS[:3], scheme="iid", num_clients=4)


def test_a_partition_the_settings_cannot_make_names_the_keys() -> None:
    records = [Record(instruction=f"q{i}", output="a", category=f"c{i % 3}") for i in range(12)]
    with pytest.raises(
        DataError, match=r"data.partition \(scheme dirichlet.*data.partition.min_partition_size"
    ):
        partition_records(records, scheme="dirichlet", num_clients=6, min_partition_size=3)
    with pytest.raises(DataError, match=r"data.partition \(scheme pathological.*classes_per_client"):
        partition_records(records, scheme="pathological", num_clients=10, classes_per_client=2)


def test_natural_on_data_without_the_field_names_the_key() -> None:
    records = [Record(instruction=f"q{i}", output="a") for i in range(12)]
    with pytest.raises(DataError, match=r"data.partition.by \('category'\).*does the data have"):
        partition_records(records, scheme="natural", num_clients=4)


def test_pathological_on_data_without_categories_says_to_use_iid() -> None:
    # Prepare: a user file without 'category' gives every record the one category "general".
    records = [Record(instruction=f"q{i}", output="a") for i in range(12)]

    # Execute / Assert: the error names the key and the value that fixes it
    with pytest.raises(DataError, match=r"only 1 distinct 'category' values: set data.partition.scheme=iid"):
        partition_records(records, scheme="pathological", num_clients=4, classes_per_client=2)


def test_pathological_says_which_categories_go_unused(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="fedtune.data"):
        partition_records(RECORDS, scheme="pathological", num_clients=4, classes_per_client=2)
    messages = [record.getMessage() for record in caplog.records]
    assert messages == [
        "partition: 4 clients x 2 categories each cover 7 of 8 categories; not used for training: cat7 (see "
        "data.partition.classes_per_client)"
    ]


def test_pathological_that_uses_every_category_says_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="fedtune.data"):
        partition_records(RECORDS, scheme="pathological", num_clients=4, classes_per_client=5)
    assert caplog.records == []
