"""Smoke test of experiments/perfit_table.py on the tiny config: runs two rows, tabulates, plots the masks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from experiments import perfit_masks, perfit_table

from fedtune.config import load_config
from tests.integration.helpers import ROOT


def test_table_runs_rows_tabulates_and_plots_masks(tmp_path: Path) -> None:
    config = ROOT / "configs" / "test" / "perfit-tiny.yaml"
    argv = [str(config), "--runs-dir", str(tmp_path / "runs"), "--results-dir", str(tmp_path / "results")]
    argv += ["--rows", "fit", "standalone", "perfit_s0.5", "--jobs", "2"]
    argv += ["--set", "fed.rounds=1", "--set", "eval.metrics=[perplexity,rougeL]"]
    argv += ["--set", "perfit.sparsity=0.9"]  # a row's own keys win over --set
    perfit_table.main(argv)
    saved = (tmp_path / "runs" / "perfit-tiny" / "perfit_s0.5-pathological-s0" / "config.yaml").read_text()
    assert yaml.safe_load(saved)["perfit"]["sparsity"] == 0.5
    table = (tmp_path / "results" / "table-perfit-tiny.md").read_text()
    assert "| FIT (FedIT, rank r) | pathological |" in table and "| PerFIT s = 0.5 | pathological |" in table
    assert "| Standalone (rank r, own data only) | pathological |" in table
    assert "- pathological, PerFIT s = 0.5 < FIT:" in table and "personal Rouge-L" in table
    assert "| rounds sampled | clients | base | FIT (FedIT, rank r) | Standalone" in table  # same sampling
    results = json.loads((tmp_path / "results" / "table-perfit-tiny.json").read_text())["results"]
    assert results["perfit_s0.5-pathological"]["seeds"] == 1
    assert len(results["perfit_s0.5-pathological"]["by_client"]) == 4
    for row in ("fit", "standalone", "perfit_s0.5"):
        assert set(results[f"{row}-pathological"]["personal/rougeL_by_seed"]) == {"0"}
    masks = results["masks"]
    assert masks["modules"] == ["k_proj", "q_proj", "v_proj"] and len(masks["overlap"]) == 4
    assert sum(group["pairs"] for group in masks["by_shared"].values()) == 6  # 4 clients, 6 pairs
    assert "Mask overlap (Jaccard) between the 4 searched clients of one PerFIT run" in table
    assert (tmp_path / "results" / "table-perfit-tiny-masks.png").read_bytes().startswith(b"\x89PNG")
    perfit_table.main([*argv, "--table-only"])


def _fake_run(path: Path, ppl: float, rounds: int = 2, lr: float | None = None) -> Path:
    path.mkdir(parents=True)
    train = "" if lr is None else f"train:\n  lr: {lr}\n"
    (path / "config.yaml").write_text(f"fed:\n  rounds: {rounds}\n{train}")
    rows = [
        {"round": 0, "eval": {perfit_table.METRIC: 20.0}},
        {"round": rounds, "bytes_up": 3e6, "bytes_down": 1e6, "eval": {perfit_table.METRIC: ppl}},
    ]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_keep_earlier_fills_only_the_seeds_asked_for_whose_runs_are_missing(tmp_path: Path) -> None:
    runs = [tmp_path / f"perfit_s0.5-pathological-s{seed}" for seed in (0, 1, 2)]
    _fake_run(runs[1], 10.0)
    _fake_run(tmp_path / "unfinished", 1.0)  # not a seed of the table
    earlier = {
        f"{perfit_table.METRIC}_by_seed": {"0": 12.0, "1": 99.0, "7": 1.0},
        "by_client": {"c00": 5.0},
        "mb_up_per_round": 8.0,
    }
    alone = perfit_table.summarise(runs)
    assert alone["seeds"] == 1 and alone[perfit_table.METRIC] == 10.0 and "carried_seeds" not in alone
    result = perfit_table.summarise(runs, earlier)
    # seed 0 is carried, seed 1's own run wins over the earlier 99, seed 2 has neither, seed 7 was not asked
    assert result["carried_seeds"] == ["0"] and result["seeds"] == 2
    assert result[f"{perfit_table.METRIC}_by_seed"] == {"0": 12.0, "1": 10.0}
    # 12 and 10: sample std sqrt(1 + 1) = 1.41
    assert result[perfit_table.METRIC] == 11.0 and result[f"{perfit_table.METRIC}_std"] == pytest.approx(
        2**0.5
    )
    # the facts of a row come from its first seed: carried here, so they are the earlier ones
    assert result["by_client"] == {"c00": 5.0} and result["mb_up_per_round"] == 8.0
    only_earlier = perfit_table.summarise(runs[:1], earlier | {"lr": 0.01})
    assert only_earlier["seeds"] == 1 and only_earlier["carried_seeds"] == ["0"]
    assert only_earlier["by_client"] == {"c00": 5.0} and only_earlier["mb_up_per_round"] == 8.0
    # a row none of whose runs is here keeps the lr its values were measured at (no run tells it here)
    assert only_earlier["lr"] == 0.01
    later = perfit_table.summarise(runs[1:], {f"{perfit_table.METRIC}_by_seed": {"2": 8.0}})
    assert later["carried_seeds"] == ["2"] and later[perfit_table.METRIC] == 9.0
    assert later["mb_up_per_round"] == 3.0 and later["before"] == 20.0  # seed 1's own run


def test_keep_earlier_refuses_to_carry_seeds_measured_at_another_lr(tmp_path: Path) -> None:
    """A row asked at its own lr (run directories ``<key>-lr<lr>-s<seed>``) cannot take seeds the previous
    file measured at another lr: refused, naming the row and both lrs, whether or not a run is here."""
    runs = [tmp_path / f"perfit_s0.5-pathological-lr0.01-s{seed}" for seed in (0, 1)]
    earlier = {f"{perfit_table.METRIC}_by_seed": {"0": 12.0}, "lr": 0.001}
    with pytest.raises(
        SystemExit, match=r"perfit_s0\.5-pathological: .*seeds 0, measured at lr 0\.001, .* lr 0\.01\b"
    ):
        perfit_table.summarise(runs, earlier)  # no run here: the asked lr is the directories'
    _fake_run(runs[1], 10.0, lr=0.01)
    with pytest.raises(SystemExit, match=r"lr 0\.001"):
        perfit_table.summarise(runs, earlier)
    same = perfit_table.summarise(runs, earlier | {"lr": 0.01})
    assert same["carried_seeds"] == ["0"] and same["lr"] == 0.01


def test_keep_earlier_refuses_seeds_at_a_tuned_lr_for_a_row_now_at_the_configs_lr(tmp_path: Path) -> None:
    """A row asked without ``--row-lr`` trains at the config's lr: seeds the previous file measured at a
    row's own lr cannot join it, even with no run here to read the lr from."""
    config = ROOT / "configs" / "test" / "perfit-tiny.yaml"
    results_dir = tmp_path / "results"
    results_dir.mkdir()
    key = "perfit_s0.5-pathological"
    earlier = {key: {f"{perfit_table.METRIC}_by_seed": {"0": 12.0}, "lr": 0.5, "before": 20.0}}
    earlier[key] |= {"mb_up_per_round": 1.0, "mb_down_per_round": 1.0}
    (results_dir / "table-perfit-tiny.json").write_text(json.dumps({"results": {**earlier, "masks": {}}}))
    argv = [str(config), "--runs-dir", str(tmp_path / "runs"), "--results-dir", str(results_dir)]
    argv += ["--rows", "perfit_s0.5", "--seeds", "0", "--table-only", "--keep-earlier"]
    config_lr = load_config(config).train.lr
    refused = rf"seeds 0, measured at lr 0\.5, into the row now at lr {config_lr:g}"
    with pytest.raises(SystemExit, match=refused):
        perfit_table.main(argv)
    assert json.loads((results_dir / "table-perfit-tiny.json").read_text())["results"][key]["lr"] == 0.5


def test_keep_earlier_names_the_kept_seeds_in_the_table(tmp_path: Path) -> None:
    config = ROOT / "configs" / "test" / "perfit-tiny.yaml"
    results_dir = tmp_path / "results"
    results_dir.mkdir()
    key = "perfit_s0.5-pathological"
    earlier = {key: {f"{perfit_table.METRIC}_by_seed": {"0": 12.0, "1": 14.0}, "mb_up_per_round": 1.0}}
    earlier[key] |= {"mb_down_per_round": 1.0, "before": 20.0}
    (results_dir / "table-perfit-tiny.json").write_text(json.dumps({"results": {**earlier, "masks": {}}}))
    argv = [str(config), "--runs-dir", str(tmp_path / "runs"), "--results-dir", str(results_dir)]
    argv += ["--rows", "perfit_s0.5", "--seeds", "0", "1", "--table-only"]
    perfit_table.main([*argv, "--keep-earlier"])
    table = (results_dir / "table-perfit-tiny.md").read_text()
    assert "| PerFIT s = 0.5 | pathological | 20.00 | 13.00 ± 1.41 |" in table  # 12, 14: sample std 1.41
    assert "- PerFIT s = 0.5, pathological: seeds 0, 1" in table and "--keep-earlier" in table
    with pytest.raises(SystemExit, match=r"table-perfit-tiny\.json: this write would drop"):
        perfit_table.main(argv)  # without the flag the seeds made elsewhere would go: refused
    perfit_table.main([*argv, "--overwrite"])  # asked for: nothing is kept, no runs, no row
    assert "| PerFIT s = 0.5 |" not in (results_dir / "table-perfit-tiny.md").read_text()
    (results_dir / "table-perfit-tiny.json").write_text("{not json")
    with pytest.raises(SystemExit, match=r"table-perfit-tiny\.json: not a table's results file"):
        perfit_table.main([*argv, "--keep-earlier"])


def test_a_rows_facts_come_from_its_smallest_seed_whatever_the_order_asked(tmp_path: Path) -> None:
    runs = [_fake_run(tmp_path / "perfit_s0.5-pathological-s1", 10.0)]
    runs.append(_fake_run(tmp_path / "perfit_s0.5-pathological-s0", 12.0))
    rows = (runs[1] / "metrics.jsonl").read_text().replace('"bytes_up": 3000000.0', '"bytes_up": 5000000.0')
    (runs[1] / "metrics.jsonl").write_text(rows)
    result = perfit_table.summarise(runs)
    # seed 0 decides the row's facts, as it does when "carried or not" is decided
    assert result["mb_up_per_round"] == 5.0
    assert perfit_table.summarise(runs, {f"{perfit_table.METRIC}_by_seed": {"0": 1.0}}) == result


def test_mask_overlap_is_grouped_by_the_categories_two_clients_share() -> None:
    import numpy as np

    overlap = np.array(
        [[1.0, 0.8, 0.4, 0.2], [0.8, 1.0, 0.6, 0.3], [0.4, 0.6, 1.0, 0.5], [0.2, 0.3, 0.5, 1.0]]
    )
    categories = {"a": {"x", "y"}, "b": {"x", "y"}, "c": {"x", "z"}, "d": {"w", "v"}}
    groups = perfit_masks.overlap_by_shared(overlap, ["a", "b", "c", "d"], categories)
    assert {k: g["pairs"] for k, g in groups.items()} == {2: 1, 1: 2, 0: 3}
    assert groups[2]["mean"] == 0.8 and groups[1]["mean"] == 0.5
    assert abs(groups[0]["mean"] - (0.2 + 0.3 + 0.5) / 3) < 1e-12
    lines = perfit_masks.overlap_lines({"clients": ["a", "b", "c", "d"], "by_shared": groups})
    assert lines[1].endswith("2 shared: 0.800 ± 0.000 (1 pairs); 1 shared: 0.500 ± 0.100 (2 pairs); "
                             "0 shared: 0.333 ± 0.125 (3 pairs).")  # fmt: skip


def test_rows_are_broken_down_by_how_often_a_client_was_sampled() -> None:
    sampled = {"c0": 0, "c1": 1, "c2": 1, "c3": 5}
    before = {"c0": 10.0, "c1": 12.0, "c2": 14.0, "c3": 20.0}
    fit = {"by_client": {"c0": 8.0, "c1": 9.0, "c2": 11.0, "c3": 6.0}, "sampled": sampled}
    perfit = {"by_client": {"c0": 10.0, "c1": 10.0, "c2": 12.0, "c3": 7.0}, "sampled": sampled}
    fit["by_client_before"] = before
    results = {"fit-pathological": fit, "perfit_s0.5-pathological": perfit, "fit-dirichlet": fit}
    lines = perfit_table.by_sampling(results, ["pathological", "dirichlet"])
    text = "\n".join(lines)
    assert "| rounds sampled | clients | base | FIT (FedIT, rank r) | PerFIT s = 0.5 |" in text
    assert "| 0 | 1 | 10.00 | 8.00 | 10.00 |" in text
    assert "| 1 | 2 | 13.00 | 10.00 | 11.00 |" in text
    assert "| 4+ | 1 | 20.00 | 6.00 | 7.00 |" in text
    assert "dirichlet" not in text  # one row alone has nothing to compare
    other = {**perfit, "sampled": {**sampled, "c0": 1, "c1": 0}}
    lines = perfit_table.by_sampling(
        {"fit-pathological": fit, "perfit_s0.5-pathological": other}, ["pathological"]
    )
    assert lines == [
        "",
        "(pathological: no breakdown by sampling: the rows' first seeds sampled different clients)",
    ]
    kept = {k: v for k, v in perfit.items() if k != "sampled"}
    lines = perfit_table.by_sampling(
        {"fit-pathological": fit, "perfit_s0.5-pathological": kept}, ["pathological"]
    )
    assert "kept from an earlier results file" in lines[1]


def test_lr_search_runs_on_validation_and_names_each_rows_best(tmp_path: Path) -> None:
    """``--lrs``: each row at each lr on the clients' validation split (a real tiny run), each row's best
    lr (lower personalised perplexity; a tie to the smaller lr), the ``--row-lr`` line, and ``--render``
    rewriting the .md from its .json alone."""
    config = ROOT / "configs" / "test" / "perfit-tiny.yaml"
    runs, results_dir = tmp_path / "runs" / "perfit-tiny", tmp_path / "results"
    for lr, fit, perfit in ((0.001, 9.0, 7.0), (0.003, 8.0, 7.0)):
        _fake_run(runs / f"lr{lr:g}-fit-pathological-s0", fit, lr=lr)
        _fake_run(runs / f"lr{lr:g}-perfit_s0.5-pathological-s0", perfit, lr=lr)
    argv = [str(config), "--runs-dir", str(tmp_path / "runs"), "--results-dir", str(results_dir)]
    argv += ["--rows", "fit", "perfit_s0.5", "standalone", "--lrs", "0.001", "0.003"]
    perfit_table.main([*argv, "--set", "fed.rounds=1"])
    saved = yaml.safe_load((runs / "lr0.001-standalone-pathological-s0" / "config.yaml").read_text())
    assert saved["data"]["eval_split"] == "validation" and saved["train"]["lr"] == 0.001
    recorded = json.loads((results_dir / "sweep-lr-perfit-tiny.json").read_text())
    best = recorded["results"]["best_lr"]
    assert best["fit-pathological"] == 0.003 and best["perfit_s0.5-pathological"] == 0.001
    text = (results_dir / "sweep-lr-perfit-tiny.md").read_text()
    assert "| FIT (FedIT, rank r), pathological | 9.00 | 8.00 | 0.003 |" in text
    assert "validation personalised perplexity" in text
    real = [
        recorded["results"][f"lr{lr:g}-standalone-pathological"][perfit_table.METRIC] for lr in (0.001, 0.003)
    ]
    assert best["standalone-pathological"] == (0.001 if real[0] <= real[1] else 0.003)
    line = f"`--row-lr fit=0.003 perfit_s0.5=0.001 standalone={best['standalone-pathological']:g}`"
    assert text.rstrip().endswith(line)
    assert (results_dir / "sweep-lr-perfit-tiny.png").read_bytes().startswith(b"\x89PNG")
    perfit_table.main(
        ["--render", str(results_dir / "sweep-lr-perfit-tiny.json"), "--results-dir", str(tmp_path)]
    )
    assert (tmp_path / "sweep-lr-perfit-tiny.md").read_text() == text


def test_row_lr_runs_a_row_at_its_own_lr_and_shows_it(tmp_path: Path) -> None:
    config = ROOT / "configs" / "test" / "perfit-tiny.yaml"
    runs = tmp_path / "runs" / "perfit-tiny"
    _fake_run(runs / "fit-pathological-lr0.003-s0", 8.0, lr=0.003)
    _fake_run(runs / "perfit_s0.5-pathological-s0", 7.0, lr=0.001)
    argv = [str(config), "--runs-dir", str(tmp_path / "runs"), "--results-dir", str(tmp_path)]
    perfit_table.main([*argv, "--rows", "fit", "perfit_s0.5", "--row-lr", "fit=0.003", "--table-only"])
    table = (tmp_path / "table-perfit-tiny.md").read_text()
    assert "| method | partition | lr | ppl before |" in table
    assert "| FIT (FedIT, rank r) | pathological | 0.003 |" in table
    assert "| PerFIT s = 0.5 | pathological | 0.001 |" in table
    with pytest.raises(SystemExit):
        perfit_table.main([*argv, "--lrs", "0.001", "--row-lr", "fit=0.003", "--table-only"])


def test_the_mask_study_reads_the_first_partitions_run_only(tmp_path: Path) -> None:
    # pathological's runs were made elsewhere (kept from the previous table), Dirichlet's are here: the
    # study of the pathological masks must not be replaced by a Dirichlet run's
    dirs = {
        "fit-pathological": [tmp_path / "fit-pathological-s0"],
        "perfit_s0.5-pathological": [tmp_path / "perfit_s0.5-pathological-s0"],
        "perfit_s0.5-dirichlet": [_fake_run(tmp_path / "perfit_s0.5-dirichlet-s0", 7.0)],
    }
    assert perfit_table.mask_study_run(dirs, "pathological") is None
    assert perfit_table.mask_study_run(dirs, "dirichlet") == tmp_path / "perfit_s0.5-dirichlet-s0"
    _fake_run(tmp_path / "perfit_s0.5-pathological-s0", 8.0)
    assert perfit_table.mask_study_run(dirs, "pathological") == tmp_path / "perfit_s0.5-pathological-s0"


def test_the_mask_study_is_the_paper_readings_run_whatever_the_order_of_the_rows(tmp_path: Path) -> None:
    # an ablation row asked first (own starts, s = 0.5) is no PerFIT s = 0.5 run: its masks are searched
    # at another time; only a table without the paper's row studies an ablation's masks
    own = _fake_run(tmp_path / "perfit_s0.5_own-pathological-s0", 9.0)
    dirs = {"perfit_s0.5_own-pathological": [own], "perfit_s0.5-pathological": [tmp_path / "p-s0"]}
    assert perfit_table.mask_study_run(dirs, "pathological") is None  # the paper's run is not done yet
    _fake_run(tmp_path / "p-s0", 8.0)
    assert perfit_table.mask_study_run(dirs, "pathological") == tmp_path / "p-s0"
    del dirs["perfit_s0.5-pathological"]
    assert perfit_table.mask_study_run(dirs, "pathological") == own


def test_a_finished_run_without_checkpoints_keeps_the_earlier_mask_study(tmp_path: Path) -> None:
    # Prepare: a finished PerFIT run whose checkpoints were removed (the masks live only there) and a
    # previous results file that holds its mask study
    config = ROOT / "configs" / "test" / "perfit-tiny.yaml"
    results_dir = tmp_path / "results"
    results_dir.mkdir()
    _fake_run(tmp_path / "runs" / "perfit-tiny" / "perfit_s0.5-pathological-s0", 7.0)
    shared = {"0": {"pairs": 6, "mean": 0.5, "std": 0.1}}
    masks = {"clients": ["c00", "c01", "c02", "c03"], "by_shared": shared}
    (results_dir / "table-perfit-tiny.json").write_text(json.dumps({"results": {"masks": masks}}))
    argv = [str(config), "--runs-dir", str(tmp_path / "runs"), "--results-dir", str(results_dir)]
    argv += ["--rows", "perfit_s0.5", "--table-only"]
    # Execute / Assert: without the flag the study would go, so the write is refused; with it, kept
    with pytest.raises(SystemExit, match=r"this write would drop .*masks/by_shared"):
        perfit_table.main(argv)
    perfit_table.main([*argv, "--keep-earlier"])
    saved = json.loads((results_dir / "table-perfit-tiny.json").read_text())["results"]
    assert saved["masks"] == masks
