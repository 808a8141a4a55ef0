"""Smoke test of experiments/fedpft_table.py on the tiny config: runs three rows, tabulates the ordering."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from experiments import fedpft_rows, fedpft_table

from tests.integration.helpers import ROOT

# The runs of these tables run in this process (tests/conftest.py): a subprocess each cost ~8 s of imports.
pytestmark = pytest.mark.usefixtures("fedtune_in_process")


def test_table_runs_rows_and_checks_the_ordering(tmp_path: Path) -> None:
    config = ROOT / "configs" / "test" / "fedpft-tiny.yaml"
    argv = [str(config), "--runs-dir", str(tmp_path / "runs"), "--results-dir", str(tmp_path / "results")]
    argv += ["--rows", "fedot_kd", "fedot", "fedpft", "fedpetuning", "--jobs", "2", "--set", "fed.rounds=1"]
    # FedPFT's distillation budget, FedOT's emulator's too; the rows without one keep theirs off
    argv += ["--set", "fedpft.distill_steps=3", "--row-lr", "fedot=0.02"]  # FedOT at its own lr
    fedpft_table.main(argv)
    for row, steps, lr in (
        ("fedot_kd", 3, 0.01),
        ("fedot", 0, 0.02),
        ("fedpft", 3, 0.01),
        ("fedpetuning", 0, 0.01),
    ):
        name = f"{row}-lexclass-iid{'-lr0.02' if row == 'fedot' else ''}-s0"
        saved = yaml.safe_load((tmp_path / "runs" / "fedpft-tiny" / name / "config.yaml").read_text())
        assert saved["fedpft"]["distill_steps"] == steps, row
        assert saved["train"]["lr"] == lr and results_of(tmp_path)[f"{row}-lexclass-iid"]["lr"] == lr, row
    table = (tmp_path / "results" / "table-fedpft-tiny.md").read_text()
    assert "| method | data | partition | lr | accuracy |" in table
    assert (
        "| FedPFT | lexclass | iid | 0.01 |" in table
        and "| FedOT (layer drop) | lexclass | iid | 0.02 |" in table
    )
    assert "- lexclass-iid: FedOT (layer drop) < FedPFT:" in table
    assert "- lexclass-iid: FedOT (layer drop + distillation) < FedPFT:" in table
    assert "- lexclass-iid: FedOT (layer drop) < FedOT (layer drop + distillation):" in table
    emulator = results_of(tmp_path)["fedot_kd-lexclass-iid"]["distill_seconds"]
    assert len(emulator) == 1  # FedOT's one distillation, before federated learning
    assert "- lexclass-iid: FedPFT <= FedPETuning (full model):" in table
    results = json.loads((tmp_path / "results" / "table-fedpft-tiny.json").read_text())["results"]
    pft, full = results["fedpft-lexclass-iid"], results["fedpetuning-lexclass-iid"]
    assert pft["seeds"] == 1 and pft["params"]["client_params"] < full["params"]["client_params"]
    assert pft["mb_down_per_round"] < full["mb_down_per_round"]
    assert (tmp_path / "results" / "table-fedpft-tiny.png").read_bytes().startswith(b"\x89PNG")
    fedpft_table.main([*argv, "--table-only"])


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ("fedot", "give ROW=LR"),
        ("fedot=x", "give ROW=LR"),
        ("nope=0.1", "unknown row 'nope'"),
        ("fedot=0", "> 0"),
    ],
)
def test_a_bad_row_lr_is_a_usage_error_naming_it(
    entry: str, problem: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    argv = [str(ROOT / "configs" / "test" / "fedpft-tiny.yaml"), "--runs-dir", str(tmp_path), "--table-only"]
    with pytest.raises(SystemExit):
        fedpft_table.main([*argv, "--row-lr", entry])
    assert problem in capsys.readouterr().err and not (tmp_path / "fedpft-tiny").exists()


def results_of(tmp_path: Path) -> dict[str, Any]:
    return json.loads((tmp_path / "results" / "table-fedpft-tiny.json").read_text())["results"]


def test_a_two_class_model_predicting_one_class_is_recognised() -> None:
    from fedtune.data.classify import classification_metrics

    constant = classification_metrics([1] * 50, [0] * 23 + [1] * 27, 2)
    mixed = classification_metrics([0] * 20 + [1] * 30, [0] * 23 + [1] * 27, 2)

    assert fedpft_rows.one_class_on_two(constant["accuracy"], constant["macro_f1"])
    assert not fedpft_rows.one_class_on_two(mixed["accuracy"], mixed["macro_f1"])


def test_an_ordering_decided_below_the_shown_precision_shows_more_digits() -> None:
    def result(by_seed: dict[str, float]) -> dict[str, object]:
        values = list(by_seed.values())
        return {"accuracy": sum(values) / len(values), "accuracy_by_seed": by_seed, "constant": False}

    results = {
        "no_neuron-lexclass-dir1": result({"0": 33.0, "1": 33.4}),  # mean 33.20
        "fedpft-lexclass-dir1": result({"0": 32.9, "1": 33.6}),  # mean 33.25
        "fedot-lexclass-dir1": result({"0": 30.0, "1": 34.0}),
    }
    lines = fedpft_table.ordering(results, ["lexclass-dir1"])

    # by interval: gains -0.1, 0.2 (mean 0.05, sd 0.21) and 2.9, -0.4 (mean 1.25, sd 2.33), t(1 df) = 12.71
    assert (
        "- lexclass-dir1: FedPFT w/o neuron-level distillation < FedPFT: "
        "holds (33.20 vs 33.25; lower in 1 of 2 seeds; "
        "by interval: tie (gain 0.05, 95% CI [-1.86, 1.96], 2 seeds))"
    ) in lines
    assert (
        "- lexclass-dir1: FedOT (layer drop) < FedPFT: holds (32.0 vs 33.2; lower in 1 of 2 seeds; "
        "by interval: tie (gain 1.25, 95% CI [-19.72, 22.22], 2 seeds))"
    ) in lines


def test_lr_sweep_scores_every_row_on_validation_and_picks_one_lr(tmp_path: Path) -> None:
    config = ROOT / "configs" / "test" / "fedpft-tiny.yaml"
    argv = [str(config), "--runs-dir", str(tmp_path / "runs"), "--results-dir", str(tmp_path / "results")]
    argv += [
        "--rows",
        "fedot",
        "fedpetuning",
        "--jobs",
        "2",
        "--set",
        "fed.rounds=1",
        "--lrs",
        "0.001",
        "0.1",
    ]
    fedpft_table.main(argv)
    runs = tmp_path / "runs" / "fedpft-tiny"
    saved = yaml.safe_load((runs / "lr0.1-fedot-lexclass-iid-s0" / "config.yaml").read_text())
    assert saved["train"]["lr"] == 0.1 and saved["data"]["eval_split"] == "validation"
    results = json.loads((tmp_path / "results" / "sweep-lr-fedpft-tiny.json").read_text())["results"]
    means = results["mean_by_lr"]
    for lr in ("0.001", "0.1"):
        cells = [results[f"lr{lr}-{row}-lexclass-iid"]["accuracy"] for row in ("fedot", "fedpetuning")]
        assert means[lr] == sum(cells) / 2
    assert f"{results['chosen_lr']:g}" == max(means, key=means.__getitem__)
    text = (tmp_path / "results" / "sweep-lr-fedpft-tiny.md").read_text()
    assert (
        f"Chosen lr (highest mean validation accuracy over the rows and settings): {results['chosen_lr']:g}"
        in text
    )
    assert (tmp_path / "results" / "sweep-lr-fedpft-tiny.png").read_bytes().startswith(b"\x89PNG")
    assert "Validation accuracy (%) at each evaluated round (mean over seeds):" in text
    assert "| FedOT (layer drop) | lexclass-iid | 0.1 |" in text
    assert (tmp_path / "results" / "sweep-lr-fedpft-tiny-rounds.png").read_bytes().startswith(b"\x89PNG")


def test_accuracy_by_round_is_the_mean_over_finished_seeds_at_rounds_all_of_them_evaluated(
    tmp_path: Path,
) -> None:
    def fake_run(name: str, accuracies: dict[int, float], rounds: int = 10) -> Path:
        run_dir = tmp_path / name
        run_dir.mkdir()
        (run_dir / "config.yaml").write_text(yaml.safe_dump({"fed": {"rounds": rounds}}))
        rows = [{"round": 0}]
        for rnd in range(1, rounds + 1):
            row: dict[str, object] = {"round": rnd, "bytes_up": 10, "bytes_down": 20, "peak_rss_mb": 1.0}
            if rnd in accuracies:
                row["eval"] = {"accuracy": accuracies[rnd], "macro_f1": 0.1, "sub/accuracy": 0.0}
            rows.append(row)
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return run_dir

    seeds = [
        fake_run("x-s0", {5: 0.2, 10: 0.4}),
        fake_run("x-s1", {3: 0.9, 5: 0.3, 10: 0.5}),  # round 3 evaluated in one seed only: left out
        fake_run("x-s2", {5: 0.9, 10: 0.9}, rounds=12),  # unfinished (10 of 12 rounds): left out
    ]
    for run_dir in seeds[2:]:
        rows = (run_dir / "metrics.jsonl").read_text().splitlines()
        (run_dir / "metrics.jsonl").write_text("\n".join(rows[:11]) + "\n")
    summary = fedpft_rows.summarise(seeds)
    assert summary["seeds"] == 2
    assert summary["accuracy_by_round"] == {"5": 25.0, "10": 45.0}
    assert summary["accuracy"] == 45.0


def test_a_one_panel_plot_is_wide_enough_for_its_title(tmp_path: Path) -> None:
    from types import SimpleNamespace

    def result(by_seed: dict[str, float]) -> dict[str, object]:
        return {"seeds": len(by_seed), "constant": False, "accuracy_by_seed": by_seed}

    results = {
        f"{row}-lexclass-iid": result({"0": 40.0 + i, "1": 41.0 + i})
        for i, row in enumerate(("fedot", "fedpft", "fedpetuning"))
    }
    cfg = SimpleNamespace(
        name="fedpft-minilm-distill-r30", model=SimpleNamespace(name="sentence-transformers/all-MiniLM-L6-v2")
    )
    path = fedpft_table.plot(cfg, results, ["lexclass-iid"], tmp_path / "one.png")

    assert path is not None
    from matplotlib.image import imread

    pixels = imread(path)  # rows x columns x RGBA in [0, 1]
    top = pixels[: pixels.shape[0] // 10, :, :3]  # the title's strip
    assert (top < 0.5).any(), "no title drawn"
    # A title wider than the figure is cut at both edges: ink in the outermost columns.
    assert (top[:, :3] > 0.9).all() and (top[:, -3:] > 0.9).all(), "the title runs off the figure"


def test_keep_earlier_keeps_the_rows_whose_runs_are_elsewhere_and_says_so(tmp_path: Path) -> None:
    """A row with no run here (run on another machine) keeps the previous results file's value, whole,
    and the table names it; without the flag the write is refused, and with ``--overwrite`` such a row
    is left out."""
    config = ROOT / "configs" / "test" / "fedpft-tiny.yaml"
    results = tmp_path / "results"
    argv = [str(config), "--runs-dir", str(tmp_path / "runs"), "--results-dir", str(results)]
    argv += ["--rows", "fedot", "fedpetuning", "--partitions", "iid", "dir10", "--set", "fed.rounds=1"]
    fedpft_table.main([*argv, "--partitions", "iid"])  # the IID rows, as if made on another machine
    earlier = json.loads((results / "table-fedpft-tiny.json").read_text())["results"]
    for run in (tmp_path / "runs" / "fedpft-tiny").glob("*-iid-s0"):
        (run / "metrics.jsonl").unlink()  # their runs are not here any more
    elsewhere = ["--results-dir", str(tmp_path / "elsewhere")]  # the results page's file stays as it was
    # FedOT's Dirichlet row runs here; FedPETuning's has no run anywhere, so it is neither kept nor named
    fedpft_table.main([*argv, "--partitions", "dir10", "--rows", "fedot", *elsewhere])

    fedpft_table.main([*argv, "--table-only", "--keep-earlier"])

    kept = json.loads((results / "table-fedpft-tiny.json").read_text())["results"]
    assert kept["fedot-lexclass-iid"] == earlier["fedot-lexclass-iid"]
    assert kept["fedpetuning-lexclass-iid"] == earlier["fedpetuning-lexclass-iid"]
    assert kept["fedot-lexclass-dir10"]["seeds"] == 1
    text = (results / "table-fedpft-tiny.md").read_text()
    assert (
        "| FedOT (layer drop) | lexclass | iid |" in text
        and "| FedOT (layer drop) | lexclass | dir10 |" in text
    )
    note = "Kept from the previous results file (no run of theirs here, `--keep-earlier`): "
    assert note + "FedOT (layer drop) lexclass iid, FedPETuning (full model) lexclass iid." in text
    assert "| FedPETuning (full model) | lexclass | dir10 |" not in text
    with pytest.raises(SystemExit, match=r"would drop .*fedot-lexclass-iid/accuracy"):
        fedpft_table.main([*argv, "--table-only"])  # without the flag the rows made elsewhere would go
    fedpft_table.main([*argv, "--table-only", "--overwrite"])  # asked for: a row with no run is left out
    assert "| FedOT (layer drop) | lexclass | iid |" not in (results / "table-fedpft-tiny.md").read_text()
