"""Smoke test of experiments/fedmkt_table.py on the tiny config: the one-to-one setting's runs, the table and
its machine-readable results."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from experiments import fedmkt_models, fedmkt_table, tables

from fedtune.config import load_config
from tests.integration.helpers import ROOT

# The runs of these tables run in this process (tests/conftest.py): a subprocess each cost ~8 s of imports.
pytestmark = pytest.mark.usefixtures("fedtune_in_process")


def test_table_runs_the_one_to_one_setting_and_saves_its_numbers(tmp_path: Path) -> None:
    raw = yaml.safe_load((ROOT / "configs" / "test" / "fedmkt-tiny.yaml").read_text())
    raw["fed"]["rounds"] = 1
    raw["eval"]["max_new_tokens"] = 4
    config = tmp_path / "fedmkt-tiny.yaml"
    config.write_text(yaml.safe_dump(raw))
    argv = [str(config), "--runs-dir", str(tmp_path / "runs"), "--results-dir", str(tmp_path / "results")]
    argv += ["--settings", "one", "--datasets", "instruct", "--jobs", "2"]

    fedmkt_table.main(argv)

    table = (tmp_path / "results" / "table-fedmkt-tiny.md").read_text()
    assert "## instruct, one (rougeL)" in table
    for label in ("Zero-shot", "Standalone", "Centralized", "LLM2SLM", "FedMKT"):
        assert f"| {label} |" in table
    results = json.loads((tmp_path / "results" / "table-fedmkt-tiny.json").read_text())["results"]
    cells = results["instruct-one"]
    slm = raw["fedmkt"]["clients"][0]
    for row in ("zeroshot", "fedmkt", "llm2slm", "centralized"):
        assert set(cells[row]["llm"]) == {"0"} and 0.0 <= cells[row]["llm"]["0"] <= 1.0, row
        assert set(cells[row][slm]) == {"0"}, row
    assert "llm" not in cells["standalone"] and set(cells["standalone"][slm]) == {"0"}
    assert set(cells["llmpublic"]) == {"llm"} and set(cells["llmpublic"]["llm"]) == {"0"}
    assert "| LLM on public set |" in table and "What the SLMs' knowledge adds" in table
    assert "llm" not in cells["slmpublic"] and set(cells["slmpublic"][slm]) == {"0"}
    assert "| SLMs + public CE |" in table and f"What the LLM's knowledge adds to {slm}" in table
    assert cells["fedmkt"]["mb_up"]["0"] > 0
    assert (tmp_path / "results" / "table-fedmkt-tiny.png").read_bytes().startswith(b"\x89PNG")


def test_settings_give_four_two_or_one_slm_from_the_config_clients() -> None:
    from types import SimpleNamespace

    clients = SimpleNamespace(clients=["a", "b", "a2", "b2"])
    cfg = SimpleNamespace(fedmkt=clients, fed=SimpleNamespace(rounds=5))
    assert fedmkt_table.settings(cfg) == {
        "hetero": [],
        "hetero2": ["fedmkt.clients=[a,b]"],
        "homo": ["fedmkt.clients=[a]"],
        "one": ["fedmkt.clients=[a]", "data.partition.num_clients=1"],
    }
    assert [fedmkt_models.slms(cfg, s) for s in fedmkt_table.SETTINGS] == [
        ["a", "b", "a2", "b2"], ["a", "b"], ["a"], ["a"]
    ]  # fmt: skip
    runs = fedmkt_table.runs(cfg, "wic", "hetero")
    assert {"wic-centralized-a2", "wic-centralized-b2"} <= set(runs)
    # the paper's Centralized: FedMKT's own mode (private data + the public set), not FedIT's
    assert "fed.mode=centralized" in runs["wic-centralized-a2"]
    assert not [o for o in runs["wic-centralized-a2"] if o.startswith("algorithm=")]
    assert {"fedmkt.lam=1", "fedmkt.clients=[a]"} <= set(runs["wic-llmpublic"])
    # the control: the same fleet and steps as FedMKT, the public set's CE alone, the LLM frozen
    control = runs["wic-hetero-slmpublic"]
    assert {"fedmkt.lam=1", "fedmkt.llm_learns=false"} <= set(control)
    assert not [o for o in control if o.startswith(("fedmkt.clients", "fed.mode", "fedmkt.slm_learns"))]
    # FedMKT evaluates every round (its trajectory); the others only after their last round
    assert not [o for o in runs["wic-hetero-fedmkt"] if o.startswith("eval.")]
    for name in set(runs) - {"wic-hetero-fedmkt"}:
        assert {"eval.before=false", "eval.every=5"} <= set(runs[name]), name


def test_keep_earlier_fills_cell_by_cell_only_the_seeds_asked_for() -> None:
    table = {"fedmkt": {"llm": {"1": 0.6}}}
    earlier = {
        "fedmkt": {"llm": {"0": 0.5, "1": 0.9, "7": 0.1}, "slm": {"0": 0.4}},
        "centralized": {"llm": {"2": 0.8}},
        "not-a-row": {"llm": {"0": 1.0}},
    }
    carried = tables.fill_cells(table, earlier, ["0", "1"], groups=fedmkt_table.LABELS)
    # seed 1's run here wins over the earlier 0.9, seed 7 was not asked for, seed 2 neither
    assert table == {"fedmkt": {"llm": {"1": 0.6, "0": 0.5}, "slm": {"0": 0.4}}}
    assert carried == {"fedmkt": ["0"]}


def test_keep_earlier_refuses_a_rows_seeds_measured_at_another_lr(tmp_path: Path) -> None:
    """A row asked at lr 2e-4 (``--row-lr``) whose seed the previous file measured at 1e-4: refused,
    naming the setting, the row and both lrs; at the recorded lr the seed is kept."""
    config = ROOT / "configs" / "test" / "fedmkt-tiny.yaml"
    results_dir = tmp_path / "results"
    results_dir.mkdir()
    earlier = {"wic-one": {"fedmkt": {"llm": {"0": 0.5}}}, "row_lr": {"fedmkt": 1e-4}}
    (results_dir / "table-fedmkt-tiny.json").write_text(json.dumps({"results": earlier}))
    argv = [str(config), "--runs-dir", str(tmp_path / "runs"), "--results-dir", str(results_dir)]
    argv += ["--settings", "one", "--seeds", "0", "--table-only", "--keep-earlier"]
    with pytest.raises(
        SystemExit, match=r"wic-one, FedMKT: .*seeds 0, measured at lr 0\.0001, .* lr 0\.0002\b"
    ):
        fedmkt_table.main([*argv, "--row-lr", "fedmkt=2e-4"])
    fedmkt_table.main([*argv, "--row-lr", "fedmkt=1e-4"])
    assert "| FedMKT | 50.0 |" in (results_dir / "table-fedmkt-tiny.md").read_text()


def test_keep_earlier_refuses_mixing_a_tuned_lr_with_the_configs(tmp_path: Path) -> None:
    """A row with no ``--row-lr`` trains at the config's lr (0.01 here): seeds the previous file measured
    at a row's own lr are refused for it, and seeds it measured at the config's lr (no ``row_lr`` entry)
    are refused for the row asked at its own lr."""
    config = ROOT / "configs" / "test" / "fedmkt-tiny.yaml"
    results_dir = tmp_path / "results"
    results_dir.mkdir()
    path = results_dir / "table-fedmkt-tiny.json"
    argv = [str(config), "--runs-dir", str(tmp_path / "runs"), "--results-dir", str(results_dir)]
    argv += ["--settings", "one", "--seeds", "0", "--table-only", "--keep-earlier"]
    tuned = {"wic-one": {"fedmkt": {"llm": {"0": 0.5}}}, "row_lr": {"fedmkt": 1e-4}}
    path.write_text(json.dumps({"results": tuned}))
    refused = r"wic-one, FedMKT: .*seeds 0, measured at lr {}, .* lr {}\b"
    with pytest.raises(SystemExit, match=refused.format(r"0\.0001", r"0\.01")):
        fedmkt_table.main(argv)
    at_config = {"wic-one": {"fedmkt": {"llm": {"0": 0.5}}}}
    path.write_text(json.dumps({"results": at_config}))
    with pytest.raises(SystemExit, match=refused.format(r"0\.01", r"0\.0002")):
        fedmkt_table.main([*argv, "--row-lr", "fedmkt=2e-4"])
    fedmkt_table.main([*argv, "--row-lr", "fedmkt=0.01"])  # the config's lr asked by name: no mix
    assert "| FedMKT | 50.0 |" in (results_dir / "table-fedmkt-tiny.md").read_text()


def test_ordering_is_checked_on_the_means_and_seed_by_seed() -> None:
    table = {
        "zeroshot": {"s": {"0": 0.50, "1": 0.50}, "llm": {"0": 0.4, "1": 0.4}},
        "standalone": {"s": {"0": 0.55, "1": 0.60}},
        "fedmkt": {"s": {"0": 0.60, "1": 0.58}, "llm": {"0": 0.5, "1": 0.3}},
        "centralized": {"llm": {"0": 0.5}},
    }
    lines = fedmkt_table.ordering(table, ["s"])
    # by interval, each adjacent pair (x 100): gains 5, 10 (mean 7.5, sd 3.54) and 5, -2 (mean 1.5, sd
    # 4.95); t(1 df, 0.975) = 12.71, so the half widths are 12.71 * sd / sqrt(2): 31.77 and 44.47
    assert lines[0] == (
        "- s: Zero-shot 50.0 < Standalone 57.5 < FedMKT 59.0: **holds**, in 1 of 2 seeds; by interval: "
        "Standalone over Zero-shot tie (gain 7.50, 95% CI [-24.27, 39.27], 2 seeds); "
        "FedMKT over Standalone tie (gain 1.50, 95% CI [-42.97, 45.97], 2 seeds)"
    )
    assert lines[1] == (
        "- LLM: Zero-shot 40.0 < FedMKT 40.0 (Centralized 50.0 on the same seed, FedMKT - Centralized "
        "+0.0: one seed (gain 0.00)): **tie**, in 1 of 2 seeds; by interval: tie (gain 0.00, 95% CI "
        "[-127.06, 127.06], 2 seeds)"
    )


def test_the_control_row_says_what_the_llms_knowledge_adds_to_each_slm() -> None:
    table = {
        "slmpublic": {"s": {"0": 0.50, "1": 0.52, "2": 0.49}},
        "fedmkt": {"s": {"0": 0.55, "1": 0.56, "2": 0.55}, "llm": {"0": 0.4, "1": 0.4, "2": 0.4}},
    }
    lines = fedmkt_table.ordering(table, ["s"])
    # gains x 100: 5, 4, 6 (mean 5, sd 1); t(2 df, 0.975) = 4.303, half width 4.303 / sqrt(3) = 2.48
    assert lines == [
        "- What the LLM's knowledge adds to s: SLMs + public CE 50.3 vs FedMKT 55.3; by interval: holds "
        "(gain 5.00, 95% CI [2.52, 7.48], 3 seeds)"
    ]
    table["fedmkt"]["s"] = {"0": 0.51, "1": 0.50, "2": 0.53}  # gains 1, -2, 4: inside the noise
    assert "by interval: tie" in fedmkt_table.ordering(table, ["s"])[0]
    del table["slmpublic"]
    assert fedmkt_table.ordering(table, ["s"]) == []


@pytest.mark.parametrize(
    ("row", "claim"),
    [
        ("llm2slm", "FedMKT over LLM2SLM (the LLM frozen) for s: LLM2SLM"),  # the paper's Table 4
        ("fedavg", "FedMKT over FedAvg for s: FedAvg"),  # the paper's Table 3 (homogeneous)
    ],
)
def test_fedmkts_slms_are_checked_by_interval_against_the_row_each_paper_table_beats(
    row: str, claim: str
) -> None:
    """The paper claims FedMKT's SLMs above LLM2SLM's (the LLM frozen, one-to-one) and above FedAvg's (the
    SLMs averaged, homogeneous): the table says whether each holds, paired over seeds."""
    table = {
        row: {"s": {"0": 0.50, "1": 0.52, "2": 0.49}},
        "fedmkt": {"s": {"0": 0.55, "1": 0.56, "2": 0.55}, "llm": {"0": 0.4, "1": 0.4, "2": 0.4}},
    }
    # gains x 100: 5, 4, 6 (mean 5, sd 1); t(2 df, 0.975) = 4.303, half width 4.303 / sqrt(3) = 2.48
    assert fedmkt_table.ordering(table, ["s"]) == [
        f"- {claim} 50.3 vs FedMKT 55.3; by interval: holds (gain 5.00, 95% CI [2.52, 7.48], 3 seeds)"
    ]
    table["fedmkt"]["s"] = {"0": 0.51, "1": 0.50, "2": 0.53}  # gains 1, -2, 4: inside the noise
    assert "by interval: tie (gain 1.00, 95% CI [-6.45, 8.45]" in fedmkt_table.ordering(table, ["s"])[0]
    del table[row]
    assert fedmkt_table.ordering(table, ["s"]) == []


def test_table_only_keeps_earlier_seeds_and_names_them(tmp_path: Path) -> None:
    results_dir = tmp_path / "results"
    results_dir.mkdir()
    slm = yaml.safe_load((ROOT / "configs" / "test" / "fedmkt-tiny.yaml").read_text())["fedmkt"]["clients"][0]
    earlier = {"wic-one": {"fedmkt": {"llm": {"0": 0.5, "1": 0.7}, slm: {"0": 0.6}}}}
    (results_dir / "table-fedmkt-tiny.json").write_text(json.dumps({"results": earlier}))
    argv = [str(ROOT / "configs" / "test" / "fedmkt-tiny.yaml"), "--runs-dir", str(tmp_path / "runs")]
    argv += ["--results-dir", str(results_dir), "--settings", "one", "--seeds", "0", "1", "--table-only"]
    fedmkt_table.main([*argv, "--keep-earlier"])
    table = (results_dir / "table-fedmkt-tiny.md").read_text()
    assert "| FedMKT | 60.0 ± 14.1 | 60.0 | - | - | 2 |" in table  # 50 and 70: sample std 14.14
    assert "  - FedMKT: 0, 1" in table
    saved = json.loads((results_dir / "table-fedmkt-tiny.json").read_text())["results"]
    assert saved["carried"] == {"wic-one": {"fedmkt": ["0", "1"]}}
    with pytest.raises(SystemExit, match=r"table-fedmkt-tiny\.json: this write would drop 3 values"):
        fedmkt_table.main(argv)  # without the flag the seeds made elsewhere would go: refused
    assert "| FedMKT | 60.0" in (results_dir / "table-fedmkt-tiny.md").read_text()
    fedmkt_table.main([*argv, "--overwrite"])  # asked for: nothing is kept, no runs, no table
    assert "| FedMKT |" not in (results_dir / "table-fedmkt-tiny.md").read_text()


def test_set_changes_the_config_the_table_reads_and_each_run_keeps_its_own_model(tmp_path: Path) -> None:
    """``--set model.name=... --set name=...`` gives a table of another LLM beside the first one: the
    table reads the config with the overrides (its file name, runs directory and heading follow), and a
    centralized SLM run still trains its SLM, not the LLM that ``--set`` names."""
    from fedtune.config import load_config

    config = ROOT / "configs" / "test" / "fedmkt-tiny.yaml"
    extra = ["name=fedmkt-tiny-big", "model.name=tiny-qwen2-spm"]
    results_dir = tmp_path / "results"
    results_dir.mkdir()
    earlier = {"wic-one": {"fedmkt": {"llm": {"0": 0.5}}}}
    (results_dir / "table-fedmkt-tiny-big.json").write_text(json.dumps({"results": earlier}))
    argv = [str(config), "--runs-dir", str(tmp_path / "runs"), "--results-dir", str(results_dir)]
    argv += ["--settings", "one", "--seeds", "0", "--table-only", "--keep-earlier"]
    fedmkt_table.main([*argv, *(f"--set={o}" for o in extra)])
    table = (results_dir / "table-fedmkt-tiny-big.md").read_text()
    assert table.startswith("# FedMKT at small scale: fedmkt-tiny-big (LLM tiny-qwen2-spm;")
    assert "| FedMKT | 50.0 |" in table
    assert not (results_dir / "table-fedmkt-tiny.md").exists()

    cfg = load_config(config, extra)
    slm = cfg.fedmkt.clients[0]
    jobs = fedmkt_table.planned(cfg, ["wic"], ["one"], [0], extra)
    assert jobs["wic-one-fedmkt-s0"][:2] == extra and jobs["wic-one-fedmkt-s0"][-1] == "seed=0"
    models = {name: [o for o in run if o.startswith("model.name=")][-1] for name, run in jobs.items()}
    assert models[f"wic-centralized-{slm}-s0"] == f"model.name={slm}"
    assert models["wic-centralized-llm-s0"] == models["wic-one-fedmkt-s0"] == "model.name=tiny-qwen2-spm"


def test_the_llm_is_compared_with_centralized_on_the_seeds_both_have() -> None:
    """The centralized runs are shared by the settings and may have more seeds than a setting's own
    FedMKT runs: the difference must not mix seed sets."""
    table = {
        "zeroshot": {"llm": {"0": 0.2}},
        "fedmkt": {"llm": {"0": 0.3}},
        "centralized": {"llm": {"0": 0.4, "1": 0.6}},
    }
    assert fedmkt_table.ordering(table, []) == [
        "- LLM: Zero-shot 20.0 < FedMKT 30.0 (Centralized 40.0 on the same seed, FedMKT - Centralized "
        "-10.0: one seed (gain -10.00)): **holds**; by interval: one seed (gain 10.00)"
    ]


def test_the_llms_gaps_to_centralized_and_to_its_public_set_alone_have_intervals() -> None:
    """FedMKT's LLM against Centralized (the paper's FedMKT ~ Centralized) and against the LLM trained on
    the public set alone (what the SLMs' knowledge adds), each by its paired t interval over seeds."""
    table = {
        "zeroshot": {"llm": {"0": 0.2, "1": 0.2, "2": 0.2}},
        "fedmkt": {"llm": {"0": 0.3, "1": 0.4, "2": 0.5}},
        "centralized": {"llm": {"0": 0.4, "1": 0.52, "2": 0.58}},
        "llmpublic": {"llm": {"0": 0.2, "1": 0.2, "2": 0.2}},
    }
    lines = fedmkt_table.ordering(table, [])
    # FedMKT - Centralized: -10, -12, -8 (mean -10, sd 2; t(2 df) 4.3027 -> half width 4.97)
    assert "FedMKT - Centralized -10.0: reversed (gain -10.00, 95% CI [-14.97, -5.03], 3 seeds))" in lines[0]
    # FedMKT - public only: 10, 20, 30 (mean 20, sd 10 -> half width 24.84)
    assert lines[1] == (
        "- What the SLMs' knowledge adds to the LLM: FedMKT - LLM on the public set only +20.0 (on the "
        "same 3 seeds); by interval: tie (gain 20.00, 95% CI [-4.84, 44.84], 3 seeds)"
    )


def test_equal_means_are_a_tie_whatever_the_float_order_of_summing() -> None:
    """defchoice, seeds 0-2: the LLM's Zero-shot and FedMKT accuracies both sum to 106 of 288, but
    summed in float their means differed in the last bit and the tie read as **holds**. A tie is a tie."""
    table = {
        "zeroshot": {"llm": {"0": 38 / 96, "1": 33 / 96, "2": 35 / 96}},
        "fedmkt": {"llm": {"0": 37 / 96, "1": 32 / 96, "2": 37 / 96}},
    }
    (line,) = fedmkt_table.ordering(table, [])
    # the paired gains (-1, -1, 2) / 96 x 100 sum to 0 exactly too: a tie by interval as well
    assert line == (
        "- LLM: Zero-shot 36.8 < FedMKT 36.8: **tie**, in 1 of 3 seeds; "
        "by interval: tie (gain 0.00, 95% CI [-4.48, 4.48], 3 seeds)"
    )


def test_rounds_file_gives_every_round_of_the_fedmkt_run_with_the_samples_selected(tmp_path: Path) -> None:
    """At more than one round the script writes ``rounds-<config>``: each round's scores of the LLM and
    the SLMs as the run's metrics rows hold them, and the public samples selected for each side."""
    from fedtune.config import load_config

    config = ROOT / "configs" / "test" / "fedmkt-tiny.yaml"
    extra = ["fed.rounds=2", "eval.max_new_tokens=4"]
    cfg = load_config(config, extra)
    runs_dir, results_dir = tmp_path / "runs", tmp_path / "results"
    jobs = fedmkt_table.planned(cfg, ["instruct"], ["hetero2"], [0], extra)
    run_dir = runs_dir / cfg.name / "instruct-hetero2-fedmkt-s0"
    fedmkt_table.tables.run(config, jobs[run_dir.name], run_dir)
    argv = [str(config), "--runs-dir", str(runs_dir), "--results-dir", str(results_dir), "--table-only"]
    fedmkt_table.main(
        [*argv, "--settings", "hetero2", "--datasets", "instruct", *(f"--set={o}" for o in extra)]
    )

    saved = json.loads((results_dir / "rounds-fedmkt-tiny.json").read_text())["results"]["instruct-hetero2"]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert sorted(saved, key=int) == ["0", "1", "2"]
    for row in rows:
        cells = saved[str(row["round"])]
        assert cells["llm"] == {"0": row["eval"]["rougeL"]}
        first = cfg.fedmkt.clients[0]  # held by c00 and c02 of the four clients
        clients = [row["eval_by_client"][c]["rougeL"] for c in ("c00", "c02")]
        assert cells[first]["0"] == pytest.approx(sum(clients) / 2)
        if row["round"] > 0:
            assert cells["llm_kd_selected"] == {"0": row["llm_kd_selected"]}
            assert cells["slm_kd_selected"] == {"0": row["slm_kd_selected"]}
    text = (results_dir / "rounds-fedmkt-tiny.md").read_text()
    assert "## instruct, hetero2" in text and "| selected: LLM |" in text.replace(
        "selected: LLM | sel", "selected: LLM |"
    )
    assert (results_dir / "rounds-fedmkt-tiny.png").read_bytes().startswith(b"\x89PNG")
    # at one round there is nothing over rounds to show
    one = ["--set=fed.rounds=1", "--results-dir", str(tmp_path / "one")]
    fedmkt_table.main([*argv, "--settings", "hetero2", "--datasets", "instruct", *one])
    assert not (tmp_path / "one" / "rounds-fedmkt-tiny.md").exists()


def test_keep_earlier_carries_every_round_of_a_seed_whose_fedmkt_run_is_not_here(tmp_path: Path) -> None:
    """``--table-only --keep-earlier`` must not wipe the rounds file of seeds run elsewhere: a seed asked
    for with no finished FedMKT run here keeps all its rounds from the file's previous write, named as
    kept; with `--overwrite` the seeds not asked for go."""
    results_dir = tmp_path / "results"
    results_dir.mkdir()
    slm = yaml.safe_load((ROOT / "configs" / "test" / "fedmkt-tiny.yaml").read_text())["fedmkt"]["clients"][0]
    earlier = {
        "instruct-hetero2": {
            "0": {"llm": {"0": 0.2, "5": 0.9}, slm: {"0": 0.3}},
            "1": {"llm": {"0": 0.4}, slm: {"0": 0.35}, "llm_kd_selected": {"0": 59.0}},
        }
    }
    (results_dir / "rounds-fedmkt-tiny.json").write_text(json.dumps({"results": earlier}))
    argv = [str(ROOT / "configs" / "test" / "fedmkt-tiny.yaml"), "--runs-dir", str(tmp_path / "runs")]
    argv += ["--results-dir", str(results_dir), "--settings", "hetero2", "--datasets", "instruct"]
    argv += ["--seeds", "0", "1", "--table-only", "--set=fed.rounds=2", "--overwrite"]  # seed 5 goes
    fedmkt_table.main([*argv, "--keep-earlier"])

    saved = json.loads((results_dir / "rounds-fedmkt-tiny.json").read_text())["results"]
    # seed 5 was not asked for; seed 1 has no value anywhere
    assert saved["instruct-hetero2"] == {
        "0": {"llm": {"0": 0.2}, slm: {"0": 0.3}},
        "1": {"llm": {"0": 0.4}, slm: {"0": 0.35}, "llm_kd_selected": {"0": 59.0}},
    }
    assert saved["carried"] == {"instruct-hetero2": ["0"]}
    text = (results_dir / "rounds-fedmkt-tiny.md").read_text()
    assert "| 1 | 40.0 | 35.0 |" in text
    assert "kept from this file's previous results (runs not in" in text and ": 0" in text
    fedmkt_table.main(argv)  # without the flag (and with --overwrite) nothing is kept
    assert (
        "instruct-hetero2" not in json.loads((results_dir / "rounds-fedmkt-tiny.json").read_text())["results"]
    )


def test_the_ordering_compares_the_rows_on_the_seeds_they_all_have() -> None:
    """A row with a seed the others lack (its runs done, the FedMKT run of that seed not yet) must not
    move the means the ordering compares: seed 1's Standalone would pull its mean to 32.5 and read as
    the ordering failing, when on the one seed every row has it holds."""
    table = {
        "zeroshot": {"s": {"0": 0.50}, "llm": {"0": 0.4}},
        "standalone": {"s": {"0": 0.55, "1": 0.10}},
        "fedmkt": {"s": {"0": 0.60, "2": 0.0}, "llm": {"0": 0.5, "1": 0.9}},
    }
    lines = fedmkt_table.ordering(table, ["s"])
    assert lines == [
        "- s: Zero-shot 50.0 < Standalone 55.0 < FedMKT 60.0 (on seed 0, which every row compared has): "
        "**holds**; by interval: Standalone over Zero-shot one seed (gain 5.00); "
        "FedMKT over Standalone one seed (gain 5.00)",
        "- LLM: Zero-shot 40.0 < FedMKT 50.0 (on seed 0, which every row compared has): **holds**; "
        "by interval: one seed (gain 10.00)",
    ]
    table["fedmkt"]["s"] = {"2": 0.0}  # no seed in common: nothing to compare
    assert not any(line.startswith("- s:") for line in fedmkt_table.ordering(table, ["s"]))


def test_rows_picks_which_runs_start_and_the_table_still_reads_every_row(tmp_path: Path) -> None:
    """``--rows fedmkt`` starts the FedMKT run alone (the other rows' values kept from elsewhere)."""
    cfg = load_config(ROOT / "configs" / "test" / "fedmkt-tiny.yaml")
    jobs = fedmkt_table.planned(cfg, ["wic"], ["hetero2"], [1], [])
    picked = fedmkt_table.pick_rows(jobs, ["fedmkt"])
    assert list(picked) == ["wic-hetero2-fedmkt-s1"]
    slm = cfg.fedmkt.clients[0]
    assert set(fedmkt_table.pick_rows(jobs, ["centralized", "llmpublic"])) == {
        "wic-centralized-llm-s1",
        *(f"wic-centralized-{name}-s1" for name in fedmkt_models.slms(cfg, "hetero2")),
        "wic-llmpublic-s1",
    }
    assert f"wic-centralized-{slm}-s1" in jobs
    assert fedmkt_table.pick_rows(jobs, list(fedmkt_table.ROWS)) == jobs


def _fake_fedmkt_run(path: Path, llm: float, slm: float | None = None, *, lr: float, clients: str) -> None:
    """A finished one-round run of the tiny config's one-to-one setting: the server model's score ``llm``,
    client c00's (its SLM) ``slm``."""
    path.mkdir(parents=True)
    config = {"fed": {"rounds": 1}, "train": {"lr": lr}, "fedmkt": {"clients": [clients]}}
    config["data"] = {"partition": {"num_clients": 1}}
    (path / "config.yaml").write_text(yaml.safe_dump(config))
    last: dict[str, object] = {"round": 1, "bytes_up": 1e6, "bytes_down": 2e6, "eval": {"perplexity": llm}}
    if slm is not None:
        last["eval_by_client"] = {"c00": {"perplexity": slm}}
    rows = [{"round": 0, "eval": {"perplexity": 99.0}}, last]
    (path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_lr_search_scores_the_models_each_run_trains_and_names_each_rows_best(tmp_path: Path) -> None:
    """``--lrs``: FedMKT's score is the mean of its LLM's and SLM's, Standalone's its SLM's alone (its LLM
    does not learn), a Centralized run's its one model's; runs of a row that disagree are named, not
    chosen; the LLM's lr moves with the SLMs' (a real tiny run on validation); ``--render`` rewrites the
    .md from the .json alone."""
    # Prepare: fake runs at two lrs (perplexity: lower is better), one real run (LLM on public set, 0.01)
    config = ROOT / "configs" / "test" / "fedmkt-tiny.yaml"
    slm = yaml.safe_load(config.read_text())["fedmkt"]["clients"][0]
    runs, results_dir = tmp_path / "runs" / "fedmkt-tiny", tmp_path / "results"
    fake = {  # run name -> (LLM, SLM) at lr 0.001, then at 0.01
        "wic-one-fedmkt": ((10.0, 30.0), (14.0, 20.0)),  # the LLM alone would choose 0.001, the mean 0.01
        "wic-one-standalone": ((100.0, 25.0), (1.0, 30.0)),  # counting the untrained LLM would choose 0.01
        "wic-centralized-llm": ((9.0, None), (8.0, None)),
        f"wic-centralized-{slm}": ((7.0, None), (9.0, None)),
    }
    for name, at_lrs in fake.items():
        for lr, (llm, slm_score) in zip((0.001, 0.01), at_lrs, strict=True):
            _fake_fedmkt_run(runs / f"lr{lr:g}-{name}-s0", llm, slm_score, lr=lr, clients=slm)
    _fake_fedmkt_run(runs / "lr0.001-wic-llmpublic-s0", 300.0, lr=0.001, clients=slm)  # 0.01's is real
    argv = [str(config), "--runs-dir", str(tmp_path / "runs"), "--results-dir", str(results_dir)]
    argv += ["--settings", "one", "--rows", "fedmkt", "standalone", "centralized", "llmpublic"]
    # Execute
    fedmkt_table.main([*argv, "--lrs", "0.001", "0.01", "--set", "fed.rounds=1"])
    # Assert
    saved = yaml.safe_load((runs / "lr0.01-wic-llmpublic-s0" / "config.yaml").read_text())
    assert saved["data"]["eval_split"] == "validation"
    assert saved["train"]["lr"] == saved["fedmkt"]["llm_train"]["lr"] == 0.01
    recorded = json.loads((results_dir / "sweep-lr-fedmkt-tiny.json").read_text())["results"]
    best = recorded["best_lr"]
    assert best["wic-one-fedmkt"] == 0.01 and best["wic-one-standalone"] == 0.001
    assert best["wic-centralized-llm"] == 0.01 and best[f"wic-centralized-{slm}"] == 0.001
    assert recorded["lr0.01-wic-one-fedmkt"]["score"] == 17.0
    text = (results_dir / "sweep-lr-fedmkt-tiny.md").read_text()
    assert "| FedMKT, wic one | 20.00 | 17.00 | 0.01 |" in text
    assert f"| Centralized ({slm}), wic | 7.00 | 9.00 | 0.001 |" in text
    assert "perplexity, mean of the models each run trains" in text
    real = [recorded[f"lr{lr:g}-wic-llmpublic"]["score"] for lr in (0.001, 0.01)]
    public = 0.001 if real[0] <= real[1] else 0.01
    each = f"centralized-llm=0.01 centralized-{slm}=0.001"  # the Centralized runs disagree: one lr a model
    assert text.rstrip().endswith(f"`--row-lr fedmkt=0.01 standalone=0.001 llmpublic={public:g} {each}`")
    assert (results_dir / "sweep-lr-fedmkt-tiny.png").read_bytes().startswith(b"\x89PNG")
    fedmkt_table.main(
        ["--render", str(results_dir / "sweep-lr-fedmkt-tiny.json"), "--results-dir", str(tmp_path)]
    )
    assert (tmp_path / "sweep-lr-fedmkt-tiny.md").read_text() == text
    with pytest.raises(SystemExit):  # --lrs searches every row: no --row-lr beside it
        fedmkt_table.main([*argv, "--lrs", "0.001", "--row-lr", "fedmkt=0.01", "--table-only"])
    with pytest.raises(SystemExit):  # instruct is scored by Rouge-L, wic here by perplexity
        fedmkt_table.main([*argv, "--lrs", "0.001", "--datasets", "wic", "instruct", "--table-only"])


def test_lr_search_with_keep_earlier_keeps_rows_and_seeds_whose_runs_are_elsewhere(tmp_path: Path) -> None:
    """A search extended on a machine that has neither Standalone's runs nor FedMKT's seed 0: with
    ``--keep-earlier`` Standalone's cell is kept whole and FedMKT's takes seed 0 from the previous file
    beside seed 1 from its run here; the .md names both. Without it the write is refused."""
    # Prepare: the previous search file; FedMKT's seed-1 run here (LLM 12, SLM 16: score 14)
    config = ROOT / "configs" / "test" / "fedmkt-tiny.yaml"
    slm = yaml.safe_load(config.read_text())["fedmkt"]["clients"][0]
    runs, results_dir = tmp_path / "runs" / "fedmkt-tiny", tmp_path / "results"
    _fake_fedmkt_run(runs / "lr0.001-wic-one-fedmkt-s1", 12.0, 16.0, lr=0.001, clients=slm)
    earlier = {
        "lr0.001-wic-one-fedmkt": {"seeds": 1, "score": 20.0, "score_by_seed": {"0": 20.0}},
        "lr0.001-wic-one-standalone": {"seeds": 1, "score": 25.0, "score_by_seed": {"0": 25.0}},
    }
    results_dir.mkdir()
    (results_dir / "sweep-lr-fedmkt-tiny.json").write_text(json.dumps({"results": earlier}))
    argv = [str(config), "--runs-dir", str(tmp_path / "runs"), "--results-dir", str(results_dir)]
    argv += ["--datasets", "wic", "--settings", "one", "--rows", "fedmkt", "standalone", "--seeds", "0", "1"]
    argv += ["--lrs", "0.001", "--set", "fed.rounds=1", "--table-only"]
    # Execute / Assert
    with pytest.raises(SystemExit, match="this write would drop"):
        fedmkt_table.main(argv)
    fedmkt_table.main([*argv, "--keep-earlier"])
    recorded = json.loads((results_dir / "sweep-lr-fedmkt-tiny.json").read_text())["results"]
    assert recorded["lr0.001-wic-one-fedmkt"]["score_by_seed"] == {"0": 20.0, "1": 14.0}
    assert recorded["lr0.001-wic-one-fedmkt"]["score"] == pytest.approx(17.0)
    assert recorded["lr0.001-wic-one-standalone"]["score_by_seed"] == {"0": 25.0}
    text = (results_dir / "sweep-lr-fedmkt-tiny.md").read_text()
    assert "| FedMKT, wic one | 17.00 ± 4.24 | 0.001 |" in text  # 20, 14: sample std sqrt(18)
    assert "| Standalone, wic one | 25.00 (1 seed) | 0.001 |" in text and "fewer seeds than asked" in text
    assert "(no run of theirs here, `--keep-earlier`): Standalone, wic one at lr 0.001." in text
    assert "Seeds kept from the previous results file" in text and "FedMKT, wic one at lr 0.001: 0." in text


def test_a_yes_no_search_names_what_the_commoner_validation_answer_scores(tmp_path: Path) -> None:
    """A search of a yes/no task scored by accuracy says, under its table, what answering the commoner
    answer of each seed's validation questions scores (the split every searched run scores, not test's),
    and ``--render`` keeps it from the results file alone; a search scored otherwise says nothing."""
    from fedtune.config import load_config as load
    from fedtune.eval.metrics import commonest_answer
    from fedtune.rundata import prepare_data

    # Prepare: the previous search file holds the one cell (no run here)
    config = ROOT / "configs" / "test" / "fedmkt-tiny.yaml"
    results_dir = tmp_path / "results"
    results_dir.mkdir()
    earlier = {"lr0.001-wic-one-standalone": {"seeds": 1, "score": 0.5, "score_by_seed": {"0": 0.5}}}
    (results_dir / "sweep-lr-fedmkt-tiny.json").write_text(json.dumps({"results": earlier}))
    argv = [str(config), "--runs-dir", str(tmp_path / "runs"), "--results-dir", str(results_dir)]
    argv += ["--datasets", "wic", "--settings", "one", "--rows", "standalone", "--seeds", "0", "1"]
    argv += ["--lrs", "0.001", "--set", "fed.rounds=1", "--table-only", "--keep-earlier"]
    shares = []
    for seed in (0, 1):
        cfg = load(config, ["data.dataset=wordnet-wic", "data.eval_split=validation", f"seed={seed}"])
        records = prepare_data(cfg).eval_records
        found = commonest_answer([r.choices for r in records], [r.label for r in records])
        assert found is not None
        shares.append(f"{100 * found[1]:.2f}")
    # Execute
    fedmkt_table.main([*argv, "--set", "data.dataset=wordnet-wic", "--set", "eval.metrics=[acc]"])
    # Assert
    text = (results_dir / "sweep-lr-fedmkt-tiny.md").read_text()
    assert (
        f"wic: answering the commoner answer to every validation question scores {shares[0]}, {shares[1]} "
        "in seeds 0, 1 (one answer to every question scores that or its complement)"
    ) in text
    recorded = json.loads((results_dir / "sweep-lr-fedmkt-tiny.json").read_text())["results"]
    assert set(recorded["commoner"]["wic"]) == {"0", "1"}
    fedmkt_table.main(
        ["--render", str(results_dir / "sweep-lr-fedmkt-tiny.json"), "--results-dir", str(tmp_path)]
    )
    assert (tmp_path / "sweep-lr-fedmkt-tiny.md").read_text() == text
    fedmkt_table.main([*argv, "--overwrite"])  # scored by perplexity: no commoner answer to name
    assert "commoner" not in (results_dir / "sweep-lr-fedmkt-tiny.md").read_text()


def test_shared_from_takes_the_shared_rows_seeds_from_another_tables_file_where_no_run_is_here(
    tmp_path: Path,
) -> None:
    """``--shared-from``: the Centralized and LLM-on-public cells of a table made with the same config and
    --set (its name aside) fill the seeds with no run here (a run here wins), only for the models of this
    table's setting; the table names them, ``--render`` keeps them; another --set or another lr is
    refused, naming what differs."""
    # Prepare: the heterogeneous table's file (two SLMs), this one-to-one table's FedMKT run and the
    # LLM's Centralized run of seed 0
    config = ROOT / "configs" / "test" / "fedmkt-tiny.yaml"
    clients = yaml.safe_load(config.read_text())["fedmkt"]["clients"]
    slm, other = clients[0], "another-slm"
    runs, results_dir = tmp_path / "runs" / "fedmkt-tiny", tmp_path / "results"
    _fake_fedmkt_run(runs / "wic-one-fedmkt-s0", 20.0, 30.0, lr=0.001, clients=slm)
    _fake_fedmkt_run(runs / "wic-centralized-llm-s0", 50.0, lr=0.001, clients=slm)
    hetero = {
        "centralized": {"llm": {"0": 5.0, "1": 6.0}, slm: {"0": 8.0, "1": 9.0}, other: {"0": 1.0}},
        "llmpublic": {"llm": {"0": 7.0}},
        "standalone": {slm: {"0": 2.0}},  # no shared row: never taken
    }
    theirs = tmp_path / "table-hetero.json"

    def write(sets: str, row_lr: dict[str, float]) -> None:
        command = f"python experiments/fedmkt_table.py {config} --settings hetero2 {sets}"
        results = {"wic-hetero2": hetero, "row_lr": row_lr}
        theirs.write_text(json.dumps({"command": command, "results": results}))

    write("--set name=hetero --set fed.rounds=1", {})
    argv = [str(config), "--runs-dir", str(tmp_path / "runs"), "--results-dir", str(results_dir)]
    argv += ["--settings", "one", "--datasets", "wic", "--seeds", "0", "1", "--table-only"]
    argv += ["--set", "fed.rounds=1", "--shared-from", str(theirs)]
    # Execute
    fedmkt_table.main(argv)
    # Assert
    saved = json.loads((results_dir / "table-fedmkt-tiny.json").read_text())["results"]
    table = saved["wic-one"]
    assert table["centralized"] == {"llm": {"0": 50.0, "1": 6.0}, slm: {"0": 8.0, "1": 9.0}}
    assert table["llmpublic"] == {"llm": {"0": 7.0}} and "standalone" not in table
    assert saved["shared"] == {"wic-one": {"centralized": ["0", "1"], "llmpublic": ["0"]}}
    text = (results_dir / "table-fedmkt-tiny.md").read_text()
    assert "- Seeds of the runs the settings share taken from table-hetero.json (the same runs" in text
    assert "  - Centralized: 0, 1\n  - LLM on public set: 0\n" in text
    fedmkt_table.main(
        ["--render", str(results_dir / "table-fedmkt-tiny.json"), "--results-dir", str(tmp_path)]
    )
    assert (tmp_path / "table-fedmkt-tiny.md").read_text() == text
    write("--set name=hetero --set fed.rounds=2", {})
    with pytest.raises(SystemExit, match="its runs are not this table's"):
        fedmkt_table.main([*argv, "--overwrite"])
    write("--set fed.rounds=1", {"centralized": 0.01})
    with pytest.raises(
        SystemExit, match=re.escape("wic Centralized (llm) trained at lr 0.01, this table asks for None")
    ):
        fedmkt_table.main([*argv, "--overwrite"])


def test_row_lr_trains_every_model_of_a_row_at_its_lr_in_runs_of_its_own(tmp_path: Path) -> None:
    # Prepare
    cfg = load_config(ROOT / "configs" / "test" / "fedmkt-tiny.yaml")
    own = {"fedmkt": 0.01, "fedavg": 0.003}
    # Execute
    jobs = fedmkt_table.planned(cfg, ["wic"], ["homo"], [0], ["train.lr=0.5"], own)
    # Assert: the row's lr wins over --set, the LLM's moves with it (FedIT has no LLM), the rest as before
    fedmkt = jobs["wic-homo-fedmkt-lr0.01-s0"]
    assert fedmkt[-3:] == ["train.lr=0.01", "fedmkt.llm_train.lr=0.01", "seed=0"]
    assert jobs["wic-homo-fedavg-lr0.003-s0"][-2:] == ["train.lr=0.003", "seed=0"]
    assert not [
        o for o in jobs["wic-homo-standalone-s0"] if o.startswith(("train.lr=0.0", "fedmkt.llm_train"))
    ]
    assert list(fedmkt_table.pick_rows(jobs, ["fedmkt", "fedavg"])) == [
        "wic-homo-fedmkt-lr0.01-s0",
        "wic-homo-fedavg-lr0.003-s0",
    ]
    # the table reads the row's runs at its lr, and says so
    slm = cfg.fedmkt.clients[0]
    runs = tmp_path / "runs" / "fedmkt-tiny"
    _fake_fedmkt_run(runs / "wic-one-fedmkt-lr0.01-s0", 5.0, 6.0, lr=0.01, clients=slm)
    _fake_fedmkt_run(runs / "wic-one-fedmkt-s0", 50.0, 60.0, lr=0.01, clients=slm)  # the config's lr
    argv = [str(ROOT / "configs" / "test" / "fedmkt-tiny.yaml"), "--runs-dir", str(tmp_path / "runs")]
    argv += ["--results-dir", str(tmp_path), "--settings", "one", "--table-only", "--set", "fed.rounds=1"]
    fedmkt_table.main([*argv, "--row-lr", "fedmkt=0.01"])
    table = (tmp_path / "table-fedmkt-tiny.md").read_text()
    assert (
        "Rows at their own lr (the SLMs' train.lr and the LLM's fedmkt.llm_train.lr): FedMKT 0.01;" in table
    )
    assert "| FedMKT | 500.0 | 600.0 |" in table  # perplexity x 100, the run at lr 0.01
    saved = json.loads((tmp_path / "table-fedmkt-tiny.json").read_text())["results"]
    assert saved["row_lr"] == {"fedmkt": 0.01}
    fedmkt_table.main(
        ["--render", str(tmp_path / "table-fedmkt-tiny.json"), "--results-dir", str(tmp_path / "r")]
    )
    assert (tmp_path / "r" / "table-fedmkt-tiny.md").read_text() == table


def test_no_rounds_file_is_written_where_no_fedmkt_run_has_a_round(tmp_path: Path) -> None:
    """A table whose FedMKT cells are all kept from elsewhere (or not run yet) has no round to show: the
    script must not leave an empty ``rounds-<config>`` file beside the table."""
    results_dir = tmp_path / "results"
    argv = [str(ROOT / "configs" / "test" / "fedmkt-tiny.yaml"), "--runs-dir", str(tmp_path / "runs")]
    argv += ["--results-dir", str(results_dir), "--settings", "hetero2", "--datasets", "instruct"]
    fedmkt_table.main([*argv, "--seeds", "0", "--table-only", "--set=fed.rounds=2"])

    assert (results_dir / "table-fedmkt-tiny.md").is_file()
    assert not list(results_dir.glob("rounds-fedmkt-tiny.*"))


def test_models_picks_which_centralized_runs_start_in_a_table_and_in_a_search(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--models llm``: of the Centralized runs (one a model) only the LLM's start, the other rows' runs
    as ``--rows`` says; in a search too, at every lr; a model no setting holds is a usage error."""
    # Prepare
    cfg = load_config(ROOT / "configs" / "test" / "fedmkt-tiny.yaml")
    slm = cfg.fedmkt.clients[0]
    jobs = fedmkt_table.planned(cfg, ["wic"], ["one"], [0], [], {"centralized": 3e-05})
    started: list[list[str]] = []
    monkeypatch.setattr(
        fedmkt_table.search, "start", lambda args, runs: started.append([Path(r).name for r in runs])
    )
    argv = [str(ROOT / "configs" / "test" / "fedmkt-tiny.yaml"), "--runs-dir", str(tmp_path / "runs")]
    argv += ["--results-dir", str(tmp_path), "--settings", "one", "--set", "fed.rounds=1"]
    # Execute / Assert: the model of a run directory, at the config's lr, at its own and in a search
    assert fedmkt_table.centralized_model(f"wic-centralized-{slm}-lr3e-05-s0") == slm
    assert fedmkt_table.centralized_model("lr0.0032-instruct-centralized-llm-s2") == "llm"
    assert fedmkt_table.centralized_model("wic-one-fedmkt-s0") is None
    picked = fedmkt_table.pick_models(fedmkt_table.pick_rows(jobs, ["centralized", "fedmkt"]), ["llm"])
    assert list(picked) == ["wic-one-fedmkt-s0", "wic-centralized-llm-lr3e-05-s0"]
    assert fedmkt_table.pick_models(jobs, None) == jobs
    fedmkt_table.main([*argv, "--rows", "centralized", "--models", slm, "--lrs", "0.001", "0.01"])
    assert started == [[f"lr0.001-wic-centralized-{slm}-s0", f"lr0.01-wic-centralized-{slm}-s0"]]
    with pytest.raises(SystemExit):  # not a model of the one-to-one setting
        fedmkt_table.main([*argv, "--rows", "centralized", "--models", "gemma-3-270m", "--table-only"])
    with pytest.raises(SystemExit):  # --models picks Centralized runs: not without that row
        fedmkt_table.main([*argv, "--rows", "fedmkt", "--models", "llm", "--table-only"])


def test_row_lr_gives_one_model_its_own_centralized_lr_and_the_table_reads_each_at_its_own(
    tmp_path: Path,
) -> None:
    """``--row-lr centralized=A centralized-llm=B``: the LLM's Centralized runs train at B, the SLMs' at A,
    each in run directories of its own lr; the table reads each model's there and says so; keeping a
    model's seeds measured at another lr is refused model by model; a search whose Centralized runs
    disagree names each model's best lr; an unknown model is a usage error."""
    # Prepare
    config = ROOT / "configs" / "test" / "fedmkt-tiny.yaml"
    cfg = load_config(config)
    slm = cfg.fedmkt.clients[0]
    own = {"centralized": 0.003, "centralized-llm": 0.0008}
    # Execute / Assert: the runs
    jobs = fedmkt_table.planned(cfg, ["wic"], ["one"], [0], [], own)
    assert jobs["wic-centralized-llm-lr0.0008-s0"][-3:] == [
        "train.lr=0.0008",
        "fedmkt.llm_train.lr=0.0008",
        "seed=0",
    ]
    assert jobs[f"wic-centralized-{slm}-lr0.003-s0"][-3:-1] == ["train.lr=0.003", "fedmkt.llm_train.lr=0.003"]
    # the table reads each model's run at its lr (beside the setting's own FedMKT run)
    runs = tmp_path / "runs" / "fedmkt-tiny"
    _fake_fedmkt_run(runs / "wic-one-fedmkt-s0", 5.0, 6.0, lr=0.01, clients=slm)
    _fake_fedmkt_run(runs / "wic-centralized-llm-lr0.0008-s0", 4.0, lr=0.0008, clients=slm)
    _fake_fedmkt_run(runs / "wic-centralized-llm-lr0.003-s0", 40.0, lr=0.003, clients=slm)  # not the LLM's
    _fake_fedmkt_run(runs / f"wic-centralized-{slm}-lr0.003-s0", 7.0, lr=0.003, clients=slm)
    argv = [str(config), "--runs-dir", str(tmp_path / "runs"), "--results-dir", str(tmp_path)]
    argv += ["--settings", "one", "--table-only", "--set", "fed.rounds=1"]
    fedmkt_table.main([*argv, "--row-lr", "centralized=0.003", "centralized-llm=0.0008"])
    saved = json.loads((tmp_path / "table-fedmkt-tiny.json").read_text())["results"]
    assert saved["wic-one"]["centralized"] == {"llm": {"0": 4.0}, slm: {"0": 7.0}}
    assert saved["row_lr"] == own
    table = (tmp_path / "table-fedmkt-tiny.md").read_text()
    assert "own lr (the SLMs' train.lr and the LLM's fedmkt.llm_train.lr): Centralized 0.003, " in table
    assert "Centralized (llm) 0.0008;" in table
    # a seed kept for the LLM from a file that measured it at the row's 0.003 is refused, naming the model
    earlier = {"wic-one": {"centralized": {"llm": {"1": 5.0}}}, "row_lr": {"centralized": 0.003}}
    (tmp_path / "table-fedmkt-tiny.json").write_text(json.dumps({"results": earlier}))
    with pytest.raises(SystemExit, match=r"Centralized \(llm\): --keep-earlier would carry seeds 1"):
        fedmkt_table.main(
            [*argv, "--row-lr", *(f"{k}={v}" for k, v in own.items()), "--seeds", "0", "1", "--keep-earlier"]
        )
    with pytest.raises(SystemExit):  # no such model among the config's
        fedmkt_table.main([*argv, "--row-lr", "centralized-gemma-3-270m=0.001"])


def test_row_lr_gives_fedmkts_llm_its_own_lr_beside_its_slms_and_the_table_reads_that_run(
    tmp_path: Path,
) -> None:
    """``--row-lr fedmkt=A fedmkt-llm=B``: the FedMKT run trains its SLMs at A and its LLM at B, in run
    directories that name both; ``--rows fedmkt`` still picks them; the table reads that run and says the
    LLM's lr; keeping seeds measured with the LLM at the row's lr is refused."""
    # Prepare
    config = ROOT / "configs" / "test" / "fedmkt-tiny.yaml"
    cfg = load_config(config)
    slm = cfg.fedmkt.clients[0]
    own = {"fedmkt": 0.003, "fedmkt-llm": 0.0008}
    # Execute / Assert: the runs (the LLM's lr last: it wins over the row's)
    jobs = fedmkt_table.planned(cfg, ["wic"], ["one"], [0], [], own)
    assert jobs["wic-one-fedmkt-llmlr0.0008-lr0.003-s0"][-4:] == [
        "train.lr=0.003",
        "fedmkt.llm_train.lr=0.003",
        "fedmkt.llm_train.lr=0.0008",
        "seed=0",
    ]
    assert jobs["wic-one-standalone-s0"][-1] == "seed=0"  # the other rows do not change
    assert "fedmkt.llm_train.lr=0.0008" not in jobs["wic-one-slmpublic-s0"]
    only_llm = fedmkt_table.planned(cfg, ["wic"], ["one"], [0], [], {"fedmkt-llm": 0.0008})
    assert only_llm["wic-one-fedmkt-llmlr0.0008-s0"][-2:] == ["fedmkt.llm_train.lr=0.0008", "seed=0"]
    for picked in (jobs, only_llm):
        assert [name for name in fedmkt_table.pick_rows(picked, ["fedmkt"])] == [
            name for name in picked if "-fedmkt-" in name
        ]
    # the table reads the FedMKT run with the LLM at its lr, not the one at the row's
    runs = tmp_path / "runs" / "fedmkt-tiny"
    _fake_fedmkt_run(runs / "wic-one-fedmkt-llmlr0.0008-lr0.003-s0", 5.0, 6.0, lr=0.003, clients=slm)
    _fake_fedmkt_run(runs / "wic-one-fedmkt-lr0.003-s0", 50.0, 60.0, lr=0.003, clients=slm)
    argv = [str(config), "--runs-dir", str(tmp_path / "runs"), "--results-dir", str(tmp_path)]
    argv += ["--settings", "one", "--table-only", "--set", "fed.rounds=1"]
    fedmkt_table.main([*argv, "--row-lr", "fedmkt=0.003", "fedmkt-llm=0.0008"])
    saved = json.loads((tmp_path / "table-fedmkt-tiny.json").read_text())["results"]
    fedmkt = saved["wic-one"]["fedmkt"]
    assert (fedmkt["llm"], fedmkt[slm]) == ({"0": 5.0}, {"0": 6.0})
    assert saved["row_lr"] == own
    assert "FedMKT 0.003, FedMKT's LLM 0.0008;" in (tmp_path / "table-fedmkt-tiny.md").read_text()
    # seed 1 kept from a file whose FedMKT LLM trained at the row's 0.003 is refused, naming the LLM
    earlier = {"wic-one": {"fedmkt": {"llm": {"1": 5.0}, slm: {"1": 6.0}}}, "row_lr": {"fedmkt": 0.003}}
    (tmp_path / "table-fedmkt-tiny.json").write_text(json.dumps({"results": earlier}))
    refused = r"FedMKT's LLM: --keep-earlier would carry seeds 1, measured at lr 0.003"
    with pytest.raises(SystemExit, match=refused):
        fedmkt_table.main(
            [*argv, "--row-lr", "fedmkt=0.003", "fedmkt-llm=0.0008", "--seeds", "0", "1", "--keep-earlier"]
        )


def test_every_row_is_read_against_answering_the_commoner_answer_to_every_question() -> None:
    table = {
        "commoner": {m: {"0": 0.60, "1": 0.50, "2": 0.55} for m in ("llm", "s")},
        "zeroshot": {"s": {"0": 0.60, "1": 0.50, "2": 0.55}, "llm": {"0": 0.40, "1": 0.50, "2": 0.45}},
        "fedmkt": {"s": {"0": 0.65, "1": 0.54, "2": 0.61}},
    }
    lines = fedmkt_table.against_commoner(table, ["s"])
    # the LLM's zero-shot gains x 100: -20, 0, -10 (mean -10, sd 10); t(2 df, 0.975) = 4.303, half width
    # 4.303 * 10 / sqrt(3) = 24.84. The SLM's FedMKT gains 5, 4, 6 (mean 5, sd 1): half width 2.48
    assert lines == [
        "- LLM against answering the commoner answer to every question (60.0, 50.0, 55.0 in seeds 0, 1, 2): "
        "Zero-shot tie (gain -10.00, 95% CI [-34.84, 14.84], 3 seeds)",
        "- s against answering the commoner answer to every question (60.0, 50.0, 55.0 in seeds 0, 1, 2): "
        "Zero-shot tie (gain 0.00 in each of 3 seeds: no spread, the t interval is that point); "
        "FedMKT holds (gain 5.00, 95% CI [2.52, 7.48], 3 seeds)",
    ]
    assert fedmkt_table.ordering(table, ["s"])[-2:] == lines
    del table["commoner"]
    assert fedmkt_table.against_commoner(table, ["s"]) == []


def test_the_commoner_answer_is_the_yes_no_tasks_own_per_seed_and_none_where_choices_differ() -> None:
    from fedtune.rundata import prepare_data

    config = ROOT / "configs" / "test" / "fedmkt-tiny.yaml"
    chosen = ["wic", "defchoice", "instruct"]
    assert fedmkt_table.commoner_shares(config, [], chosen, [0]) == {}  # the config scores perplexity
    shares = fedmkt_table.commoner_shares(config, ["eval.metrics=[acc]"], chosen, [0, 1])
    assert set(shares) == {"wic"} and set(shares["wic"]) == {"0", "1"}
    for seed in (0, 1):
        cfg = load_config(config, ["data.dataset=wordnet-wic", f"seed={seed}"])
        labels = [r.label for r in prepare_data(cfg).eval_records]
        assert shares["wic"][str(seed)] == max(labels.count(0), labels.count(1)) / len(labels)
    cfg = load_config(config)
    slm = cfg.fedmkt.clients[0]
    stale = {"llm": {"0": 0.9, "1": 0.9}, slm: {"0": 0.9, "1": 0.9}}
    earlier = {
        "wic-one": {"fedmkt": {"llm": {"0": 0.5, "1": 0.7}, slm: {"0": 0.6, "1": 0.6}}, "commoner": stale}
    }
    args = (cfg, ROOT / "no-runs", ["wic"], ["one"], [0, 1], earlier)
    results = fedmkt_table.tabulate(*args, commoner=shares)
    rows = results["wic-one"]
    assert rows["commoner"] == {"llm": shares["wic"], slm: shares["wic"]}  # one reference, every column
    assert results["carried"] == {"wic-one": {"fedmkt": ["0", "1"]}}  # the reference is made, not kept
    assert "commoner" not in fedmkt_table.tabulate(*args)["wic-one"]
    assert fedmkt_table.tabulate(cfg, ROOT / "no-runs", ["wic"], ["one"], [0, 1], commoner=shares) == {}
