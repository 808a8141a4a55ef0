"""experiments/tables/, what the paper tables share: cells, the tie rule, reading runs, earlier results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from experiments import tables


def _run(path: Path, rows: list[dict[str, object]], rounds: int = 2, tail: str = "") -> Path:
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(f"fed:\n  rounds: {rounds}\n")
    (path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows) + tail)
    return path


def test_a_cell_is_mean_plus_minus_std_over_seeds_the_mean_alone_for_one() -> None:
    # the sample std: two seeds 1 apart from their mean give sqrt((1 + 1) / (2 - 1)) = 1.41
    assert tables.cell({"0": 12.0, "1": 10.0}) == "11.00 ± 1.41"
    assert tables.cell([0.5, 0.7], digits=1, scale=100.0) == "60.0 ± 14.1"
    assert tables.cell({"0": 0.5}, 1, 100.0) == "50.0"
    assert tables.cell({}) == tables.cell(None) == "-"
    assert tables.over_seeds("acc", {"10": 1.0, "2": 3.0}) == {
        "acc": 2.0,
        "acc_std": pytest.approx(2**0.5),  # 1 and 3: sample std sqrt(2)
        "acc_by_seed": {"2": 3.0, "10": 1.0},
    }
    assert list(tables.over_seeds("acc", {"10": 1.0, "2": 3.0})["acc_by_seed"]) == ["2", "10"]
    assert tables.over_seeds("acc", {}) == {}


def test_equal_means_are_a_tie_not_holds_whatever_the_float_order_of_summing() -> None:
    zero = sum([38 / 96, 33 / 96, 35 / 96]) / 3
    tuned = sum([37 / 96, 32 / 96, 37 / 96]) / 3
    assert zero != tuned  # the same 106 / 288, summed in another order
    assert tables.verdict([zero, tuned]) == "tie"
    assert tables.verdict([zero, tuned], strict=False) == "tie"
    assert tables.verdict([0.4, 0.5, 0.6]) == "holds"
    assert tables.verdict([0.4, 0.5, 0.5]) == "does not hold"
    assert tables.verdict([0.4, 0.5, 0.5], strict=False) == "holds"
    assert tables.verdict([0.5, 0.4]) == "does not hold"


def test_seeds_are_compared_on_the_seeds_every_column_has() -> None:
    low = {"0": 1.0, "1": 3.0, "2": 1.0}
    high = {"0": 2.0, "1": 2.0, "7": 9.0}
    assert tables.common_seeds([low, high]) == ["0", "1"]
    assert tables.seeds_holding([low, high]) == (1, 2)
    assert tables.seeds_holding([low, {"0": 1.0}]) == (0, 1)
    assert tables.seeds_holding([low, {"0": 1.0}], strict=False) == (1, 1)


def test_runs_are_read_through_read_metrics_and_count_once_finished(tmp_path: Path) -> None:
    rows = [{"round": 0}, {"round": 1, "bytes_up": 1e6}, {"round": 2, "bytes_up": 2e6, "eval": {"acc": 0.5}}]
    # a resumed run re-appends round 2; a killed write leaves a cut-off last line
    finished = _run(tmp_path / "fit-s0", [*rows, {**rows[2], "bytes_up": 4e6}], tail='{"round": 3')
    assert [row["round"] for row in tables.finished_rows(finished)] == [0, 1, 2]
    assert tables.per_round_mb(tables.read_rows(finished), "bytes_up") == 2.5
    assert tables.last_evaluated(tables.read_rows(finished), "acc") == {**rows[2], "bytes_up": 4e6}
    assert tables.last_evaluated(tables.read_rows(finished), "f1") is None
    unfinished = _run(tmp_path / "fit-s1", rows[:2])
    assert tables.read_rows(unfinished) and tables.finished_rows(unfinished) == []
    assert tables.read_rows(_run(tmp_path / "fit-s2", [], tail='{"round": 0')) == []
    assert tables.read_rows(tmp_path / "none") == [] == tables.finished_rows(tmp_path / "none")
    assert [tables.seed_of(d) for d in tables.seed_dirs(tmp_path, "perfit_s0.33-iid", [0, 12])] == ["0", "12"]


def test_a_finished_run_is_skipped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = _run(tmp_path / "fit-s0", [{"round": 0}, {"round": 1}], rounds=1)
    tables.run(tmp_path / "no-such-config.yaml", [], run_dir)
    assert capsys.readouterr().out == f"finished earlier: {run_dir}\n"


def test_earlier_results_are_a_tables_previous_rows(tmp_path: Path) -> None:
    stem = tmp_path / "table-fedmkt-wic-llm1.5b"
    assert tables.earlier_results(stem) == {}
    args = tables.table_parser(None).parse_args(["config.yaml"])
    tables.write_table(
        stem, "# table", "config.yaml", "python experiments/x.py", {"row": {"llm": {"0": 0.5}}}, args
    )
    assert tables.earlier_results(stem) == {"row": {"llm": {"0": 0.5}}}
    earlier = {"acc_by_seed": {"0": 1.0, "1": 2.0, "7": 3.0}}
    assert tables.carried_seeds(earlier, "acc", ["0", "1", "2"], ["1"]) == ["0"]
    tables.sibling(stem, ".json").write_text("{not json")
    with pytest.raises(SystemExit, match=r"llm1\.5b\.json: not a table's results file"):
        tables.earlier_results(stem)


def test_the_attack_table_says_rejected_absorbed_or_not_applicable() -> None:
    from experiments import attacks

    honest = {"touched": False, "metric": "perplexity", "value": 100.0}

    assert attacks.cell({"touched": False}, honest) == "-"
    assert attacks.cell({"touched": True, "rejected": "update norm ..."}, honest) == "rejected"
    honest["aggregate"] = 2.0
    absorbed = {"touched": True, "rejected": None, "value": 112.0, "metric": "perplexity", "aggregate": 5.0}
    assert attacks.cell(absorbed, honest) == "absorbed (+12%, aggregate x2.5)"
    assert attacks.cell(absorbed, {"error": "ConfigError: no"}) == "refused"
    assert attacks.cell({"touched": True, "error": "ValueError: x"}, honest) == "run stopped"
    assert attacks.final_metric([{"eval": {"rougeL": 0.0, "perplexity": 9.0, "perplexity_std": 1.0}}]) == (
        "perplexity",
        9.0,
    )


def test_the_rejection_note_names_every_reply_a_server_turned_away(tmp_path: Path) -> None:
    """A row built on a run whose server rejected a reply is not the method's plain average: the note
    names the run, the round, the client and the server's reason; no rejection, no note."""
    why = "update norm 25.83 exceeds 10 x the round's median update norm 1.173 (fed.screen)"
    screened = _run(
        tmp_path / "fedot-d0.5-s0",
        [{"round": 0}, {"round": 1, "rejected": {"c09": why}}, {"round": 2, "rejected": {}}],
    )
    clean = _run(tmp_path / "offsite-d0.5-s0", [{"round": 0}, {"round": 1}, {"round": 2, "rejected": {}}])
    missing = tmp_path / "fedbiot-d0.5-s0"  # not run here: nothing to say about it

    assert tables.rejected_replies(screened) == [(1, "c09", why)]
    assert tables.rejected_replies(clean) == tables.rejected_replies(missing) == []
    note = tables.rejected_note([clean, screened, missing])
    assert "left out of their round's aggregate" in note
    assert f"- fedot-d0.5-s0, round 1, c09: {why}" in note
    assert "offsite" not in note
    assert tables.rejected_note([clean, missing]) == ""


def test_the_rejection_note_tells_apart_runs_of_one_name_under_different_directories(tmp_path: Path) -> None:
    """The small-model study runs ``fedpt`` once per client model, each under its own directory: the note
    names a run by its path under ``under`` so the reader knows which model's run rejected a reply."""
    why = "update norm 9.1 exceeds 10 x the round's median update norm 0.4 (fed.screen)"
    small = _run(
        tmp_path / "fedpt-smollm2-l10" / "fedpt", [{"round": 0}, {"round": 1, "rejected": {"c01": why}}]
    )
    own = _run(tmp_path / "fedpt-smollm2" / "fedpt", [{"round": 0}, {"round": 1}])
    note = tables.rejected_note([own, small], under=tmp_path)
    assert f"- fedpt-smollm2-l10/fedpt, round 1, c01: {why}" in note
    assert "- fedpt, round" not in note


def test_keep_earlier_keeps_the_rejections_of_runs_that_are_elsewhere(tmp_path: Path) -> None:
    """A table rewritten with ``--keep-earlier`` keeps the rows of runs made on another machine, so it
    keeps what its previous write said of their rejected replies too: a run not here keeps its lines
    from the previous ``.md``; a run here is read again (its old lines go); a run not in the table
    stays out."""
    why = "update norm 25.83 exceeds 10 x the round's median update norm 1.173 (fed.screen)"
    head = "Replies the server rejected, left out of their round's aggregate (run, round, client: why):"
    old = [
        f"- fedot-d0.5-s0, round 1, c09: {why}",
        "- fedbiot-d0.5-s0, round 2, c01: stale",
        "- other-d0.5-s0, round 1, c00: not this table's",
    ]
    (tmp_path / "table-x.md").write_text("# table\n\n" + head + "\n\n" + "\n".join(old) + "\n")
    elsewhere = tmp_path / "runs" / "fedot-d0.5-s0"  # made on another machine: no run here
    here = _run(tmp_path / "runs" / "fedbiot-d0.5-s0", [{"round": 0}, {"round": 1}, {"round": 2}])

    note = tables.rejected_note([elsewhere, here], earlier=tmp_path / "table-x")

    assert f"- fedot-d0.5-s0, round 1, c09: {why} (previous results file)" in note
    assert "stale" not in note and "other-d0.5" not in note
    assert tables.rejected_note([elsewhere, here]) == ""  # without --keep-earlier: the runs here only
    assert tables.rejected_note([elsewhere], earlier=tmp_path / "table-none") == ""


def test_keep_earlier_rows_keeps_only_rows_the_previous_file_had_results_for(tmp_path: Path) -> None:
    """A row the previous write recorded as empty (no run anywhere) is not 'kept' again, nor named."""
    earlier = {"a": {"seeds": 2, "accuracy": 50.0}, "b": {"seeds": 0}}
    (tmp_path / "table-x.json").write_text(json.dumps({"results": earlier}))
    results: dict[str, dict[str, object]] = {"a": {"seeds": 0}, "b": {"seeds": 0}, "c": {"seeds": 1}}

    kept = tables.keep_earlier_rows(results, tmp_path / "table-x")

    assert kept == ["a"]
    assert results == {"a": earlier["a"], "b": {"seeds": 0}, "c": {"seeds": 1}}


def test_a_seed_runs_name_gives_its_row_key_and_the_lr_it_names() -> None:
    assert tables.run_name_parts("wic-one-fedmkt-s0") == ("wic-one-fedmkt", None)
    assert tables.run_name_parts(tables.lr_stem("perfit_s0.5-pathological", 1e-5) + "-s12") == (
        "perfit_s0.5-pathological",
        1e-5,
    )
    assert tables.run_name_parts("fedot-d0.5-lr0.01-s2") == ("fedot-d0.5", 0.01)
    assert tables.run_name_parts("unfinished") == ("unfinished", None)
    runs = [Path("a-lr0.01-s0"), Path("a-lr0.01-s1")]
    assert tables.asked_lr(runs) == 0.01 and tables.asked_lr([*runs, Path("a-s2")]) is None


def test_keep_earlier_seeds_refuses_seeds_measured_at_another_lr(tmp_path: Path) -> None:
    """A row now trained at lr 0.01 whose missing seeds the previous file measured at 0.001: the mean
    would mix two lrs under one lr cell, so the merge is refused, naming the row and both lrs; at the
    same lr (or where either side records none) the seeds are kept."""
    earlier = {"a": {"lr": 0.001, "x_by_seed": {"0": 3.0, "1": 5.0}, "seeds": 2}}
    (tmp_path / "table-x.json").write_text(json.dumps({"results": earlier}))

    def here(lr: float | None) -> dict[str, dict[str, object]]:
        row: dict[str, object] = {"x_by_seed": {"2": 6.0}, "seeds": 1}
        return {"a": row if lr is None else row | {"lr": lr}}

    with pytest.raises(SystemExit, match=r"a: .*seeds 0, 1, measured at lr 0\.001, .* lr 0\.01\b"):
        tables.keep_earlier_seeds(here(0.01), tmp_path / "table-x", [0, 1, 2])
    for lr in (0.001, None):
        results = here(lr)
        assert tables.keep_earlier_seeds(results, tmp_path / "table-x", [0, 1, 2]) == {"a": ["0", "1"]}
        assert results["a"]["x_by_seed"] == {"0": 3.0, "1": 5.0, "2": 6.0}


def test_a_table_is_not_rewritten_without_values_its_previous_file_has(tmp_path: Path) -> None:
    """Rewriting a table from fewer runs than its previous write (the others made elsewhere, no
    ``--keep-earlier``) would drop their values: refused, naming the file and what would go, and the files
    are left as they were; ``--overwrite`` writes it all the same."""
    stem = tmp_path / "table-fedmkt-wic-r5"
    args = tables.table_parser(None, keep_earlier=True).parse_args(["config.yaml"])
    first = {"row": {"llm": {"0": 0.5, "1": 0.25}, "seeds": 2}, "carried": {"row": ["0"]}}
    tables.write_table(stem, "# first", "config.yaml", "python experiments/x.py", first, args)
    fewer = {"row": {"llm": {"1": 0.25}, "seeds": 1}}  # seed 0's run is elsewhere; "carried" is no value
    with pytest.raises(
        SystemExit,
        match=r"table-fedmkt-wic-r5\.json: .* 1 value .*row/llm/0.*runs are not here; pass --keep-earlier",
    ):
        tables.write_table(stem, "# fewer", "config.yaml", "python experiments/x.py", fewer, args)
    assert tables.sibling(stem, ".md").read_text() == "# first\n"
    assert tables.earlier_results(stem) == first
    more = {"row": {"llm": {"0": 0.5, "1": 0.75, "2": 0.0}, "seeds": 3}}  # a value may change, none go
    tables.write_table(stem, "# more", "config.yaml", "python experiments/x.py", more, args)
    assert tables.earlier_results(stem) == more
    forced = tables.table_parser(None).parse_args(["config.yaml", "--overwrite"])
    tables.write_table(stem, "# fewer", "config.yaml", "python experiments/x.py", fewer, forced)
    assert tables.earlier_results(stem) == fewer
