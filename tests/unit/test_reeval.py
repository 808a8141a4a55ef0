"""experiments/reeval.py: the results of finished runs scored again, read back and judged per claim."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from experiments import reeval


def _scored(runs: Path, row: str, seed: int, metrics: dict[str, float], seconds: float = 5.0) -> None:
    run = runs / f"{row}-s{seed}"
    run.mkdir(parents=True)
    record = {"split": "test", "variant": "adapfu", "examples": 10, "metrics": metrics, "seconds": seconds}
    (run / reeval.output_name("adapfu", "test", 10)).write_text(json.dumps(record))


def test_the_first_row_is_judged_against_each_other_by_a_paired_t_interval(tmp_path: Path) -> None:
    runs = tmp_path / "fedbiot-code"
    for seed, (best, other) in enumerate([(0.3, 0.2), (0.4, 0.2), (0.5, 0.2)]):
        # perplexity: the best row is lower by 1.0, 1.2 and 0.8
        _scored(runs, "best", seed, {"pass_at_1": best, "perplexity": 2.0}, seconds=10.0 + seed)
        _scored(
            runs,
            "other",
            seed,
            {"pass_at_1": other, "perplexity": 3.0 + 0.2 * (seed == 1) - 0.2 * (seed == 2)},
        )
    out = tmp_path / "results"
    reeval.main(
        [
            *(str(runs), "--rows", "best", "other", "--seeds", "0", "1", "2", "--variants", "adapfu"),
            *("--max-examples", "10", "--results-dir", str(out), "--table-only"),
        ]
    )
    text = (out / "reeval-fedbiot-code-test10.md").read_text()
    assert "| best | 40.00 ± 10.00 (30.00 / 40.00 / 50.00) | 2.00 ± 0.00 (2.00 / 2.00 / 2.00) |" in text
    # gains 10, 20, 30: mean 20, sd 10, t(0.975, 2) = 4.3027 -> half width 24.84
    assert "adapfu pass_at_1: best over other: tie (gain 20.00, 95% CI [-4.84, 44.84], 3 seeds)" in text
    # gains 1.0, 1.2, 0.8: mean 1.0, sd 0.2 -> half width 0.50; lower is better for perplexity
    assert "adapfu perplexity: best over other: holds (gain 1.00, 95% CI [0.50, 1.50], 3 seeds)" in text
    assert "Cost: 6 evaluations, 8 s each (median; 5-12 s)" in text
    recorded = json.loads((out / "reeval-fedbiot-code-test10.json").read_text())["results"]
    assert recorded["other"]["adapfu"]["values"]["pass_at_1"] == {"0": 0.2, "1": 0.2, "2": 0.2}


def test_a_missing_run_is_named_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _scored(tmp_path, "best", 0, {"pass_at_1": 0.1})
    with pytest.raises(SystemExit):
        reeval.main([str(tmp_path), "--rows", "best", "other", "--max-examples", "10", "--table-only"])
    err = capsys.readouterr().err
    assert "no run directory in" in err and "other-s0" in err and "best-s0" not in err


def test_an_unfinished_run_is_not_scored(tmp_path: Path) -> None:
    run = tmp_path / "row-s0"
    run.mkdir()
    (run / "metrics.jsonl").write_text("")
    with pytest.raises(RuntimeError, match="not a finished run"):
        reeval.evaluate(run, "adapfu", "test", 10)


def test_render_writes_the_md_again_from_the_json_alone(tmp_path: Path) -> None:
    # Prepare: a results file whose rows tie in every seed (gain 0 each time), its runs gone
    runs = tmp_path / "fedbiot-code"
    for seed in range(3):
        _scored(runs, "best", seed, {"pass_at_1": 0.2})
        _scored(runs, "other", seed, {"pass_at_1": 0.2})
    made = tmp_path / "made"
    reeval.main(
        [
            *(str(runs), "--rows", "best", "other", "--seeds", "0", "1", "2", "--variants", "adapfu"),
            *("--max-examples", "10", "--results-dir", str(made), "--table-only"),
        ]
    )
    for seed in range(3):
        for row in ("best", "other"):
            (runs / f"{row}-s{seed}" / reeval.output_name("adapfu", "test", 10)).unlink()
    # Execute
    out = tmp_path / "again"
    reeval.main(["--render", str(made / "reeval-fedbiot-code-test10.json"), "--results-dir", str(out)])
    # Assert: the same text, the tie read as having no spread
    text = (out / "reeval-fedbiot-code-test10.md").read_text()
    assert text == (made / "reeval-fedbiot-code-test10.md").read_text()
    assert "best over other: tie (gain 0.00 in each of 3 seeds: no spread" in text


def test_the_committed_reeval_file_renders_from_its_json_byte_for_byte(tmp_path: Path) -> None:
    results = Path(__file__).resolve().parents[2] / "experiments" / "results"
    name = "reeval-fedbiot-code-k30-test164"
    reeval.main(["--render", str(results / f"{name}.json"), "--results-dir", str(tmp_path)])
    assert (tmp_path / f"{name}.md").read_bytes() == (results / f"{name}.md").read_bytes()


def test_without_render_the_runs_rows_and_examples_are_required(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        reeval.main([str(tmp_path), "--table-only"])
    assert "required but with --render: rows, max_examples" in capsys.readouterr().err
