"""The `fedtune` command in-process: every subcommand on tiny inputs, and its error messages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from fedtune.cli import app
from tests.integration.helpers import ROOT

CONFIG = str(ROOT / "configs" / "test" / "fedit-tiny.yaml")
runner = CliRunner()


def test_run_eval_generate_report(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    result = runner.invoke(app, ["run", CONFIG, "fed.rounds=1", "-o", str(run_dir)])
    assert result.exit_code == 0, result.output
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())["_run"]
    assert saved["threads"] == torch.get_num_threads() and saved["versions"]["torch"] == torch.__version__
    assert (run_dir / "artifacts" / "adapter" / "adapter_config.json").is_file()
    result = runner.invoke(app, ["eval", str(run_dir), "--max-examples", "4"])
    assert result.exit_code == 0, result.output
    assert "perplexity" in json.loads((run_dir / "eval.json").read_text())["metrics"]
    assert "generated 4/4 prompts" in result.output  # off a terminal: a line per batch of prompts
    # a second evaluation on fewer examples goes beside the first instead of over it
    result = runner.invoke(app, ["eval", str(run_dir), "--max-examples", "2", "--output", "eval-2.json"])
    assert result.exit_code == 0, result.output
    assert json.loads((run_dir / "eval.json").read_text())["examples"] == 4
    assert json.loads((run_dir / "eval-2.json").read_text())["examples"] == 2
    assert not list(run_dir.glob(".*.partial"))
    result = runner.invoke(app, ["eval", str(run_dir), "--output", "artifacts"])
    assert result.exit_code == 2 and "is a directory" in result.output, result.output
    result = runner.invoke(
        app, ["generate", str(run_dir), "--prompt", "Define 'cat'.", "--max-new-tokens", "4"]
    )
    assert result.exit_code == 0, result.output
    assert ">>> Define 'cat'." in result.output
    assert "note: tiny-llama is a randomly initialised test model" in result.output
    result = runner.invoke(app, ["report", str(run_dir)])
    assert result.exit_code == 0, result.output
    assert (run_dir / "report.md").is_file()
    again = runner.invoke(app, ["run", CONFIG, "fed.rounds=1", "-o", str(run_dir)])
    assert again.exit_code == 2
    assert "fedtune resume" in again.output


def test_config_errors_exit_2_with_the_key(tmp_path: Path) -> None:
    result = runner.invoke(app, ["run", CONFIG, "fed.roundz=1", "-o", str(tmp_path / "x")])
    assert result.exit_code == 2
    assert "did you mean 'fed.rounds'" in result.output
    assert not (tmp_path / "x").exists()


def test_missing_data_file_is_named_before_training(tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["run", CONFIG, "data.dataset=/nonexistent/train.jsonl", "-o", str(tmp_path / "x")]
    )
    assert result.exit_code == 2
    assert "/nonexistent/train.jsonl" in result.output
    assert not (tmp_path / "x" / "metrics.jsonl").exists()


def test_malformed_data_row_names_file_and_line(tmp_path: Path) -> None:
    data = tmp_path / "train.jsonl"
    data.write_text('{"instruction": "a", "output": "b"}\n{"instruction": "c"}\n')
    result = runner.invoke(app, ["run", CONFIG, f"data.dataset={data}", "-o", str(tmp_path / "x")])
    assert result.exit_code == 2
    assert "train.jsonl" in result.output and "line 2" in result.output and "output" in result.output


def test_data_commands(tmp_path: Path) -> None:
    listed = runner.invoke(app, ["data", "list"])
    assert listed.exit_code == 0 and "wordnet-instruct" in listed.output
    shown = runner.invoke(app, ["data", "show", "arith-word-problems", "--n", "1"])
    assert shown.exit_code == 0 and "####" in shown.output
    unknown = runner.invoke(app, ["data", "show", "wordnet-instrct"])
    assert unknown.exit_code == 2 and "wordnet-instruct" in unknown.output
    plot = tmp_path / "partition.png"
    stats = runner.invoke(app, ["data", "stats", CONFIG, "--plot", str(plot)])
    assert stats.exit_code == 0, stats.output
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "c03" in stats.output


def test_models_commands() -> None:
    listed = runner.invoke(app, ["models", "list"])
    assert listed.exit_code == 0 and "smollm2-135m-instruct" in listed.output
    unknown = runner.invoke(app, ["models", "path", "smollm3"])
    assert unknown.exit_code == 2 and "did you mean" in unknown.output


def test_data_stats_writes_its_plot_with_the_run_outputs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    stats = runner.invoke(app, ["data", "stats", CONFIG, "-o", str(tmp_path / "run")])
    assert stats.exit_code == 0, stats.output
    assert (tmp_path / "run" / "plots" / "partition.png").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["run"]
