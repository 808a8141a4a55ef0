"""experiments/tables/, the table machine: rows and seeds, aggregation over seeds, claims and their
verdicts, the notes that close a table, and re-rendering a table's markdown from its results file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from experiments import tables
from experiments.tables import layout

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "test" / "perfit-tiny.yaml"


def _run(path: Path, rows: list[dict[str, object]], rounds: int = 1) -> Path:
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(f"fed:\n  rounds: {rounds}\n")
    (path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_a_plan_names_each_run_by_row_and_seed_and_a_rows_keys_win_over_set(tmp_path: Path) -> None:
    # Prepare: two rows, two seeds, a --set
    rows = {"fit-iid": ["algorithm=fedit"], "perfit-iid": ["perfit.sparsity=0.5"]}
    # Execute
    by_row = tables.plan(tmp_path, rows, [0, 2], ["perfit.sparsity=0.1"])
    by_seed = tables.plan(tmp_path, rows, [0, 2], stems={"fit-iid": "shared"}, seed_major=True)
    # Assert
    assert by_row.dirs["fit-iid"] == [tmp_path / "fit-iid-s0", tmp_path / "fit-iid-s2"]
    assert by_row.runs[tmp_path / "perfit-iid-s2"] == ["perfit.sparsity=0.1", "perfit.sparsity=0.5", "seed=2"]
    assert [d.name for d in by_row.runs] == ["fit-iid-s0", "fit-iid-s2", "perfit-iid-s0", "perfit-iid-s2"]
    assert [d.name for d in by_seed.runs] == ["shared-s0", "perfit-iid-s0", "shared-s2", "perfit-iid-s2"]


def test_start_runs_nothing_with_table_only(tmp_path: Path) -> None:
    args = tables.table_parser(None).parse_args(["no-such-config.yaml", "--table-only"])
    tables.start(args, {tmp_path / "fit-s0": ["seed=0"]})  # a run would fail on the missing config
    assert not (tmp_path / "fit-s0.log").exists()


def test_values_are_aggregated_over_the_seeds_that_have_them() -> None:
    # Prepare: seed 1 did not score macro_f1
    evaluations = {"1": {"accuracy": 0.7}, "0": {"accuracy": 0.5, "macro_f1": 0.25}}
    # Execute
    values = tables.seed_values(evaluations, ["accuracy", "macro_f1", "rougeL"], scale=100)
    # Assert: mean, sample std (seeds 50 and 70: sqrt((10^2 + 10^2) / (2 - 1)) = 14.14), per seed in
    # numeric order; a key no seed has is left out, one seed has no spread
    assert values == {
        "accuracy": 60.0,
        "accuracy_std": pytest.approx(200**0.5),
        "accuracy_by_seed": {"0": 50.0, "1": 70.0},
        "macro_f1": 25.0,
        "macro_f1_std": 0.0,
        "macro_f1_by_seed": {"0": 25.0},
    }
    assert tables.cell(values["accuracy_by_seed"], 1) == "60.0 ± 14.1"
    assert tables.cell(values["accuracy_by_seed"], 1, ddof=0) == "60.0 ± 10.0"  # the population std
    assert tables.cell(values["macro_f1_by_seed"], 1) == "25.0"


def test_finals_are_the_last_evaluation_of_each_finished_run(tmp_path: Path) -> None:
    evaluated = {"round": 1, "eval": {"accuracy": 0.5}}
    done = _run(tmp_path / "fit-s0", [{"round": 0, "eval": {"accuracy": 0.1}}, evaluated])
    going = _run(tmp_path / "fit-s1", [{"round": 0}, {"round": 1}], rounds=2)
    scored_otherwise = _run(tmp_path / "fit-s2", [{"round": 0}, {"round": 1, "eval": {"rougeL": 0.3}}])

    assert tables.finals([done, going, scored_otherwise, tmp_path / "fit-s3"], "accuracy") == {"0": evaluated}
    assert list(tables.finals([done, going, scored_otherwise])) == ["0", "2"]


def test_a_claim_is_checked_on_the_means_and_seed_by_seed() -> None:
    low, high = {"0": 1.0, "1": 3.0, "2": 1.0}, {"0": 2.0, "1": 2.0, "2": 2.0}
    # Execute
    claim = tables.check([low, high])
    level = tables.check([low, high], means=[0.1 + 0.2, 0.3])  # equal but for the order of summing
    # Assert
    assert claim == tables.Verdict(means=(5 / 3, 2.0), verdict="holds", holding=2, seeds=3)
    assert level.verdict == "tie" and (level.holding, level.seeds) == (2, 3)
    assert tables.check([high, low]).verdict == "does not hold"


def test_rows_are_compared_on_the_seeds_they_all_have() -> None:
    cut, note = tables.on_common_seeds([{"0": 1.0, "1": 2.0, "5": 9.0}, {"0": 3.0, "1": 4.0}])
    assert cut == [{"0": 1.0, "1": 2.0}, {"0": 3.0, "1": 4.0}]
    assert note == " (on seeds 0, 1, which every row compared has)"
    assert tables.on_common_seeds([{"0": 1.0}, {"0": 2.0}]) == ([{"0": 1.0}, {"0": 2.0}], "")


def test_a_paired_interval_is_the_student_t_interval_of_the_gains_per_seed() -> None:
    # gains 1, 2, 3, 4, 5: mean 3, sample sd sqrt(2.5), t(4 df, 0.975) = 2.7764451051977987
    worse = {"0": 10.0, "1": 10.0, "2": 10.0, "3": 10.0, "4": 10.0, "9": 0.0}
    better = {"0": 11.0, "1": 12.0, "2": 13.0, "3": 14.0, "4": 15.0}
    interval = tables.paired_interval(worse, better)
    half = 2.7764451051977987 * 2.5**0.5 / 5**0.5
    assert interval.seeds == 5  # seed 9 has no pair
    assert interval.mean == pytest.approx(3.0)
    assert interval.sd == pytest.approx(2.5**0.5)
    assert (interval.low, interval.high) == (pytest.approx(3.0 - half), pytest.approx(3.0 + half))
    assert interval.verdict == "holds"
    assert interval.text() == "holds (gain 3.00, 95% CI [1.04, 4.96], 5 seeds)"


def test_a_paired_interval_says_reversed_tie_and_one_seed() -> None:
    # perplexity: lower is better, so a row with higher perplexity on every seed reverses the claim
    worse = {"0": 5.0, "1": 6.0, "2": 7.0}
    assert (
        tables.paired_interval(worse, {"0": 6.0, "1": 7.1, "2": 8.2}, lower_is_better=True).verdict
        == "reversed"
    )
    assert (
        tables.paired_interval(worse, {"0": 4.0, "1": 6.9, "2": 7.5}, lower_is_better=True).verdict == "tie"
    )
    assert (
        tables.paired_interval(worse, {"0": 4.0, "1": 5.1, "2": 6.2}, lower_is_better=True).verdict == "holds"
    )
    single = tables.paired_interval({"0": 1.0}, {"0": 2.0})
    assert (single.verdict, single.text()) == ("one seed", "one seed (gain 1.00)")


def test_a_paired_interval_of_one_gain_in_every_seed_says_it_has_no_spread() -> None:
    # one question more in every seed (fractions of 96, so the gains differ in their last bits): the t
    # interval's width is 0, a point, which must not read as a certain 95% interval
    worse = {"0": 1000 / 96, "1": 2000 / 96, "2": 3000 / 96}
    better = {"0": 1100 / 96, "1": 2100 / 96, "2": 3100 / 96}
    interval = tables.paired_interval(worse, better)
    assert interval.verdict == "holds" and interval.no_spread
    assert interval.text() == "holds (gain 1.04 in each of 3 seeds: no spread, the t interval is that point)"
    assert tables.paired_interval({"0": 0.5, "1": 0.5}, {"0": 0.5, "1": 0.5}).text() == (
        "tie (gain 0.00 in each of 2 seeds: no spread, the t interval is that point)"
    )
    assert not tables.paired_interval({"0": 1.0, "1": 2.0}, {"0": 2.0, "1": 3.5}).no_spread


def test_the_std_is_the_sample_one_the_population_one_times_sqrt_n_over_n_minus_1() -> None:
    values = [1.0, 2.0, 4.0]
    assert tables.mean_std(values) == tables.mean_std(values, ddof=1)  # the default
    assert tables.mean_std(values)[1] == pytest.approx(tables.mean_std(values, ddof=0)[1] * (3 / 2) ** 0.5)
    assert tables.mean_std([3.0]) == (3.0, 0.0)
    # 1 and 3: sample std sqrt(1 + 1) = 1.41, population std 1
    assert tables.cell({"0": 1.0, "1": 3.0}, 2) == "2.00 ± 1.41"
    assert tables.over_seeds("acc", {"0": 1.0, "1": 3.0})["acc_std"] == pytest.approx(2**0.5)


def test_a_claims_text_gives_the_interval_of_each_adjacent_pair_the_way_better_lies() -> None:
    # Prepare: perplexity, lower is better: FIT worse than PerFIT by 1, 2, 3 on seeds 0-2
    fit, perfit = {"0": 10.0, "1": 10.0, "2": 10.0}, {"0": 9.0, "1": 8.0, "2": 7.0}
    # gains 1, 2, 3: mean 2, sample sd 1, t(2 df, 0.975) = 4.302652729911275, half width 2.48
    pair = tables.claim_text([fit, perfit], lower_is_better=True)
    # Accuracy, higher is better, in percent: a < b < c, b and c apart by seed noise only
    low, mid, high = {"0": 0.1, "1": 0.2}, {"0": 0.3, "1": 0.4}, {"0": 0.35, "1": 0.35}
    chain = tables.claim_text([low, mid, high], ["a", "b", "c"], scale=100.0, digits=1)
    # Assert
    assert pair == "by interval: tie (gain 2.00, 95% CI [-0.48, 4.48], 3 seeds)"
    assert chain == (
        "by interval: b over a holds (gain 20.0 in each of 2 seeds: no spread, the t interval is that "
        "point); "
        "c over b tie (gain 0.0, 95% CI [-63.5, 63.5], 2 seeds)"
    )
    with pytest.raises(ValueError, match="a claim of 3 rows needs their names"):
        tables.claim_text([low, mid, high])


def test_the_closing_notes_name_what_was_kept_and_what_was_rejected(tmp_path: Path) -> None:
    why = "update norm 9.1 exceeds 10 x the round's median update norm 0.4 (fed.screen)"
    screened = _run(tmp_path / "fedot-s0", [{"round": 0}, {"round": 1, "rejected": {"c01": why}}])
    args = tables.table_parser(None, keep_earlier=True).parse_args(["config.yaml"])

    notes = tables.closing_notes({"fedot": [screened]}, tmp_path / "table-x", args, kept_rows=["FedOT iid"])

    assert notes == (
        "\n\nKept from the previous results file (no run of theirs here, `--keep-earlier`): FedOT iid.\n"
        "\n\n" + tables.REJECTED_HEAD + f"\n\n- fedot-s0, round 1, c01: {why}\n"
    )
    assert tables.run_notes("# table\n\n| a |" + notes) == notes


def test_a_declared_layout_lays_rows_out_under_its_columns() -> None:
    # Prepare: columns declared once, rows as (name, values)
    columns: list[layout.Column[tuple[str, dict[str, float]]]] = [
        layout.Column("row", lambda row: row[0]),
        layout.Column("acc", lambda row: layout.mean_std(row[1], "acc", 2)),
        layout.Column("ppl", lambda row: layout.number(row[1].get("ppl"), 1, " nats")),
        layout.Column("seeds", lambda row: len(row)),
    ]
    rows = [("fit", {"acc": 0.5, "acc_std": 0.125, "ppl": 3.14159}), ("perfit", {"acc": 0.75})]
    # Execute
    text = layout.table(columns, rows)
    # Assert: cells are their formatter's text (a number is never re-rounded by the table)
    assert text == (
        "| row | acc | ppl | seeds |\n|---|---|---|---|\n"
        "| fit | 0.50 ± 0.12 | 3.1 nats | 2 |\n| perfit | 0.75 | - | 2 |"
    )
    assert layout.table(columns, []) == "| row | acc | ppl | seeds |\n|---|---|---|---|"


def test_the_shared_columns_read_a_results_entry() -> None:
    results = {"fit-iid": {"mb_up": 1.234, "acc_by_seed": {"0": 50.0, "1": 70.0}, "seeds": 2}}
    columns = [layout.value("MB up", "mb_up", 1), layout.over_seeds("acc", "acc", scale=0.5), layout.SEEDS]
    # 50 and 70 times 0.5: 25 and 35, sample std sqrt(5^2 + 5^2) = 7.07
    assert layout.table(columns, results.items()).splitlines()[2] == "| 1.2 | 30.0 ± 7.1 | 2 |"
    one_seed = {"seeds": 1, "acc": 0.5, "acc_by_seed": {"0": 0.5}}
    assert layout.seeds_cell(one_seed, "acc", 100, seeds=3) == "50.00 (n=1)"
    assert (
        layout.seeds_cell(one_seed, "acc", 100, seeds=1) == layout.seeds_cell(one_seed, "acc", 100) == "50.00"
    )


def test_an_earlier_seed_fills_only_cells_and_seeds_asked_for_that_have_no_run_here() -> None:
    # Prepare: seed 1 ran here; the previous file has seeds 0, 1 and 7, and a group not asked for
    here = {"fedmkt": {"llm": {"1": 0.6}}}
    earlier = {
        "fedmkt": {"llm": {"0": 0.5, "1": 0.9, "7": 0.1}, "slm": {"0": 0.4}},
        "notes": ["not", "cells"],
        "other": {"llm": {"0": 1.0}},
    }
    # Execute
    kept = tables.fill_cells(here, earlier, ["0", "1"], groups=["fedmkt", "notes"])
    # Assert: the run here wins, seed 7 was not asked for, "other" is no group of the table
    assert here == {"fedmkt": {"llm": {"1": 0.6, "0": 0.5}, "slm": {"0": 0.4}}}
    assert kept == {"fedmkt": ["0"]}
    values = {"2": 9.0}
    assert tables.fill_seeds(values, {"0": 7, "2": 1.0}, ["2", "0"]) == ["0"]
    assert values == {"2": 9.0, "0": 7.0}


def test_a_seed_is_sliced_out_of_an_entry_that_recorded_several() -> None:
    entry = {"rougeL": 0.3, "rougeL_by_seed": {"0": 0.2, "1": 0.4}, "alpha_by_seed": {"1": 2.0}}
    assert tables.seed_slice(entry, "1") == {"rougeL": 0.4, "alpha": 2.0}
    assert tables.seed_slice(entry, "0") == {"rougeL": 0.2}
    assert tables.seed_slice(entry, "5") == {}


def _render_table(recorded: tables.Recorded) -> str:
    rows = [[key, tables.cell(row["acc_by_seed"], 1)] for key, row in recorded.results.items()]
    return f"# {recorded.cfg.name}, seeds {recorded.args.seeds}\n\n" + tables.markdown_table(
        ["row", "acc"], rows
    )


def test_render_rewrites_a_tables_markdown_from_its_results_file_alone(tmp_path: Path) -> None:
    # Prepare: a results file, and the .md beside it closing with a note on its runs
    results = {"fit": tables.over_seeds("acc", {"0": 50.0, "1": 70.0})}
    command = f"python experiments/x_table.py {CONFIG} --seeds 0 1 --table-only"
    json_path = tmp_path / "results" / "table-x.json"
    json_path.parent.mkdir()
    json_path.write_text(json.dumps({"config": "x", "command": command, "results": results}))
    note = "\n\nKept from the previous results file (no run of theirs here, `--keep-earlier`): fit.\n"
    json_path.with_suffix(".md").write_text("# old layout" + note)
    parser = tables.table_parser(None)
    # Execute
    written = tables.render(json_path, parser, {"table-": _render_table, "table-y": _render_table}, tmp_path)
    # Assert: the options are the recorded command's; the numbers the file's (50, 70: sample std 14.14);
    # the note the .md's
    assert written == tmp_path / "table-x.md"
    assert (
        written.read_text()
        == "# perfit-tiny, seeds [0, 1]\n\n| row | acc |\n|---|---|\n| fit | 60.0 ± 14.1 |" + note
    )


def test_render_names_the_file_it_cannot_render(tmp_path: Path) -> None:
    path = tmp_path / "sweep-x.json"
    path.write_text(json.dumps({"command": f"python x.py {CONFIG}", "results": {"fit": {}}}))
    parser = tables.table_parser(None)
    with pytest.raises(SystemExit, match=r"sweep-x\.json: no table of this script is named so"):
        tables.render(path, parser, {"table-": _render_table}, tmp_path)
    renamed = path.rename(tmp_path / "table-x.json")
    with pytest.raises(SystemExit, match=r"table-x\.json: these results lack what the table shows today"):
        tables.render(renamed, parser, {"table-": _render_table}, tmp_path)


@pytest.mark.parametrize(
    ("script", "table"),
    [
        ("perfit_table", "table-perfit-smollm2"),
        ("perfit_table", "sweep-lr-perfit-smollm2"),
        ("perfit_table", "table-perfit-smollm2-lr"),
        ("perfit_table", "sweep-lr-perfit-smollm2-dirichlet"),
        ("perfit_table", "sweep-lr-perfit-smollm2-variants"),
        ("perfit_table", "sweep-lr-perfit-smollm2-variants-dirichlet"),
        ("fedpft_table", "sweep-lr-fedpft-minilm-distill-r30"),
        ("fedpft_table", "table-fedpft-minilm-distill-r30"),
        ("fedbiot_table", "sweep-lr-fedbiot-qa-k30"),
        ("fedbiot_table", "table-fedbiot-qa-k30"),
        ("fedbiot_table", "table-fedbiot-qa-k30-d0.5"),
        ("fedbiot_table", "table-fedbiot-qa-k30-t100"),
        ("fedbiot_table", "table-fedbiot-code-k30"),
        ("fedbiot_table", "table-fedbiot-math-k30"),
        ("fedbiot_table", "sweep-lr-fedbiot-math-k30"),
        ("fedbiot_table", "sweep-lr-fedbiot-code-k30"),
        ("fedmkt_table", "table-fedmkt-wic"),
        ("fedmkt_table", "table-fedmkt-wic-r5"),
        ("fedmkt_table", "table-fedmkt-wic-lr"),
        ("fedmkt_table", "sweep-lr-fedmkt-wic"),
        ("fedmkt_table", "table-fedmkt-wic-r5-lr"),
        ("fedmkt_table", "sweep-lr-fedmkt-wic-r5-lr"),
        ("fedmkt_table", "table-fedmkt-wic-r5-lr-defchoice"),
        ("fedmkt_table", "sweep-lr-fedmkt-wic-r5-lr-defchoice"),
        ("fedmkt_table", "sweep-lr-fedmkt-wic-r5-lr-wic"),
        ("fedmkt_table", "table-fedmkt-wic-r5-lr-wic"),
        ("fedmkt_table", "rounds-fedmkt-wic-r5-lr-wic"),
        ("fedmkt_table", "sweep-lr-fedmkt-wic-r5-lr-one"),
        ("fedmkt_table", "table-fedmkt-wic-r5-lr-one"),
        ("fedmkt_table", "rounds-fedmkt-wic-r5-lr-one"),
        ("fedmkt_table", "sweep-lr-fedmkt-wic-r5-lr-homo"),
        ("fedmkt_table", "table-fedmkt-wic-r5-lr-homo"),
        ("fedmkt_table", "rounds-fedmkt-wic-r5-lr-homo"),
        ("fedpt_table", "table-fedpt-smollm2"),
        ("fedpt_table", "table-fedpt-smollm2-lr"),
        ("fedpt_table", "sweep-lr-fedpt-smollm2"),
        ("fedpt_table", "sweep-lr-fedpt-smollm2-dirichlet"),
        ("fedpt_table", "table-fedpt-smollm2-dirichlet-lr"),
        ("fedpt_table", "table-fedpt-smollm2-r20"),
        ("fedpt_table", "table-fedpt-smollm2-r20-lr"),
        ("unequal_table", "search-unequal-smollm2"),
        ("unequal_table", "table-unequal-smollm2"),
    ],
)
def test_a_committed_table_renders_from_its_json_byte_for_byte(
    script: str, table: str, tmp_path: Path
) -> None:
    import importlib

    results = ROOT / "experiments" / "results"
    module = importlib.import_module(f"experiments.{script}")
    module.main(["--render", str(results / f"{table}.json"), "--results-dir", str(tmp_path)])
    assert (tmp_path / f"{table}.md").read_bytes() == (results / f"{table}.md").read_bytes()


def test_at_own_lr_gives_the_named_rows_their_lr_last_and_a_stem_of_their_own() -> None:
    rows = {"fedot-d0.2": ["fedbiot.split=first_last"], "fedbiot_a2-d0.2": ["fedbiot.split=last"]}
    stems = tables.at_own_lr(rows, {"fedot": 0.01}, lambda key: key.rpartition("-d")[0])
    assert stems == {"fedot-d0.2": "fedot-d0.2-lr0.01"}
    assert rows["fedot-d0.2"] == ["fedbiot.split=first_last", "train.lr=0.01"]  # last: it wins
    assert rows["fedbiot_a2-d0.2"] == ["fedbiot.split=last"]


def test_run_lr_reads_the_lr_a_run_saved(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "config.yaml").write_text("train:\n  lr: 0.005\n")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "config.yaml").write_text("name: x\n")
    assert tables.run_lr(tmp_path / "a") == 0.005
    assert tables.run_lr(tmp_path / "b") is None and tables.run_lr(tmp_path / "none") is None


def test_a_rows_lr_is_the_one_its_runs_saved_and_none_where_they_differ(tmp_path: Path) -> None:
    # Prepare: runs that saved lrs 1e-2 and 1e-2, one that saved 3e-3, one that saved no config
    def saved(name: str, text: str | None) -> Path:
        path = tmp_path / name
        path.mkdir()
        if text is not None:
            (path / "config.yaml").write_text(text)
        return path

    a, b = saved("a", "train:\n  lr: 0.01\n"), saved("b", "train:\n  lr: 1.0e-2\n")
    c, bare = saved("c", "train:\n  lr: 0.003\n"), saved("bare", None)
    # Execute / Assert
    assert tables.runs_lr([a, b, bare]) == {"lr": 0.01}
    assert tables.runs_lr([a, c]) == {"lr": None}
    assert tables.runs_lr([bare]) == {}
    assert tables.lr_stem("fit", 0.01) == "fit-lr0.01" and tables.lr_override(0.01) == "train.lr=0.01"


def test_the_row_lr_line_names_a_row_whose_settings_disagree_instead_of_choosing() -> None:
    from experiments.tables import search

    # Prepare: fit agrees on 1e-2 in both partitions; perfit's best differs between them
    best = {"fit-iid": 0.01, "fit-dir": 0.01, "perfit-iid": 0.003, "perfit-dir": 0.01}
    # Execute
    line = search.row_lr_line(best, lambda key: key.split("-")[0])
    only_split = search.row_lr_line({"perfit-iid": 0.003, "perfit-dir": 0.01}, lambda key: key.split("-")[0])
    # Assert
    assert line == (
        "The table at these lrs: `--row-lr fit=0.01`\n\nBest lr differs between the runs of: perfit"
    )
    assert only_split == "Best lr differs between the runs of: perfit"


def test_the_row_lr_line_gives_each_model_its_lr_where_a_rows_runs_are_one_a_model() -> None:
    """A row of one run a model (FedMKT's Centralized): where its runs disagree each model's own name
    carries its lr; where one model's runs disagree too (two datasets) the row is named instead."""
    from experiments.tables import search

    # Prepare
    def row(key: str) -> str:
        return "centralized" if "-centralized-" in key else key.split("-")[-1]

    def own(key: str) -> str | None:
        return f"centralized-{key.split('-centralized-')[1]}" if "-centralized-" in key else None

    best = {"wic-one-fedmkt": 0.01, "wic-centralized-llm": 0.0008, "wic-centralized-slm": 0.003}
    # Execute
    apart = search.row_lr_line(best, row, own)
    clash = search.row_lr_line({**best, "instruct-centralized-llm": 0.003}, row, own)
    # Assert
    assert apart == (
        "The table at these lrs: `--row-lr fedmkt=0.01 centralized-llm=0.0008 centralized-slm=0.003`"
    )
    assert clash.endswith("`--row-lr fedmkt=0.01`\n\nBest lr differs between the runs of: centralized")
    assert search.row_lr_line(best, row).endswith("Best lr differs between the runs of: centralized")


def test_a_table_names_runs_that_computed_at_different_thread_counts(tmp_path: Path) -> None:
    from experiments.tables import notes

    # Prepare: two rows' runs at 1 thread, one at 2, one made before runs recorded the count
    def run(name: str, threads: int | None) -> Path:
        path = tmp_path / name
        path.mkdir()
        facts = "" if threads is None else f"_run:\n  threads: {threads}\n"
        (path / "config.yaml").write_text(f"seed: 0\n{facts}")
        return path

    dirs = {"fedot": [run("fedot-s0", 1), run("fedot-s1", 2)], "offsite": [run("offsite-s0", 1)]}
    old = run("old-s0", None)
    args = tables.table_parser(None).parse_args(["x.yaml"])
    # Execute
    text = tables.closing_notes(dirs, tmp_path / "table-x", args)
    same = notes.threads_note([*dirs["offsite"], dirs["fedot"][0], old])
    # Assert
    assert text.startswith(f"\n\n{notes.THREADS_HEAD}")
    assert "1 thread(s): fedot-s0, offsite-s0; 2 thread(s): fedot-s1." in text
    assert same == "" and notes.run_threads(old) is None
    assert notes.run_notes("# table\n\n| a |" + text) == text  # --render keeps it


def test_keep_earlier_counts_a_cells_seeds_from_its_values_in_a_file_that_did_not_record_the_count(
    tmp_path: Path,
) -> None:
    """A search file written before cells recorded ``seeds`` still has every cell's per-seed values:
    --keep-earlier keeps a row none of whose runs is here, and fills a row's missing seed, from them."""
    earlier = {
        "whole": {"score": 0.4, "score_std": 0.0, "score_by_seed": {"0": 0.4}},
        "part": {"score": 0.3, "score_std": 0.0, "score_by_seed": {"0": 0.3}},
    }
    (tmp_path / "sweep.json").write_text(json.dumps({"results": earlier}))
    results = {"whole": {}, "part": tables.over_seeds("score", {"1": 0.5})}
    assert tables.keep_earlier_rows(results, tmp_path / "sweep") == ["whole"]
    assert results["whole"] == earlier["whole"]
    assert tables.keep_earlier_seeds(results, tmp_path / "sweep", [0, 1], ["whole"]) == {"part": ["0"]}
    assert results["part"]["score_by_seed"] == {"1": 0.5, "0": 0.3}
    assert tables.fewer_seeds(earlier["whole"], 3) == " (1 seed)"


def test_a_fedpt_table_with_rows_of_unequal_seed_counts_says_each_rows_count_and_shows_a_lone_seed(
    tmp_path: Path,
) -> None:
    # Prepare: a three-seed table, Base (large) cut to seed 0 alone (no _by_seed fields, as a one-seed
    # entry is stored) and FedAvg (small) to seeds 0 and 1
    from experiments import fedpt_table

    data = json.loads((ROOT / "experiments" / "results" / "table-fedpt-smollm2-r20.json").read_text())
    base, small = data["results"]["base_large"], data["results"]["fedavg_small"]
    lone = base["eval"]["rougeL_by_seed"]["0"]
    one_seed = {k.removesuffix("_by_seed"): v["0"] for k, v in base["eval"].items() if k.endswith("_by_seed")}
    base["eval"] = one_seed
    base["training_seeds"] = ["0"]
    for key in [k for k in small["eval"] if k.endswith("_by_seed")]:
        small["eval"][key].pop("2")
    small["training_seeds"] = ["0", "1"]
    (tmp_path / "table-t.json").write_text(json.dumps(data))
    # Execute
    fedpt_table.main(["--render", str(tmp_path / "table-t.json"), "--results-dir", str(tmp_path)])
    text = (tmp_path / "table-t.md").read_text()
    # Assert: no row is said to have three seeds that has fewer; the lone seed's value is in its column
    assert "mean ± std over 3 training seeds" not in text
    assert "Base (large): 1" in text and "FedAvg (small): 2" in text and "FedPT: 3" in text
    per_seed = text.split("Rouge-L per training seed:")[1]
    base_row = next(line for line in per_seed.splitlines() if line.startswith("| Base (large) |"))
    assert base_row.split("|")[2].strip() == f"{lone:.4f}"
    assert base_row.split("|")[3].strip() == "-"
