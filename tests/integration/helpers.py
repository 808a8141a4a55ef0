from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

from fedtune.config import ExperimentConfig, load_config
from fedtune.runner import Runner
from tests.golden.cases import VOLATILE

ROOT = Path(__file__).resolve().parents[2]


def tiny_config(algorithm: str, *overrides: str) -> ExperimentConfig:
    path = ROOT / "configs" / "test" / f"{algorithm}-tiny.yaml"
    assert path.is_file(), f"every registered algorithm needs {path} for the contract test"
    return load_config(path, list(overrides))


def quiet_runner(cfg: ExperimentConfig, run_dir: Path, **hooks: Any) -> Runner:
    return Runner(cfg, run_dir, console=Console(quiet=True), **hooks)


def stable(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Metrics rows without wall-clock and memory readings (which legitimately differ)."""
    return [{k: v for k, v in row.items() if k not in VOLATILE} for row in history]
