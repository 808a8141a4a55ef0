"""``fedtune align vocab`` / ``show`` on tiny tokenizers."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from fedtune.cli import app

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
