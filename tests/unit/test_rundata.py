"""``prepare_data`` on a user's own file: the 10% held out for testing, and a warning when the test set
is too small to compare runs by."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from fedtune.config import load_config
from fedtune.rundata import FEW_TEST_RECORDS, prepare_data
from tests.conftest import TINY_CONFIG


def _user_file(path: Path, rows: int) -> Path:
    lines = [json.dumps({"instruction": f"Say {i}.", "input": "", "output": str(i)}) for i in range(rows)]
    path.write_text("\n".join(lines) + "\n")
    return path


def _prepare(data_file: Path) -> int:
    overrides = [
        f"data.dataset={data_file}",
        "data.partition.scheme=iid",
        "data.max_train_examples=null",
        "eval.max_examples=null",
    ]
    return len(prepare_data(load_config(TINY_CONFIG, overrides)).eval_records)


def test_a_small_user_file_warns_with_the_test_set_size(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Prepare: 40 rows, of which 10% (4) are held out for testing
    data_file = _user_file(tmp_path / "mine.jsonl", 40)

    # Execute
    with caplog.at_level(logging.WARNING, logger="fedtune.data"):
        held_out = _prepare(data_file)

    # Assert: the count, where it came from and how to get more
    assert held_out == 4
    (message,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "only 4 records" in message and "10% of data.dataset" in message
    assert "data.eval_dataset" in message


def test_a_large_enough_test_set_does_not_warn(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    data_file = _user_file(tmp_path / "mine.jsonl", 10 * FEW_TEST_RECORDS)

    with caplog.at_level(logging.WARNING, logger="fedtune.data"):
        held_out = _prepare(data_file)

    assert held_out == FEW_TEST_RECORDS
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]
