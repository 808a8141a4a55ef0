"""experiments/fedpt_table.py: what defines a method wins over ``--set``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from experiments import fedpt_rows, fedpt_table, tables

from fedtune.config import load_config
from tests.integration.helpers import ROOT

# The runs of these tables run in this process (tests/conftest.py): a subprocess each cost ~8 s of imports.
pytestmark = pytest.mark.usefixtures("fedtune_in_process")


def test_fedavg_large_stays_on_the_large_model_when_set_changes_the_small_one() -> None:
    from fedtune.config import load_config

    config = ROOT / "configs" / "paper" / "fedpt-smollm2.yaml"
    extra = ["model.name=smollm2-135m-instruct-l20"]
    cfg = load_config(config, extra)
    models = {
        method: load_config(config, fedpt_rows.run_overrides(method, cfg, extra)).model.name
        for method in ("fedavg_large", "fedavg_small", "fedpt")
    }

    assert models["fedavg_large"] == cfg.fedpt.large_model == "smollm2-135m-instruct"
    assert models["fedavg_small"] == models["fedpt"] == "smollm2-135m-instruct-l20"


def test_small_model_study_runs_each_client_model_and_measures_fedpt_against_fedavg_large(
    tmp_path: Path,
) -> None:
    config = ROOT / "configs" / "test" / "fedpt-tiny.yaml"
    argv = [str(config), "--runs-dir", str(tmp_path / "runs"), "--results-dir", str(tmp_path / "results")]
    argv += ["--small-models", "tiny-llama", "tiny-llama-L4-H64", "--set", "fed.rounds=1"]
    fedpt_table.main(argv)
    runs = tmp_path / "runs"
    # the config's own small model under the table's directory, the large one under <name>-l<layers>
    assert (runs / "fedpt-tiny" / "fedpt" / "metrics.jsonl").is_file()
    saved = yaml.safe_load((runs / "fedpt-tiny-l4" / "fedavg_small" / "config.yaml").read_text())
    assert saved["model"]["name"] == "tiny-llama-L4-H64" and saved["algorithm"] == "fedit"
    results = json.loads((tmp_path / "results" / "study-small-fedpt-tiny.json").read_text())["results"]
    small, large = results["tiny-llama"], results["tiny-llama-L4-H64"]
    assert (small["layers"], large["layers"]) == (2, 4)
    gap = small["fedpt"]["rougeL"] - large["fedavg_small"]["rougeL"]
    text = (tmp_path / "results" / "study-small-fedpt-tiny.md").read_text()
    assert f"| {gap:+.4f} |" in text
    assert (tmp_path / "results" / "study-small-fedpt-tiny.png").read_bytes().startswith(b"\x89PNG")


def test_training_seeds_run_apart_and_the_table_counts_the_seeds_each_ordering_holds_in(
    tmp_path: Path,
) -> None:
    config = ROOT / "configs" / "test" / "fedpt-tiny.yaml"
    argv = [str(config), "--runs-dir", str(tmp_path / "runs"), "--results-dir", str(tmp_path / "results")]
    argv += ["--methods", "fedavg_pt", "fedpt", "--seeds", "0", "1", "--no-memory"]
    argv += ["--set", "fed.rounds=1"]
    fedpt_table.main(argv)
    runs = tmp_path / "runs" / "fedpt-tiny"
    # the config's seed (0) keeps the method's name; another seed runs as its own run with its seed
    assert yaml.safe_load((runs / "fedpt" / "config.yaml").read_text())["seed"] == 0
    assert yaml.safe_load((runs / "fedpt-s1" / "config.yaml").read_text())["seed"] == 1
    results = json.loads((tmp_path / "results" / "table-fedpt-tiny.json").read_text())["results"]
    fedpt = results["fedpt"]
    assert fedpt["training_seeds"] == ["0", "1"]
    by_seed = fedpt["eval"]["rougeL_by_seed"]
    assert fedpt["eval"]["rougeL"] == (by_seed["0"] + by_seed["1"]) / 2
    text = (tmp_path / "results" / "table-fedpt-tiny.md").read_text()
    assert "mean ± std over 2 training seeds" in text
    assert "FedAvg+PT <= FedPT: " in text and " of 2 training seeds; by interval: " in text
    # the claim's paired interval over the 2 seeds (tiny runs may tie in both: then it says no spread)
    pt_by_seed = results["fedavg_pt"]["eval"]["rougeL_by_seed"]
    interval = tables.paired_interval(pt_by_seed, by_seed)
    assert interval.seeds == 2 and f"by interval: {interval.text(4)})" in text
    assert f"| FedPT | {by_seed['0']:.4f} | {by_seed['1']:.4f} |" in text


def test_over_training_seeds_takes_the_std_over_seeds_and_keeps_one_seed_as_it_is() -> None:
    one = {"rougeL": 0.2, "rougeL_std": 0.05, "alpha": 1.5, "alpha_study/1.0": 0.1}
    assert fedpt_table.over_training_seeds({"0": one}) == one
    two = fedpt_table.over_training_seeds(
        {"0": one, "1": {"rougeL": 0.4, "rougeL_std": 0.01, "alpha": 2.0, "alpha_study/1.0": 0.3}}
    )
    assert abs(two["rougeL"] - 0.3) < 1e-12
    # over the training seeds, not the sampling seeds: 0.2 and 0.4, sample std 0.1 * sqrt(2)
    assert abs(two["rougeL_std"] - 0.1 * 2**0.5) < 1e-12
    assert two["rougeL_by_seed"] == {"0": 0.2, "1": 0.4}
    assert two["alpha_by_seed"] == {"0": 1.5, "1": 2.0} and "alpha" not in two
    assert not any(key.startswith("alpha_study/") for key in two)


def test_keep_earlier_takes_a_missing_seed_from_the_previous_results_and_names_it(tmp_path: Path) -> None:
    """Seed 0 of FedAvg (large) ran on another machine: its value (and Base (large)'s, its round 0)
    comes from the previous results file, whether that file held seed 0 alone or several seeds."""
    from fedtune.config import load_config

    cfg = load_config(ROOT / "configs" / "test" / "fedpt-tiny.yaml", ["fed.rounds=1"])

    def fake_run(name: str, base: float, final: float) -> Path:
        run = tmp_path / name
        run.mkdir()
        (run / "config.yaml").write_text("fed:\n  rounds: 1\n")
        rows = [
            {"round": 0, "eval": {"rougeL": base}},
            {"round": 1, "bytes_up": 2**20, "eval": {"rougeL": final}},
        ]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return run

    runs = {"fedavg_large": {0: tmp_path / "gone", 1: fake_run("fedavg_large-s1", 0.1, 0.3)}}
    alone = {
        "fedavg_large": {
            "eval": {"rougeL": 0.5, "rougeL_std": 0.01},
            "training_seeds": ["0"],
            "total_mb": 1.0,
        },
        "base_large": {"eval": {"rougeL": 0.2, "rougeL_std": 0.02}, "training_seeds": ["0"], "total_mb": 0.0},
    }
    several = {
        "fedavg_large": {
            "eval": {"rougeL": 0.6, "rougeL_std": 0.1, "rougeL_by_seed": {"0": 0.5, "2": 0.7}},
            "training_seeds": ["0", "2"],
            "total_mb": 1.0,
        },
        "base_large": {
            "eval": {"rougeL": 0.2, "rougeL_std": 0.0, "rougeL_by_seed": {"0": 0.2, "2": 0.2}},
            "training_seeds": ["0", "2"],
            "total_mb": 0.0,
        },
    }
    for earlier in (alone, several):
        results = fedpt_table.tabulate(cfg, runs, {}, earlier)

        large, base = results["fedavg_large"], results["base_large"]
        assert large["training_seeds"] == base["training_seeds"] == ["0", "1"]
        assert large["eval"]["rougeL_by_seed"] == {"0": 0.5, "1": 0.3}
        assert base["eval"]["rougeL_by_seed"] == {"0": 0.2, "1": 0.1}
        assert large["kept_seeds"] == base["kept_seeds"] == ["0"]
        assert large["total_mb"] == 1.0  # seed 0's recorded 1 MB and seed 1's 1 MiB up, in MB of 2**20
        text = fedpt_table.markdown(cfg, results, "cmd")
        assert "(runs not here, `--keep-earlier`): Base (large) seed 0; FedAvg (large) seed 0." in text
    # without it the missing seed is left out, as before
    assert fedpt_table.tabulate(cfg, runs, {})["fedavg_large"]["training_seeds"] == ["1"]


def test_keep_earlier_refuses_a_seed_measured_at_another_lr(tmp_path: Path) -> None:
    """FedAvg (large) asked at lr 0.01 whose seed 0 the previous file measured at 0.001 (no run here):
    refused, naming the row and both lrs; at the recorded lr the seed is kept and the row shows it."""
    config = ROOT / "configs" / "test" / "fedpt-tiny.yaml"
    results_dir = tmp_path / "results"
    results_dir.mkdir()
    kept = {"eval": {"rougeL": 0.5}, "training_seeds": ["0"], "total_mb": 1.0, "lr": 0.001}
    (results_dir / "table-fedpt-tiny.json").write_text(json.dumps({"results": {"fedavg_large": kept}}))
    argv = [str(config), "--runs-dir", str(tmp_path / "runs"), "--results-dir", str(results_dir)]
    argv += ["--methods", "fedavg_large", "--seeds", "0", "--table-only", "--no-memory", "--keep-earlier"]
    with pytest.raises(
        SystemExit, match=r"FedAvg \(large\): .*seeds 0, measured at lr 0\.001, .* lr 0\.01\b"
    ):
        fedpt_table.main([*argv, "--row-lr", "fedavg_large=0.01"])
    fedpt_table.main([*argv, "--row-lr", "fedavg_large=0.001"])
    row = json.loads((results_dir / "table-fedpt-tiny.json").read_text())["results"]["fedavg_large"]
    assert row["kept_seeds"] == ["0"] and row["lr"] == 0.001
    # Without --row-lr the row trains at the config's lr: the seed measured at 0.001 cannot join it.
    config_lr = load_config(config).train.lr
    assert config_lr != 0.001
    with pytest.raises(SystemExit, match=rf"measured at lr 0\.001, into the row now at lr {config_lr:g}"):
        fedpt_table.main(argv)


def test_a_table_of_one_method_has_no_empty_ordering_note() -> None:
    sets = [("instruct", "")]
    one = {"fedpt": {"eval": {"rougeL": 0.2, "rougeL_std": 0.01}}}
    assert fedpt_table.ordering_note(one, sets) == ""
    two = {**one, "fedavg_pt": {"eval": {"rougeL": 0.1, "rougeL_std": 0.01}}}
    assert "FedAvg+PT <= FedPT: holds" in fedpt_table.ordering_note(two, sets)


def test_lr_search_on_validation_then_a_row_at_its_own_lr(tmp_path: Path) -> None:
    config = ROOT / "configs" / "test" / "fedpt-tiny.yaml"
    argv = [str(config), "--runs-dir", str(tmp_path / "runs"), "--results-dir", str(tmp_path / "results")]
    argv += ["--methods", "fedavg_small", "--set", "fed.rounds=1", "--no-memory"]
    fedpt_table.main([*argv, "--lrs", "0.001", "0.01"])
    runs = tmp_path / "runs" / "fedpt-tiny"
    saved = yaml.safe_load((runs / "lr0.01-fedavg_small-s0" / "config.yaml").read_text())
    assert saved["data"]["eval_split"] == "validation" and saved["train"]["lr"] == 0.01
    assert saved["algorithm"] == "fedit"
    recorded = json.loads((tmp_path / "results" / "sweep-lr-fedpt-tiny.json").read_text())["results"]
    scores = {lr: recorded[f"lr{lr:g}-fedavg_small"]["rougeL"] for lr in (0.001, 0.01)}
    best = max(scores, key=lambda lr: (scores[lr], -lr))
    assert recorded["best_lr"] == {"fedavg_small": best}
    text = (tmp_path / "results" / "sweep-lr-fedpt-tiny.md").read_text()
    assert (
        text.rstrip().endswith(f"`--row-lr fedavg_small={best:g}`") and "validation Rouge-L (x 100)" in text
    )
    fedpt_table.main(
        ["--render", str(tmp_path / "results" / "sweep-lr-fedpt-tiny.json"), "--results-dir", str(tmp_path)]
    )
    assert (tmp_path / "sweep-lr-fedpt-tiny.md").read_text() == text

    fedpt_table.main([*argv, "--row-lr", "fedavg_small=0.01"])
    saved = yaml.safe_load((runs / "fedavg_small-lr0.01" / "config.yaml").read_text())
    assert saved["train"]["lr"] == 0.01 and saved["data"]["eval_split"] == "test"
    table = (tmp_path / "results" / "table-fedpt-tiny.md").read_text()
    assert "Rows at their own lr (`--row-lr`; the others at the config's " in table
    assert ": FedAvg (small) 0.01." in table
