"""Smoke test of experiments/fedbiot_table.py on the tiny config: runs, resumes nothing twice, tabulates."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from experiments import fedbiot_ablation, fedbiot_rows, fedbiot_table, fedbiot_trajectory

from fedtune.config import load_config
from tests.integration.helpers import ROOT

# The runs of these tables run in this process (tests/conftest.py): a subprocess each cost ~8 s of imports.
pytestmark = pytest.mark.usefixtures("fedtune_in_process")


def test_table_runs_methods_and_tabulates(tmp_path: Path, capsys: object) -> None:
    config = ROOT / "configs" / "test" / "fedbiot-tiny.yaml"
    argv = [str(config), "--runs-dir", str(tmp_path / "runs"), "--results-dir", str(tmp_path / "results")]
    argv += ["--methods", "offsite", "fedbiot_a2", "--dropouts", "0.4", "--set", "fed.rounds=1"]
    argv += ["--set", "fedbiot.align_steps=3", "--set", "fedbiot.dropout=0.1"]  # the rows' own keys win
    fedbiot_table.main(argv)
    runs = tmp_path / "runs" / "fedbiot-tiny"
    for method, steps in (("offsite", 0), ("fedbiot_a2", 3)):
        saved = yaml.safe_load((runs / f"{method}-d0.4-s0" / "config.yaml").read_text())["fedbiot"]
        assert (saved["align_steps"], saved["dropout"]) == (steps, 0.4), method
    assert (runs / "offsite-d0.4-s0" / "artifacts" / "fedbiot.json").is_file()
    info = json.loads((runs / "fedbiot_a2-d0.4-s0" / "artifacts" / "fedbiot.json").read_text())
    assert info["split"]["adapter"] == [6, 7] and len(info["split"]["emulator"]) == 3
    assert 0 < info["params"]["client_params"] < info["params"]["full_params"]
    assert (tmp_path / "results" / "table-fedbiot-tiny.png").read_bytes().startswith(b"\x89PNG")
    table = (tmp_path / "results" / "table-fedbiot-tiny.md").read_text()
    assert "| Offsite-tuning |" in table and "| FedBiOT (Adapter 2) |" in table and "| FedOT |" not in table
    assert "- d=0.4, AdapFu, 1 seed(s): FedBiOT (Adapter 2)" in table  # the ordering, against Offsite
    results = json.loads((tmp_path / "results" / "table-fedbiot-tiny.json").read_text())["results"]
    assert results["offsite-d0.4"]["seeds"] == 1 and "adapfu/rougeL" in results["fedbiot_a2-d0.4"]
    # A second call finds the finished runs and only tabulates.
    fedbiot_table.main([*argv, "--table-only"])


def test_the_baselines_align_their_emulator_without_fedbiots_kl_term() -> None:
    """Offsite-tuning and FedOT distil their emulator with their own objective, not FedBiOT's eq. (2):
    its KL term (``align_lambda``) is off for them, on for FedBiOT's rows."""
    from fedtune.config import load_config

    config = ROOT / "configs" / "paper" / "fedbiot-math.yaml"
    lambdas = {
        name: load_config(config, overrides).fedbiot.align_lambda
        for name, overrides in fedbiot_rows.METHODS.items()
    }

    assert lambdas["offsite"] == lambdas["fedot"] == 0.0
    assert lambdas["fedbiot_a2"] == lambdas["fedbiot_a4"] > 0


def test_init_sweep_reads_the_emulator_right_after_each_initial_distillation(tmp_path: Path) -> None:
    config = ROOT / "configs" / "test" / "fedbiot-tiny.yaml"
    argv = [str(config), "--runs-dir", str(tmp_path / "runs"), "--results-dir", str(tmp_path / "results")]
    fedbiot_table.main([*argv, "--init-sweep", "1", "6"])
    results = json.loads((tmp_path / "results" / "sweep-i0-fedbiot-tiny.json").read_text())["results"]
    short, long = results["1-d0.5"], results["6-d0.5"]
    assert short["seeds"] == long["seeds"] == 1
    # before any training AdapFu is the base model whatever I_0 was; the emulator is not
    assert short["after_init/adapfu"] == long["after_init/adapfu"]
    assert short["after_init/adapemu"] != long["after_init/adapemu"]
    assert all(v > 0 for v in (*short["round1/adapemu"].values(), *long["init_mse"].values()))
    table = (tmp_path / "results" / "sweep-i0-fedbiot-tiny.md").read_text()
    assert table.count("| 0.5 |") == 2


def test_trajectory_reads_every_evaluated_round_of_each_method(tmp_path: Path) -> None:
    config = ROOT / "configs" / "test" / "fedbiot-tiny.yaml"
    argv = [str(config), "--runs-dir", str(tmp_path / "runs"), "--results-dir", str(tmp_path / "results")]
    argv += ["--methods", "fedbiot_a2", "--dropouts", "0.4", "--trajectory"]
    argv += ["--set", "fed.rounds=2", "--set", "eval.every=1", "--set", "eval.before=true"]
    fedbiot_table.main(argv)
    stem = tmp_path / "results" / "trajectory-fedbiot-tiny"
    curve = json.loads(stem.with_suffix(".json").read_text())["results"]["fedbiot_a2-d0.4"]
    assert curve["seeds"] == 1 and list(curve["rounds"]) == ["0", "1", "2"]
    rows = [
        json.loads(line)
        for line in (tmp_path / "runs" / "fedbiot-tiny" / "fedbiot_a2-d0.4-s0" / "metrics.jsonl").open()
    ]
    # each round's cell is that round's evaluation, read back from the run (one seed: std 0)
    for row in rows:
        assert curve["rounds"][str(row["round"])]["adapfu/perplexity"] == [
            row["eval"]["adapfu/perplexity"],
            0.0,
        ]
    assert curve["best_round"]["0"] in (0, 1, 2)
    assert stem.with_suffix(".png").read_bytes().startswith(b"\x89PNG")
    text = stem.with_suffix(".md").read_text()
    assert text.count("| FedBiOT (Adapter 2) | 0.4 |") == 3 and "best round by AdapFu" in text


def test_trajectory_best_round_breaks_a_metric_tie_by_perplexity(tmp_path: Path) -> None:
    run = tmp_path / "fedot-d0.5-s0"
    run.mkdir()
    (run / "config.yaml").write_text("fed:\n  rounds: 20\n")
    rows = [
        {
            "round": rnd,
            "eval": {"adapfu/exact_match": 0.0, "adapfu/perplexity": ppl, "adapemu/perplexity": 9.0},
        }
        for rnd, ppl in ((0, 3.7), (10, 3.4), (20, 3.5))
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))

    curve = fedbiot_trajectory.trajectory_summary([run], "exact_match")

    assert list(curve["rounds"]) == ["0", "10", "20"] and curve["best_round"] == {"0": 10}


def test_a_row_whose_runs_have_not_finished_summarises_to_no_seeds(tmp_path: Path) -> None:
    """``--table-only`` while a row's only run is still going (or not started) tabulates it as empty."""
    run = tmp_path / "fedot-d0.5-s0"
    run.mkdir()
    (run / "config.yaml").write_text("fed:\n  rounds: 30\n")
    (run / "metrics.jsonl").write_text(json.dumps({"round": 0, "eval": {"adapfu/perplexity": 3.7}}) + "\n")

    assert fedbiot_table.summarise([run, tmp_path / "fedot-d0.5-s1"], "perplexity") == {"seeds": 0}


def test_keep_earlier_keeps_the_rows_whose_runs_are_elsewhere_and_says_so(tmp_path: Path) -> None:
    """A row with no run here (run on another machine) keeps the previous results file's value, in the
    table and in the trajectory, and both files name it; a row with a run here is read from it."""
    config = ROOT / "configs" / "test" / "fedbiot-tiny.yaml"
    results = tmp_path / "results"
    results.mkdir()
    run = tmp_path / "runs" / "fedbiot-tiny" / "fedbiot_a4-d0.5-s0"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("fed:\n  rounds: 2\n")
    evals = [{"adapfu/perplexity": p, "adapemu/perplexity": 2 * p} for p in (9.0, 5.0, 4.0)]
    rows = [{"round": r, "bytes_up": 10, "bytes_down": 20, "eval": e} for r, e in enumerate(evals)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    earlier_row = {"seeds": 1, "adapfu/perplexity": 3.0, "adapfu/perplexity_by_seed": {"0": 3.0}}
    rounds = {str(r): {"adapfu/perplexity": [p, 0.0]} for r, p in ((0, 7.0), (10, 6.0))}
    earlier_curve = {"seeds": 1, "rounds": rounds, "best_round": {"0": 10}}
    for stem, row in (("table", earlier_row), ("trajectory", earlier_curve)):
        saved = {"results": {"fedot-d0.5": row, "fedbiot_a4-d0.5": {"seeds": 9}}}
        (results / f"{stem}-fedbiot-tiny.json").write_text(json.dumps(saved))
    argv = [str(config), "--runs-dir", str(tmp_path / "runs"), "--results-dir", str(results)]
    argv += ["--methods", "fedot", "fedbiot_a4", "--dropouts", "0.5", "--trajectory", "--table-only"]
    argv += ["--set", "eval.metrics=[perplexity]"]

    fedbiot_table.main([*argv, "--keep-earlier"])

    table = json.loads((results / "table-fedbiot-tiny.json").read_text())["results"]
    assert table["fedot-d0.5"] == earlier_row and table["fedbiot_a4-d0.5"]["seeds"] == 1
    assert table["fedbiot_a4-d0.5"]["adapfu/perplexity_by_seed"] == {"0": 4.0}
    curves = json.loads((results / "trajectory-fedbiot-tiny.json").read_text())["results"]
    assert curves["fedot-d0.5"] == earlier_curve
    assert list(curves["fedbiot_a4-d0.5"]["rounds"]) == ["0", "1", "2"]
    for stem in ("table", "trajectory"):
        text = (results / f"{stem}-fedbiot-tiny.md").read_text()
        assert "Kept from the previous results file" in text and ": FedOT d=0.5." in text, stem
    # without the flag the row with no run here would be emptied: refused, unless asked for
    with pytest.raises(SystemExit, match=r"table-fedbiot-tiny\.json: .*fedot-d0\.5/adapfu/perplexity"):
        fedbiot_table.main(argv)
    fedbiot_table.main([*argv, "--overwrite"])
    table = json.loads((results / "table-fedbiot-tiny.json").read_text())["results"]
    assert table["fedot-d0.5"]["seeds"] == 0


def test_the_table_names_the_replies_its_runs_rejected(tmp_path: Path) -> None:
    """The default median screen (fed.screen) can turn away an honest client whose update diverged;
    the row is then not the method's plain average, and the table and the trajectory say so."""
    config = ROOT / "configs" / "test" / "fedbiot-tiny.yaml"
    results = tmp_path / "results"
    why = "update norm 25.83 exceeds 10 x the round's median update norm 1.173 (fed.screen)"
    for method, rejected in (("fedot", {"c09": why}), ("fedbiot_a4", {})):
        run = tmp_path / "runs" / "fedbiot-tiny" / f"{method}-d0.5-s0"
        run.mkdir(parents=True)
        (run / "config.yaml").write_text("fed:\n  rounds: 2\n")
        rows = [
            {"round": r, "bytes_up": 10, "bytes_down": 20, "rejected": rejected if r == 1 else {}, "eval": e}
            for r, e in enumerate({"adapfu/perplexity": p, "adapemu/perplexity": p} for p in (9.0, 5.0, 4.0))
        ]
        (run / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    argv = [str(config), "--runs-dir", str(tmp_path / "runs"), "--results-dir", str(results)]
    argv += ["--methods", "fedot", "fedbiot_a4", "--dropouts", "0.5", "--trajectory", "--table-only"]

    fedbiot_table.main([*argv, "--set", "eval.metrics=[perplexity]"])

    for stem in ("table", "trajectory"):
        text = (results / f"{stem}-fedbiot-tiny.md").read_text()
        assert f"- fedot-d0.5-s0, round 1, c09: {why}" in text, stem
        assert "fedbiot_a4-d0.5-s0, round" not in text, stem


def test_summary_reads_the_adapter_shift_over_trained_rounds_and_seeds(tmp_path: Path) -> None:
    runs = []
    traffic = {"bytes_up": 1, "bytes_down": 2, "eval": {}}
    for seed, shifts in ((0, (0.1, 0.3)), (1, (0.4, 0.6))):
        run = tmp_path / f"ablation-eps0-s{seed}"
        run.mkdir()
        (run / "config.yaml").write_text("fed:\n  rounds: 2\n")
        rows: list[dict[str, object]] = [{"round": 0}]
        rows += [
            {"round": rnd, "adapter_shift": shift, "adapter_shift_pct": 10 * shift, **traffic}
            for rnd, shift in enumerate(shifts, start=1)
        ]
        rows[-1]["eval"] = {"adapemu/rougeL": 0.2, "adapfu/rougeL": 0.3}
        (run / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        runs.append(run)

    summary = fedbiot_table.summarise(runs, "rougeL")

    # per seed the mean over rounds 1-2 (0.2 and 0.5), then the mean over seeds
    assert summary["adapter_shift_by_seed"] == {"0": pytest.approx(0.2), "1": pytest.approx(0.5)}
    assert summary["adapter_shift"] == pytest.approx(0.35)
    assert summary["adapter_shift_pct"] == pytest.approx(3.5)
    table = fedbiot_ablation.ablation_markdown(
        load_config(ROOT / "configs" / "test" / "fedbiot-tiny.yaml"),
        "rougeL",
        {"eps0": ["fedbiot.prox_eps=0"]},
        {"eps0": summary},
        "cmd",
    )
    # shifts 0.2 and 0.5: sample std 0.3 / sqrt(2) = 0.21 (2.12 in percent)
    assert (
        "| eps0 | fedbiot.prox_eps=0 | 20.00 ± 0.00 | 30.00 ± 0.00 | - | - | 0.35 ± 0.21 | 3.50 ± 2.12 | 2 |"
        in table
    )


def test_keep_earlier_merges_the_seeds_of_a_row_whose_other_seeds_are_elsewhere(tmp_path: Path) -> None:
    """A row with seed 2's run here and seeds 0-1 run on another machine: with ``--keep-earlier`` the
    seeds asked for that have no run here take the previous file's values, seed by seed (mean and std
    over all of them), the seed that has a run here is read from it, a seed not asked for is not
    taken, and the table names the kept seeds."""
    config = ROOT / "configs" / "test" / "fedbiot-tiny.yaml"
    results = tmp_path / "results"
    results.mkdir()
    run = tmp_path / "runs" / "fedbiot-tiny" / "fedot-d0.5-s2"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("fed:\n  rounds: 1\n")
    trained = {"bytes_up": 10, "bytes_down": 20, "adapter_shift": 0.5, "eval": {"adapfu/perplexity": 6.0}}
    rows = [{"round": 0}, {"round": 1, **trained}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    earlier = {
        "seeds": 3,
        "adapfu/perplexity": 4.0,
        "adapfu/perplexity_by_seed": {"0": 3.0, "1": 5.0, "2": 9.0, "3": 7.0},
        "adapter_shift_by_seed": {"0": 0.1, "1": 0.3, "3": 0.9},
    }
    (results / "table-fedbiot-tiny.json").write_text(json.dumps({"results": {"fedot-d0.5": earlier}}))
    argv = [str(config), "--runs-dir", str(tmp_path / "runs"), "--results-dir", str(results)]
    argv += ["--methods", "fedot", "--dropouts", "0.5", "--seeds", "0", "1", "2", "--table-only"]
    argv += ["--set", "eval.metrics=[perplexity]", "--keep-earlier"]

    with pytest.raises(
        SystemExit, match=r"drop 2 values .*fedot-d0\.5/adapfu/perplexity_by_seed/3.*did not keep them"
    ):
        fedbiot_table.main(argv)  # seed 3, not asked for, would go
    fedbiot_table.main([*argv, "--overwrite"])

    row = json.loads((results / "table-fedbiot-tiny.json").read_text())["results"]["fedot-d0.5"]
    # seed 2 from its run here (6.0, not the earlier 9.0); seed 3 was not asked for
    assert row["adapfu/perplexity_by_seed"] == {"0": 3.0, "1": 5.0, "2": 6.0}
    assert row["adapfu/perplexity"] == pytest.approx(14.0 / 3)
    assert row["adapfu/perplexity_std"] == pytest.approx(float(np.std([3.0, 5.0, 6.0], ddof=1)))  # sample
    assert row["adapter_shift_by_seed"] == {"0": 0.1, "1": 0.3, "2": 0.5}
    assert row["seeds"] == 3 and row["mb_up_per_round"] > 0
    text = (results / "table-fedbiot-tiny.md").read_text()
    assert "4.67 ± 1.53" in text  # 3, 5, 6: sample std sqrt(7 / 3)
    assert "Seeds kept from the previous results file" in text and "FedOT d=0.5: 0, 1" in text


def tiny_argv(tmp_path: Path) -> list[str]:
    config = ROOT / "configs" / "test" / "fedbiot-tiny.yaml"
    argv = [str(config), "--runs-dir", str(tmp_path / "runs"), "--results-dir", str(tmp_path / "results")]
    return [*argv, "--dropouts", "0.4", "--set", "fed.rounds=1"]


def test_the_lr_search_scores_each_method_on_validation_and_names_its_best_lr(tmp_path: Path) -> None:
    # Execute: two methods at two lrs, one seed
    fedbiot_table.main([*tiny_argv(tmp_path), "--methods", "fedot", "fedbiot_a2", "--lrs", "0.01", "0.05"])
    # Assert: every run evaluated on the validation split at its lr; each method has a best lr among them
    runs = tmp_path / "runs" / "fedbiot-tiny"
    for lr in ("0.01", "0.05"):
        for method in ("fedot", "fedbiot_a2"):
            saved = yaml.safe_load((runs / f"lr{lr}-{method}-d0.4-s0" / "config.yaml").read_text())
            assert saved["data"]["eval_split"] == "validation" and saved["train"]["lr"] == float(lr)
            assert saved["fedbiot"]["dropout"] == 0.4
    stem = tmp_path / "results" / "sweep-lr-fedbiot-tiny"
    results = json.loads(stem.with_suffix(".json").read_text())["results"]
    assert set(results["best_lr"]) == {"fedot", "fedbiot_a2"}
    assert set(results["best_lr"].values()) <= {0.01, 0.05}
    text = stem.with_suffix(".md").read_text()
    chosen = " ".join(f"{m}={results['best_lr'][m]:g}" for m in ("fedot", "fedbiot_a2"))
    assert f"`--row-lr {chosen}`" in text and "| FedOT |" in text
    assert stem.with_suffix(".png").read_bytes().startswith(b"\x89PNG")


def test_the_lr_search_keeps_an_lr_whose_runs_are_not_here_with_keep_earlier(tmp_path: Path) -> None:
    # Prepare: the previous file has FedBiOT at 0.05 (its runs removed since), better than anything here
    stem = tmp_path / "results" / "sweep-lr-fedbiot-tiny"
    stem.parent.mkdir(parents=True)
    cell = {"adapemu/rougeL": 0.5, "adapfu/rougeL": 0.7, "adapemu/perplexity": 3.0, "adapfu/perplexity": 2.0}
    stem.with_suffix(".json").write_text(
        json.dumps({"results": {"lr0.05-fedbiot_a2-d0.4": {"seeds": 1, **cell}}})
    )
    argv = [*tiny_argv(tmp_path), "--methods", "fedbiot_a2", "--lrs", "0.01", "0.05", "--table-only"]
    # Execute / Assert: without the flag the write would drop it and is refused; with it, kept and named
    with pytest.raises(SystemExit, match="this write would drop"):
        fedbiot_table.main(argv)
    fedbiot_table.main([*argv, "--keep-earlier"])
    results = json.loads(stem.with_suffix(".json").read_text())["results"]
    assert results["lr0.05-fedbiot_a2-d0.4"]["adapfu/rougeL"] == 0.7 and results["best_lr"] == {
        "fedbiot_a2": 0.05
    }
    text = stem.with_suffix(".md").read_text()
    assert "| FedBiOT (Adapter 2) | - | 50.00 / 70.00 | 0.05 |" in text
    assert "(no run of theirs here, `--keep-earlier`): FedBiOT (Adapter 2) at lr 0.05." in text


def test_the_lr_search_merges_seed_by_seed_a_cell_whose_other_seeds_are_elsewhere(tmp_path: Path) -> None:
    """A search extended to seeds 1-2 on a machine that no longer has seed 0's run: with
    ``--keep-earlier`` the cell takes seed 0 from the previous file and seed 1 from its run here (the
    mean over both decides the best lr), and the file names the seed it kept."""
    # Prepare: seed 1's run of FedBiOT at 0.01 is here; the previous file has seed 0 of both lrs
    run = tmp_path / "runs" / "fedbiot-tiny" / "lr0.01-fedbiot_a2-d0.4-s1"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("fed:\n  rounds: 1\ntrain:\n  lr: 0.01\n")
    trained = {"bytes_up": 10, "bytes_down": 20, "adapter_shift": 0.5}
    scores = {"adapemu/perplexity": 10.0, "adapfu/perplexity": 4.0}
    rows = [{"round": 0}, {"round": 1, **trained, "eval": scores}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    stem = tmp_path / "results" / "sweep-lr-fedbiot-tiny"
    stem.parent.mkdir(parents=True)

    def seed_zero(lr: float, emu: float, fu: float) -> dict[str, Any]:
        by_seed = {"adapemu/perplexity_by_seed": {"0": emu}, "adapfu/perplexity_by_seed": {"0": fu}}
        return {"seeds": 1, "lr": lr, "adapemu/perplexity": emu, "adapfu/perplexity": fu, **by_seed}

    earlier = {
        "lr0.01-fedbiot_a2-d0.4": seed_zero(0.01, 30.0, 8.0),
        "lr0.05-fedbiot_a2-d0.4": seed_zero(0.05, 16.0, 6.0),
    }
    stem.with_suffix(".json").write_text(json.dumps({"results": earlier}))
    argv = [*tiny_argv(tmp_path), "--methods", "fedbiot_a2", "--lrs", "0.01", "0.05", "--seeds", "0", "1"]
    argv += ["--set", "eval.metrics=[perplexity]", "--table-only", "--keep-earlier"]
    # Execute
    fedbiot_table.main(argv)
    # Assert: 0.01 is seed 0 (kept) and seed 1 (here): 20 / 6, score 13; 0.05 keeps its one seed whole
    # (16 / 6, score 11) and is the best lr
    results = json.loads(stem.with_suffix(".json").read_text())["results"]
    cell = results["lr0.01-fedbiot_a2-d0.4"]
    assert cell["adapemu/perplexity_by_seed"] == {"0": 30.0, "1": 10.0} and cell["seeds"] == 2
    assert cell["adapemu/perplexity"] == pytest.approx(20.0)
    assert cell["adapfu/perplexity"] == pytest.approx(6.0)
    assert results["best_lr"] == {"fedbiot_a2": 0.05}
    text = stem.with_suffix(".md").read_text()
    assert "| FedBiOT (Adapter 2) | 20.00 / 6.00 | 16.00 / 6.00 (1 seed) | 0.05 |" in text
    assert "Seeds kept from the previous results file" in text and "FedBiOT (Adapter 2) at lr 0.01: 0" in text
    assert "(no run of theirs here, `--keep-earlier`): FedBiOT (Adapter 2) at lr 0.05." in text


def test_best_lr_takes_the_higher_mean_of_both_outputs_then_lower_perplexity() -> None:
    from argparse import Namespace

    from experiments import fedbiot_lr

    args = Namespace(methods=["fedot", "fedbiot_a2"], lrs=[0.01, 0.02, 0.05], dropouts=[0.2])

    def cell(emu: float, fu: float, ppl: float) -> dict[str, float]:
        return {"adapemu/rougeL": emu, "adapfu/rougeL": fu, "adapfu/perplexity": ppl}

    results = {
        # FedOT: 0.02's mean (0.3) beats 0.01's (0.25) though 0.01 has the best single output
        "lr0.01-fedot-d0.2": cell(0.1, 0.4, 9.0),
        "lr0.02-fedot-d0.2": cell(0.3, 0.3, 9.0),
        "lr0.05-fedot-d0.2": {"adapemu/rougeL": 0.9},  # AdapFu missing: not finished, not a candidate
        # FedBiOT: a tie on the mean goes to the lower AdapFu perplexity
        "lr0.01-fedbiot_a2-d0.2": cell(0.2, 0.2, 8.0),
        "lr0.02-fedbiot_a2-d0.2": cell(0.2, 0.2, 7.0),
        "lr0.05-fedbiot_a2-d0.2": cell(0.1, 0.2, 1.0),
    }
    assert fedbiot_lr.best_lrs(args, results, "rougeL") == {"fedot": 0.02, "fedbiot_a2": 0.02}
    # On perplexity lower is better
    ppl = {k: {"adapemu/perplexity": v.get("adapfu/perplexity", 0), **v} for k, v in results.items()}
    ppl = {k: {**v, "adapfu/perplexity": v.get("adapfu/perplexity", 50.0)} for k, v in ppl.items()}
    assert fedbiot_lr.best_lrs(args, ppl, "perplexity")["fedbiot_a2"] == 0.05


def test_row_lr_runs_a_method_at_its_own_lr_and_the_table_says_which(tmp_path: Path) -> None:
    argv = [*tiny_argv(tmp_path), "--methods", "fedot", "fedbiot_a2", "--row-lr", "fedbiot_a2=0.02"]
    fedbiot_table.main(argv)
    runs = tmp_path / "runs" / "fedbiot-tiny"
    own = yaml.safe_load((runs / "fedbiot_a2-d0.4-lr0.02-s0" / "config.yaml").read_text())["train"]["lr"]
    other = yaml.safe_load((runs / "fedot-d0.4-s0" / "config.yaml").read_text())["train"]["lr"]
    assert own == 0.02 and other == load_config(ROOT / "configs" / "test" / "fedbiot-tiny.yaml").train.lr
    assert not (runs / "fedbiot_a2-d0.4-s0").exists()
    table = (tmp_path / "results" / "table-fedbiot-tiny.md").read_text()
    assert "| method | lr |" in table
    assert "| FedBiOT (Adapter 2) | 0.02 |" in table and f"| FedOT | {other:g} |" in table


def test_jobs_start_runs_together_one_thread_each_sharing_the_initial_distillation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from experiments.tables import runs as table_runs

    started: list[tuple[str, int | None, list[str]]] = []
    at_once: list[int] = []

    def pool(config: Path, runs: Any, *, jobs: int = 1, threads: int | None = 1) -> None:
        at_once.append(jobs)
        started.extend((run_dir.name, threads, list(overrides)) for run_dir, overrides in runs.items())

    monkeypatch.setattr(table_runs, "run_all", pool)
    argv = [*tiny_argv(tmp_path), "--methods", "fedot", "fedbiot_a2"]
    fedbiot_table.main([*argv, "--jobs", "2"])
    cache = f"fedbiot.init_cache={tmp_path / 'runs' / 'fedbiot-tiny' / 'emulator-init'}"
    assert at_once == [2]
    assert [(name, threads) for name, threads, _ in started] == [
        ("fedot-d0.4-s0", 1),
        ("fedbiot_a2-d0.4-s0", 1),
    ]
    assert all(cache in overrides for _, _, overrides in started)
    # One job alone keeps every core (the threads the environment gives it).
    started.clear()
    fedbiot_table.main(argv)
    assert at_once == [2, 1] and {threads for _, threads, _ in started} == {None}


@pytest.mark.parametrize(
    ("entry", "problem"), [("fedot", "give ROW=LR"), ("nope=0.1", "unknown row 'nope'"), ("fedot=-1", "> 0")]
)
def test_a_bad_row_lr_is_a_usage_error_naming_it(
    entry: str, problem: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with pytest.raises(SystemExit):
        fedbiot_table.main([*tiny_argv(tmp_path), "--table-only", "--row-lr", entry])
    assert problem in capsys.readouterr().err and not (tmp_path / "runs").exists()


def test_the_lr_search_refuses_a_config_that_evaluates_on_another_dataset(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    argv = [
        str(ROOT / "configs" / "paper" / "fedbiot-code.yaml"),
        "--runs-dir",
        str(tmp_path),
        "--lrs",
        "0.01",
    ]
    with pytest.raises(SystemExit):
        fedbiot_table.main(argv)
    err = capsys.readouterr().err
    assert "data.eval_dataset 'humaneval'" in err and "validation split" in err
    assert not (tmp_path / "fedbiot-code").exists()


def test_the_lm_rows_are_the_baselines_with_their_papers_lm_term() -> None:
    config = ROOT / "configs" / "paper" / "fedbiot-math.yaml"
    for plain, with_lm in (("offsite", "offsite_lm"), ("fedot", "fedot_lm")):
        a = load_config(config, fedbiot_rows.METHODS[plain])
        b = load_config(config, fedbiot_rows.METHODS[with_lm])
        assert a.fedbiot.align_lm == 0 and b.fedbiot.align_lm == pytest.approx(1 / 30, rel=0.02)
        assert b.fedbiot.align_lambda == 0 and b.fed.mode == a.fed.mode
        assert b.fedbiot.model_dump(exclude={"align_lm"}) == a.fedbiot.model_dump(exclude={"align_lm"})
    assert set(fedbiot_rows.ON_DEMAND) <= set(fedbiot_rows.BASELINES)


def test_each_interval_uses_the_seeds_the_two_rows_share_not_those_of_every_row() -> None:
    # Prepare: FedOT (+LM) and FedBiOT at 3 seeds, Offsite-tuning at seed 0 only (kept from an earlier file)
    def row(*values: float) -> dict[str, Any]:
        return {"adapfu/perplexity_by_seed": {str(seed): v for seed, v in enumerate(values)}}

    results = {
        "offsite-d0.2": row(3.1),
        "fedot_lm-d0.2": row(2.75, 2.50, 2.60),
        "fedbiot_a2-d0.2": row(2.72, 2.60, 2.65),
    }
    # Execute
    [check] = fedbiot_table.ordering_checks(results, "perplexity", [0.2])
    # Assert: the means compare on seed 0 (every row has it); FedOT (+LM)'s interval has its 3 seeds
    assert check.startswith("d=0.2, AdapFu, 1 seed(s): FedBiOT (Adapter 2) 2.72 vs Offsite-tuning 3.1")
    assert "vs Offsite-tuning one seed (gain 0.38)" in check
    assert "vs FedOT (+LM) tie (gain -0.04, 95% CI [" in check and "3 seeds)" in check


def test_the_lr_search_plots_perplexity_where_the_metric_is_one_value_everywhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Exact match 0 at every lr of every method (math at 135M): a plot of flat zeros says nothing, and the
    best lr came from the perplexity tie-break; the panels show that perplexity, and the title says why."""
    from argparse import Namespace

    from experiments import fedbiot_lr, plots

    cfg = load_config(ROOT / "configs" / "test" / "fedbiot-tiny.yaml")
    args = Namespace(dropouts=[0.2], lrs=[0.01, 0.02], methods=["fedot", "fedbiot_a2"], seeds=[0])
    results: dict[str, Any] = {"best_lr": {"fedot": 0.01, "fedbiot_a2": 0.02}}
    for lr in args.lrs:
        for method in args.methods:
            values = {f"{o}/exact_match": 0.0 for o in fedbiot_lr.OUTPUTS}
            values |= {f"{o}/perplexity": 10.0 * lr for o in fedbiot_lr.OUTPUTS}
            results[fedbiot_lr.sweep_key(lr, method, 0.2)] = values
    drawn: list[dict[str, Any]] = []
    finish = plots.finish_grid

    def spy(figure: Any, axes: Any, first: Any, **kwargs: Any) -> Path:
        drawn.append(kwargs | {"y": [list(line.get_ydata()) for line in axes[0].get_lines()]})
        return finish(figure, axes, first, **kwargs)

    monkeypatch.setattr(plots, "finish_grid", spy)
    fedbiot_lr.plot_sweep(cfg, args, results, "exact_match", tmp_path / "flat.png")
    assert drawn[-1]["ylabel"] == "validation perplexity" and drawn[-1]["log_y"]
    assert "exact_match is 0 everywhere" in drawn[-1]["title"]
    assert [0.1, 0.2] in drawn[-1]["y"]
    # Where the metric separates the lrs, it is what the panels show.
    results[fedbiot_lr.sweep_key(0.02, "fedot", 0.2)]["adapfu/exact_match"] = 0.25
    fedbiot_lr.plot_sweep(cfg, args, results, "exact_match", tmp_path / "moves.png")
    assert drawn[-1]["ylabel"] == "validation exact_match (x 100)" and not drawn[-1]["log_y"]


def _one_and_three_seed_cells() -> tuple[Any, Any, dict[str, Any]]:
    """Adapter 4's search on code as it was run: 5e-3 on seed 0 alone, 1e-2 on seeds 0-2."""
    from argparse import Namespace

    from experiments import fedbiot_lr

    cfg = load_config(ROOT / "configs" / "test" / "fedbiot-tiny.yaml")
    args = Namespace(dropouts=[0.2], lrs=[0.005, 0.01], methods=["fedbiot_a4"], seeds=[0, 1, 2])
    cell = {"adapemu/perplexity": 30.0, "adapfu/perplexity": 9.0}
    results: dict[str, Any] = {
        fedbiot_lr.sweep_key(0.005, "fedbiot_a4", 0.2): {"seeds": 1, **cell},
        fedbiot_lr.sweep_key(0.01, "fedbiot_a4", 0.2): {"seeds": 3, **cell},
    }
    return cfg, args, results


def test_a_search_cell_on_fewer_seeds_than_asked_says_how_many() -> None:
    """A search extended to more seeds only where its choice was close (adapter 4 on code, one step below
    where one seed diverged) mixes cells of 3 seeds and of 1: each cell with fewer says so."""
    from experiments import fedbiot_lr

    cfg, args, results = _one_and_three_seed_cells()
    results["best_lr"] = fedbiot_lr.best_lrs(args, results, "perplexity")
    text = fedbiot_lr.sweep_text(cfg, args, results, "perplexity", "cmd")
    assert "| FedBiOT (Adapter 4) | 30.00 / 9.00 (1 seed) | 30.00 / 9.00 | 0.005 |" in text
    assert "A cell with fewer seeds than asked names how many it has" in text
    results[fedbiot_lr.sweep_key(0.005, "fedbiot_a4", 0.2)]["seeds"] = 3
    assert "fewer seeds" not in fedbiot_lr.sweep_text(cfg, args, results, "perplexity", "cmd")


def test_the_lr_search_plot_marks_the_cells_on_fewer_seeds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One line joins a 1-seed cell and a 3-seed one (adapter 4 on code): the 1-seed point is drawn hollow,
    and the title says what a hollow point is; where every cell has every seed, no point is hollow."""
    from experiments import fedbiot_lr, plots

    cfg, args, results = _one_and_three_seed_cells()
    drawn: list[dict[str, Any]] = []
    finish = plots.finish_grid

    def spy(figure: Any, axes: Any, first: Any, **kwargs: Any) -> Path:
        hollow = [
            list(line.get_xdata())
            for ax in axes
            for line in ax.get_lines()
            if line.get_markerfacecolor() == "white" and line.get_marker() not in (None, "None", "")
        ]
        drawn.append(kwargs | {"hollow": hollow})
        return finish(figure, axes, first, **kwargs)

    monkeypatch.setattr(plots, "finish_grid", spy)
    fedbiot_lr.plot_sweep(cfg, args, results, "perplexity", tmp_path / "mixed.png")
    assert drawn[-1]["hollow"] == [[0.005], [0.005]]  # one per panel (AdapEmu, AdapFu)
    assert "hollow: fewer seeds than 3" in drawn[-1]["title"]
    results[fedbiot_lr.sweep_key(0.005, "fedbiot_a4", 0.2)]["seeds"] = 3
    fedbiot_lr.plot_sweep(cfg, args, results, "perplexity", tmp_path / "full.png")
    assert drawn[-1]["hollow"] == [] and "hollow" not in drawn[-1]["title"]
