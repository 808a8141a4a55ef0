"""``fedtune align vocab`` / ``show`` on tiny tokenizers, and the P1/P2 benchmark at smoke size."""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedtune.cli import BENCHMARK_SCRIPTS, app

runner = CliRunner()


def test_align_vocab_reports_coverage_histogram_and_cache(tmp_path: Path) -> None:
    command = ["align", "vocab", "tiny-llama-spm", "tiny-qwen2-bpe", "--map-cache", str(tmp_path)]

    first = runner.invoke(app, command)
    second = runner.invoke(app, command)

    assert first.exit_code == 0, first.output
    for text in ("exact (distance 0)", "near (distance 1-2)", "far (distance 3+)", "10+", "computed"):
        assert text in first.output
    assert "read from the cache" in second.output
    assert len(list(tmp_path.glob("*.npz"))) == 1


def test_align_show_marks_one_to_one_matches() -> None:
    result = runner.invoke(app, ["align", "show", "tiny-llama-spm", "tiny-llama", "The cat"])

    assert result.exit_code == 0, result.output
    assert "tiny-llama-spm (2 tokens)" in result.output and "tiny-llama (7 tokens)" in result.output
    assert "1:1 matches: 0 of 7" in result.output


def test_align_with_an_unknown_model_fails_cleanly() -> None:
    result = runner.invoke(app, ["align", "show", "tiny-llama-xyz", "tiny-llama", "a"])

    assert result.exit_code == 2
    assert "valid suffixes" in result.output


def test_bench_p1_p2_smoke_writes_both_results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert BENCHMARK_SCRIPTS["p1"] == BENCHMARK_SCRIPTS["p2"] == "token_align"
    script = Path(__file__).resolve().parents[2] / "bench" / "token_align.py"
    argv = [str(script), "--smoke", "--results-dir", str(tmp_path), "--sample", "20", "--repeats", "1"]
    monkeypatch.setattr(sys, "argv", argv)

    runpy.run_path(str(script), run_name="__main__")

    p1 = json.loads((tmp_path / "p1.smoke.json").read_text())
    p2 = json.loads((tmp_path / "p2.smoke.json").read_text())
    assert all(row["identical"] for row in p1["directions"])
    assert all(row["identical"] for row in p2["samples"])
