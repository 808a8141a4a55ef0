"""Resume trains on the data the run started on, or refuses, naming what changed."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

from fedtune.config import load_config
from fedtune.data.fingerprint import DataChanged
from fedtune.runner import resume_experiment
from tests.integration.helpers import ROOT, quiet_runner, stable

CONFIG = ROOT / "configs" / "test" / "fedit-tiny.yaml"


def write_dataset(path: Path, seed: int) -> None:
    rng = random.Random(seed)
    rows = [
        {
            "instruction": f"Say {rng.randint(0, 10**6)}.",
            "output": f"{rng.randint(0, 10**6)}",
            "category": f"c{i % 4}",
        }
        for i in range(64)
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


@pytest.fixture
def two_directories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    first, second = tmp_path / "first", tmp_path / "second"
    for directory, seed in ((first, 0), (second, 1)):
        directory.mkdir()
        write_dataset(directory / "train.jsonl", seed)  # same name, other rows
    monkeypatch.chdir(first)
    return first, second


def test_resume_from_another_directory_trains_on_the_same_file(
    two_directories: tuple[Path, Path], tmp_path: Path
) -> None:
    _, second = two_directories
    overrides = ["data.dataset=train.jsonl", "data.partition.scheme=iid"]
    cfg = load_config(CONFIG, [*overrides, "fed.rounds=2"])
    full = quiet_runner(load_config(CONFIG, overrides), tmp_path / "full").run()
    quiet_runner(load_config(CONFIG, [*overrides, "fed.rounds=1"]), tmp_path / "cut").run()
    config_text = (tmp_path / "cut" / "config.yaml").read_text()
    (tmp_path / "cut" / "config.yaml").write_text(
        config_text.replace("rounds: 1", f"rounds: {cfg.fed.rounds}")
    )

    os.chdir(second)
    resumed = resume_experiment(tmp_path / "cut", console=quiet_runner(cfg, tmp_path).console)

    assert stable(resumed) == stable(full)


def test_a_data_file_changed_since_the_run_started_is_an_error(
    two_directories: tuple[Path, Path], tmp_path: Path
) -> None:
    first, _ = two_directories
    cfg = load_config(CONFIG, ["data.dataset=train.jsonl", "data.partition.scheme=iid", "fed.rounds=1"])
    quiet_runner(cfg, tmp_path / "run").run()
    write_dataset(first / "train.jsonl", 7)
    metrics = (tmp_path / "run" / "metrics.jsonl").read_text()

    with pytest.raises(DataChanged, match=r"data.dataset: .*train.jsonl changed"):
        quiet_runner(load_config(CONFIG, ["data.dataset=train.jsonl"]), tmp_path / "run").run(resume=True)
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == metrics
