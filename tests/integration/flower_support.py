"""Helpers of the Flower backend tests: submit a run to a deployment, compare metrics."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from fedtune.config import ExperimentConfig
from fedtune.flower.local import LocalDeployment
from fedtune.flower.node import task_names


def flower_run(
    deployment: LocalDeployment, cfg: ExperimentConfig, run_dir: Path, resume: bool = False
) -> list[dict[str, Any]]:
    cfg.fed.backend = "flower"
    text = yaml.safe_dump(cfg.to_yaml_dict(), sort_keys=False)
    deployment.run(text, run_dir, resume, task_names(text), poll=0.5)
    return rows(run_dir)


def rows(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def assert_close(actual: Any, expected: Any, where: str = "") -> None:
    """Equal, floats up to 1e-6 relative (two processes may sum in another order)."""
    if isinstance(expected, dict):
        assert isinstance(actual, dict) and set(actual) == set(expected), where
        for key in expected:
            assert_close(actual[key], expected[key], f"{where}.{key}")
    elif isinstance(expected, list):
        assert isinstance(actual, list) and len(actual) == len(expected), where
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_close(a, e, f"{where}[{i}]")
    elif isinstance(expected, float):
        assert actual == pytest.approx(expected, rel=1e-6, abs=1e-9), where
    else:
        assert actual == expected, where
