"""Reading what the runner leaves in a run directory: config, per-round metrics, data statistics."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

log = logging.getLogger(__name__)

MetricsRow = dict[str, Any]
CategoryCounts = dict[str, dict[str, int]]


class ReportError(ValueError):
    """A run directory cannot be reported on: the message names the file and what is wrong."""


def read_metrics(run_dir: Path) -> list[MetricsRow]:
    """Rows of ``run_dir/metrics.jsonl``, one per round, sorted by round.

    A resumed run re-appends the rounds after its checkpoint, so when a round appears twice
    the later row is the one that belongs to the finished run. A last line without a newline
    that does not parse is a write cut off by a killed process and is skipped; a bad line
    anywhere else means the file is corrupt and is an error.
    """
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise ReportError(f"{path}: no such file")
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    by_round: dict[int, MetricsRow] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        is_unterminated_last = number == len(lines)
        row = _parse_row(path, number, line, tolerate_partial=is_unterminated_last)
        if row is not None:
            by_round[row["round"]] = row
    if not by_round:
        raise ReportError(f"{path}: no metrics rows (has the run completed a round?)")
    return [by_round[r] for r in sorted(by_round)]


def _parse_row(path: Path, number: int, line: str, tolerate_partial: bool) -> MetricsRow | None:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as error:
        if tolerate_partial:
            log.warning("%s:%d: skipping partially written last line", path, number)
            return None
        raise ReportError(f"{path}:{number}: not valid JSON ({error.msg})") from error
    if not isinstance(row, dict) or not isinstance(row.get("round"), int):
        raise ReportError(f"{path}:{number}: expected an object with an integer 'round'")
    return row


def read_config(run_dir: Path) -> dict[str, Any]:
    """The resolved experiment config the runner saved as ``run_dir/config.yaml``."""
    path = run_dir / "config.yaml"
    if not path.is_file():
        raise ReportError(f"{path}: no such file")
    config = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(config, dict):
        raise ReportError(f"{path}: expected a mapping at the top level")
    return config


def read_data_stats(run_dir: Path) -> dict[str, Any] | None:
    """``run_dir/data_stats.json`` (dataset, scheme, per-client category counts), if written."""
    path = run_dir / "data_stats.json"
    if not path.is_file():
        return None
    stats = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(stats, dict) or not isinstance(stats.get("counts"), dict):
        raise ReportError(f"{path}: expected an object with a 'counts' mapping")
    return stats


def config_value(config: dict[str, Any], dotted_key: str) -> Any:
    """``config["a"]["b"]`` for ``"a.b"``; None where any level is missing."""
    node: Any = config
    for key in dotted_key.split("."):
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


@dataclass(frozen=True)
class Run:
    """Everything read from one run directory."""

    run_dir: Path
    config: dict[str, Any]
    rows: list[MetricsRow]
    data_stats: dict[str, Any] | None

    @property
    def name(self) -> str:
        return str(self.config.get("name") or self.run_dir.name)

    @property
    def trained_rows(self) -> list[MetricsRow]:
        return [row for row in self.rows if row["round"] > 0]

    @property
    def before_row(self) -> MetricsRow | None:
        """The evaluation of the untrained model, if the runner made one."""
        return next((row for row in self.rows if row["round"] == 0 and row.get("eval")), None)

    @property
    def final_row(self) -> MetricsRow | None:
        """The last round after training that was evaluated."""
        evaluated = [row for row in self.trained_rows if row.get("eval")]
        return evaluated[-1] if evaluated else None


def load_run(run_dir: Path) -> Run:
    return Run(run_dir, read_config(run_dir), read_metrics(run_dir), read_data_stats(run_dir))
