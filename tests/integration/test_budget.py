"""fed.budget_mb through whole runs: the CLI stops cleanly (exit 0) before the round that would pass the
budget, evaluates and saves the last round, says why, the report shows the budget, and a resume of the
stopped run runs no more rounds."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from typer.testing import CliRunner

import fedtune
from fedtune.cli import app
from fedtune.fl.budget import round_mb
from fedtune.report import write_report
from tests.integration.helpers import ROOT

CONFIG = str(ROOT / "configs" / "test" / "fedit-tiny.yaml")
FAST = ("eval.before=false", "eval.metrics=[perplexity]", "eval.max_examples=4", "eval.every=10")
ROUND_MB = (17044 + 16664) / 1e6
"""fedit-tiny's traffic per round (tests/golden/metrics.json), up plus down."""


def metrics(run_dir: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_the_cli_stops_before_the_round_that_would_pass_the_budget_and_resume_runs_no_more(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Prepare: room for two and a half rounds out of five.
    run_dir = tmp_path / "run"
    budget = 2.5 * ROUND_MB
    cli = CliRunner()

    # Execute
    with caplog.at_level(logging.WARNING, logger="fedtune"):
        result = cli.invoke(
            app, ["run", CONFIG, "fed.rounds=5", f"fed.budget_mb={budget}", *FAST, "-o", str(run_dir)]
        )
        resumed = cli.invoke(app, ["resume", str(run_dir)])

    # Assert: rounds 1-2 ran, the last of them evaluated and saved; the reason logged, twice
    assert result.exit_code == 0, result.output
    assert resumed.exit_code == 0, resumed.output
    rows = metrics(run_dir)
    assert [row["round"] for row in rows] == [0, 1, 2]
    assert [round_mb(row) for row in rows[1:]] == pytest.approx([ROUND_MB, ROUND_MB])
    assert "eval" in rows[2] and "eval" not in rows[1]
    assert (run_dir / "artifacts" / "adapter" / "adapter_model.safetensors").is_file()
    stops = [r.getMessage() for r in caplog.records if "budget" in r.getMessage()]
    assert len(stops) == 2
    assert f"fed.budget_mb is {budget:g} MB" in stops[0]
    assert f"{2 * ROUND_MB:.4g} MB used in rounds 1-2" in stops[0]
    assert f"about {ROUND_MB:.4g} MB more" in stops[0] and "stopping before round 3" in stops[0]
    assert stops[1] == stops[0]
    report = write_report(run_dir).read_text()
    assert f"Communication budget: {2 * ROUND_MB:.4g} of {budget:g} MB" in report
    assert "stopped before round 3 of 5" in report


def test_a_first_round_over_the_budget_ends_the_run_after_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="fedtune"):
        history = fedtune.run(
            CONFIG, output_dir=tmp_path / "run", quiet=True, fed={"rounds": 3, "budget_mb": 0.01}
        )
    assert [row["round"] for row in history] == [0, 1]
    assert "eval" in history[1]
    assert any("round 1; that alone passes the budget" in r.getMessage() for r in caplog.records)
