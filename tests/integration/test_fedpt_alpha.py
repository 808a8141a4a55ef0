"""experiments/fedpt_alpha.py: alpha searched again on a finished run, by validation perplexity."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from experiments import fedpt_alpha

from tests.integration.helpers import quiet_runner, tiny_config


def test_the_study_recomputes_the_runs_test_perplexity_and_picks_the_lowest_validation_perplexity(
    tmp_path: Path,
) -> None:
    cfg = tiny_config("fedpt", "fed.rounds=1", "eval.extra_datasets=[arith-word-problems]")
    history = quiet_runner(cfg, tmp_path / "fedpt-s0").run()
    final = history[-1]["eval"]
    results_dir = tmp_path / "results"
    argv = [str(tmp_path / "fedpt-s0"), "--name", "tiny", "--grid", "0.5", "1.0", "3.0"]
    fedpt_alpha.main([*argv, "--validation-examples", "6", "--results-dir", str(results_dir)])

    (study,) = json.loads((results_dir / "alpha-tiny.json").read_text())["results"]
    assert study["method"] == "fedpt" and study["run_alpha"] == final["alpha"]
    assert study["validation_examples"] == 6
    curves = study["perplexity_by_alpha"]
    assert set(curves) == {"validation", "test", "arith-word-problems"}
    run_key = f"{final['alpha']:g}"
    # the saved output at the run's alpha is the model the run evaluated
    assert curves["test"][run_key] == pytest.approx(final["perplexity"], rel=1e-6)
    recorded_arith = final["arith-word-problems/perplexity"]
    assert curves["arith-word-problems"][run_key] == pytest.approx(recorded_arith, rel=1e-6)
    validation = curves["validation"]
    assert study["alpha"] == float(min(validation, key=lambda a: validation[a]))
    picked = f"{study['alpha']:g}"
    assert study["at_alpha"]["perplexity"] == pytest.approx(curves["test"][picked], rel=1e-6)
    assert 0.0 <= study["at_alpha"]["rougeL"] <= 1.0 and "arith-word-problems/rougeL" in study["at_alpha"]
    text = (results_dir / "alpha-tiny.md").read_text()
    assert f"| FedPT | 0 | {run_key} | {picked} | {final['rougeL']:.4f} |" in text
    assert (results_dir / "alpha-tiny.png").read_bytes().startswith(b"\x89PNG")

    # --table-only rewrites the table from the json and keeps the study's command
    (results_dir / "alpha-tiny.md").unlink()
    fedpt_alpha.main(["--name", "tiny", "--results-dir", str(results_dir), "--table-only"])
    assert (results_dir / "alpha-tiny.md").read_text() == text

    # --add keeps the runs studied earlier; a run studied again replaces its earlier entry
    fedpt_alpha.main([*argv, "--validation-examples", "6", "--results-dir", str(results_dir), "--add"])
    again = json.loads((results_dir / "alpha-tiny.json").read_text())["results"]
    assert [r["run_dir"] for r in again] == [study["run_dir"]]
    assert again[0]["perplexity_by_alpha"] == curves
