"""Trackers' side of a run that needs no run: rows flattened to scalars, a missing package named."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from typing import Any

import pytest

from fedtune.config import ConfigError, load_config
from fedtune.runner import Runner
from fedtune.tracking import TrackerMissing, flatten_row
from tests.integration.helpers import ROOT

CONFIG = ROOT / "configs" / "test" / "fedit-tiny.yaml"


def test_a_row_flattens_to_slash_names_with_clients_under_client() -> None:
    row = {
        "round": 2,
        "clients": ["c0", "c1"],
        "failed": {"c2": "late"},
        "train_loss": 1.5,
        "bytes_up": 10,
        "eval": {"rougeL": 0.25, "personal/perplexity": math.nan},
        "eval_by_category": {"usage": {"rougeL": 0.5}},
        "eval_by_client": {"c0": {"perplexity": 3.0, "rougeL": None}, "c1": {"perplexity": math.inf}},
        "non_finite": ["eval.personal/perplexity: nan"],
        "flag": True,
    }

    assert flatten_row(row) == {
        "train_loss": 1.5,
        "bytes_up": 10.0,
        "eval/rougeL": 0.25,
        "eval_by_category/usage/rougeL": 0.5,
        "client/c0/perplexity": 3.0,
    }


def test_report_to_takes_one_name_or_a_list_of_known_ones() -> None:
    assert load_config(CONFIG, ["report_to=wandb"]).report_to == ["wandb"]
    assert load_config(CONFIG, ["report_to=[mlflow,tensorboard,mlflow]"]).report_to == [
        "mlflow",
        "tensorboard",
    ]
    with pytest.raises(ConfigError, match=r"report_to\.0.*'tensorboard', 'wandb' or 'mlflow'"):
        load_config(CONFIG, ["report_to=[comet]"])


def test_a_tracker_that_is_not_installed_names_its_extra_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name == "wandb" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    cfg = load_config(CONFIG, ["report_to=[tensorboard,wandb]"])

    with pytest.raises(TrackerMissing, match=r"pip install 'fedtune\[wandb\]'"):
        Runner(cfg, tmp_path / "run").run()
    assert not (tmp_path / "run").exists()
