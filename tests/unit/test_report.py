"""`fedtune report` on hand-written run directories: numbers in report.md, PNGs, compare mode, errors."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from PIL import Image

from fedtune.report import (
    ReportError,
    markdown_table,
    partition_table,
    plot_partition,
    read_metrics,
    write_report,
)
from fedtune.report.report import category_table, few_examples

COUNTS = {
    "client_10": {"open_qa": 5, "summarization": 1},
    "client_2": {"open_qa": 3, "brainstorming": 7},
    "client_1": {"summarization": 4},
}

EVAL_COUNTS = {"open_qa": 3, "poetry": 2, "summarization": 4}


def training_row(round_number: int, **overrides: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "round": round_number,
        "clients": ["client_1", "client_2"],
        "failed": {},
        "rejected": {},
        "train_loss": 2.0,
        "num_examples": 32,
        "tokens": 4000,
        "bytes_up": 1_000_000,
        "bytes_down": 2_000_000,
        "client_seconds": 8.0,
        "server_seconds": 1.0,
        "round_seconds": 10.0,
        "peak_rss_mb": 900.0,
    }
    row.update(overrides)
    return row


def resumed_run_lines() -> list[str]:
    """Rounds 0-2, where round 2 was re-run after a resume and the process then died mid-write."""
    rows = [
        {
            "round": 0,
            "eval": {"rougeL": 0.2, "perplexity": 20.0},
            "eval_by_category": {"rougeL": {"open_qa": 0.1, "summarization": 0.3, "poetry": 0.0}},
        },
        training_row(1),
        training_row(2, train_loss=9.9, bytes_up=99_000_000, eval={"rougeL": 0.9, "perplexity": 1.0}),
        training_row(
            2,
            train_loss=1.5,
            bytes_up=1_500_000,
            bytes_down=2_500_000,
            round_seconds=14.0,
            peak_rss_mb=950.0,
            failed={"client_3": "timeout"},
            eval={"rougeL": 0.35, "perplexity": 12.5},
            eval_by_category={"rougeL": {"open_qa": 0.25, "summarization": 0.4, "poetry": 0.05}},
        ),
    ]
    return [json.dumps(row) for row in rows] + ['{"round": 3, "clients": ["cl']


def write_run(run_dir: Path, name: str, algorithm: str, metrics_text: str) -> Path:
    run_dir.mkdir(parents=True)
    config = {
        "name": name,
        "seed": 7,
        "algorithm": algorithm,
        "model": {"name": "tiny-gpt2"},
        "data": {"dataset": "dolly", "partition": {"scheme": "dirichlet", "num_clients": 3}},
        "fed": {"rounds": 2, "mode": "simulation"},
    }
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    (run_dir / "metrics.jsonl").write_text(metrics_text, encoding="utf-8")
    return run_dir


def squeeze(text: str) -> str:
    """Markdown with column padding removed, so assertions do not depend on column widths."""
    return re.sub(r" +", " ", text)


def assert_valid_png(path: Path) -> None:
    with Image.open(path) as image:
        image.verify()
        assert image.format == "PNG"
        assert image.size[0] > 200 and image.size[1] > 200


@pytest.fixture(scope="module")
def compared_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("runs")
    run_dir = write_run(root / "fedpt", "fedpt-run", "fedpt", "\n".join(resumed_run_lines()))
    (run_dir / "data_stats.json").write_text(
        json.dumps({"dataset": "dolly", "scheme": "dirichlet", "counts": COUNTS, "eval_counts": EVAL_COUNTS}),
        encoding="utf-8",
    )
    other_rows = [{"round": 0, "eval": {"rougeL": 0.2}}, training_row(1, eval={"rougeL": 0.3})]
    other_text = "\n".join(json.dumps(row) for row in other_rows) + "\n"
    other_dir = write_run(root / "fedavg", "fedavg-run", "fedavg", other_text)
    return write_report(run_dir, compare=[other_dir])


def test_read_metrics_keeps_last_duplicate_and_skips_partial_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run_dir = write_run(tmp_path / "run", "r", "fedavg", "\n".join(resumed_run_lines()))

    with caplog.at_level(logging.WARNING):
        rows = read_metrics(run_dir)

    assert [row["round"] for row in rows] == [0, 1, 2]
    assert rows[2]["train_loss"] == 1.5
    assert "metrics.jsonl:5: skipping partially written last line" in caplog.text


def test_read_metrics_rejects_corrupt_line_in_the_middle(tmp_path: Path) -> None:
    lines = resumed_run_lines()
    run_dir = write_run(tmp_path / "run", "r", "fedavg", "\n".join([lines[0], "{oops", lines[1]]) + "\n")

    with pytest.raises(ReportError, match=r"metrics\.jsonl:2: not valid JSON"):
        read_metrics(run_dir)


def test_empty_metrics_error_names_the_file(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run", "r", "fedavg", "")

    with pytest.raises(ReportError, match=re.escape(str(run_dir / "metrics.jsonl"))):
        write_report(run_dir)


def test_markdown_table_formats_numbers_and_right_aligns_numeric_columns() -> None:
    table = markdown_table(["name", "value", "count"], [["a|b", 0.123456, 1234567], ["c", None, 2]])

    assert table.splitlines() == [
        "| name |  value |     count |",
        "| ---- | -----: | --------: |",
        "| a\\|b | 0.1235 | 1,234,567 |",
        "| c    |      – |         2 |",
    ]


def test_partition_table_orders_clients_naturally_and_totals() -> None:
    lines = squeeze(partition_table(COUNTS)).splitlines()

    assert lines[0] == "| client | open_qa | brainstorming | summarization | total |"
    assert [line.split("|")[1].strip() for line in lines[2:]] == [
        "client_1",
        "client_2",
        "client_10",
        "**total**",
    ]
    assert lines[-1] == "| **total** | 8 | 7 | 5 | 20 |"


def test_report_summarises_before_after_and_totals(compared_report: Path) -> None:
    text = squeeze(compared_report.read_text(encoding="utf-8"))

    assert "| Metric | Before (round 0) | Final (round 2) | Δ |" in text
    assert "| rougeL | 0.2 | 0.35 | +0.15 |" in text
    assert "| perplexity | 20 | 12.5 | -7.5 |" in text
    assert "| Upload total (MB) | 2.5 |" in text
    assert "| Download total (MB) | 4.5 |" in text
    assert "| Mean round time (s) | 12 |" in text
    assert "| Peak RSS (MiB) | 950 |" in text
    assert "| Failed client-rounds | 1 |" in text
    assert "| rougeL | open_qa | 3 | yes | 0.1 | 0.25 | +0.15 † |" in text
    assert "| rougeL | poetry | 2 | no * | 0 | 0.05 | +0.05 † |" in text
    assert "† scored on fewer than 10 examples: a difference there is mostly noise" in text
    assert "in no client's training data: poetry" in text
    assert "| client_10 | 5 | 0 | 1 | 6 |" in text


def test_category_changes_from_fewer_than_10_examples_are_marked_as_noise() -> None:
    # Prepare: one category scored on 9 examples, one on 10, one without a count
    before = {"rougeL": {"few": 0.2, "enough": 0.2, "unknown": 0.2}}
    final = {"rougeL": {"few": 0.5, "enough": 0.5, "unknown": 0.5}}

    # Execute
    text = squeeze(category_table(before, final, {"few": 9, "enough": 10}))

    # Assert: n shown per category, only the change from 9 examples marked
    assert "| rougeL | few | 9 | | 0.2 | 0.5 | +0.3 † |" in text
    assert "| rougeL | enough | 10 | | 0.2 | 0.5 | +0.3 |" in text
    assert "| rougeL | unknown | – | | 0.2 | 0.5 | +0.3 |" in text
    assert few_examples({"few": 9, "enough": 10}) == ["few"]


def test_report_writes_valid_pngs_and_links_them(compared_report: Path) -> None:
    plots_dir = compared_report.parent / "plots"
    names = {
        "learning_curves.png",
        "category_scores.png",
        "bytes_per_round.png",
        "partition.png",
        "compare_learning_curves.png",
    }

    assert {path.name for path in plots_dir.iterdir()} == names
    for name in names:
        assert_valid_png(plots_dir / name)
        assert f"(plots/{name})" in compared_report.read_text(encoding="utf-8")


def test_report_compares_runs(compared_report: Path) -> None:
    text = squeeze(compared_report.read_text(encoding="utf-8"))

    assert "| Run | Algorithm | Rounds | final rougeL | final perplexity | Up (MB) | Down (MB) |" in text
    assert "| fedpt-run | fedpt | 2 | 0.35 | 12.5 | 2.5 | 4.5 | 24 |" in text
    assert "| fedavg-run | fedavg | 1 | 0.3 | – | 1 | 2 | 10 |" in text


def test_plot_partition_handles_a_hundred_clients(tmp_path: Path) -> None:
    counts = {f"client_{i}": {"open_qa": i + 1, "brainstorming": 100 - i} for i in range(100)}

    path = plot_partition(counts, tmp_path / "partition.png", "100 clients")

    assert_valid_png(path)
    with Image.open(path) as image:
        assert image.size[1] > 1500


def test_traffic_is_shown_in_decimal_megabytes_everywhere() -> None:
    from fedtune.progress import round_summary
    from fedtune.units import megabytes

    assert megabytes(2_500_000) == "2.50 MB"
    row = {"round": 1, "train_loss": 1.0, "bytes_up": 2_500_000, "eval": {}}
    assert "up 2.50 MB" in round_summary(row)


def test_report_shows_each_clients_own_evaluation(tmp_path: Path) -> None:
    rows = [
        {
            "round": 0,
            "eval": {"personal/perplexity": 9.0},
            "eval_by_client": {"c00": {"perplexity": 8.0}, "c01": {"perplexity": 10.0}},
        },
        {
            "round": 1,
            "train_loss": 1.0,
            "num_examples": 4,
            "bytes_up": 10,
            "bytes_down": 10,
            "eval": {"personal/perplexity": 6.0},
            "eval_by_client": {"c00": {"perplexity": 5.0}, "c01": {"perplexity": 7.0}},
        },
    ]
    run_dir = write_run(tmp_path / "run", "p", "perfit", "".join(json.dumps(r) + "\n" for r in rows))
    (run_dir / "data_stats.json").write_text(
        json.dumps({"counts": {"c00": {"nouns": 3}, "c01": {"verbs": 2}}})
    )
    text = squeeze(write_report(run_dir).read_text())
    assert "## Per-client evaluation" in text
    assert "| c00 | nouns | 8 | 5 |" in text and "| c01 | verbs | 10 | 7 |" in text


def test_a_non_finite_metric_is_written_as_null_and_named() -> None:
    from fedtune.runner import metrics_line

    def no_constants(name: str) -> None:
        raise AssertionError(f"not strict JSON: {name}")

    row = {"round": 1, "train_loss": float("inf"), "eval": {"personal/perplexity": float("nan"), "acc": 0.5}}

    parsed = json.loads(metrics_line(row), parse_constant=no_constants)

    assert parsed["eval"] == {"personal/perplexity": None, "acc": 0.5} and parsed["train_loss"] is None
    assert parsed["non_finite"] == ["train_loss: inf", "eval.personal/perplexity: nan"]
    assert "non_finite" not in json.loads(metrics_line({"round": 0, "eval": {"acc": 1.0}}))


def write_cost_run(
    root: Path,
    name: str,
    algorithm: str,
    rows: list[dict[str, Any]],
    dataset: str = "dolly",
    **sections: Any,
) -> Path:
    """A run directory for the quality-against-client-cost table: ``sections`` are extra config sections."""
    run_dir = root / name
    run_dir.mkdir(parents=True)
    config = {
        "name": name,
        "algorithm": algorithm,
        "data": {"dataset": dataset},
        "fed": {"mode": "federated"},
    }
    config.update(sections)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return run_dir


def cost_rows(peaks: list[float | None], ups: list[int], rouge: float) -> list[dict[str, Any]]:
    """Round 0 (evaluation only) and one training row per peak; the last one evaluated."""
    rows: list[dict[str, Any]] = [{"round": 0, "eval": {"rougeL": 0.1}}]
    for number, (peak, up) in enumerate(zip(peaks, ups, strict=True), start=1):
        row = training_row(number, bytes_up=up, bytes_down=2 * up)
        if peak is not None:
            row["client_peak_mem_mb"] = peak
        rows.append(row)
    rows[-1]["eval"] = {"rougeL": rouge}
    return rows


def cost_table(report: Path) -> list[str]:
    text = squeeze(report.read_text(encoding="utf-8"))
    section = text.split("### Quality against client cost")[1].split("## Per-round metrics")[0]
    return [line for line in section.splitlines() if line.startswith("|")]


def test_compare_shows_quality_against_client_memory_and_traffic(tmp_path: Path) -> None:
    # Prepare: a round without replies records a peak of 0; one run records no client peak at all
    full = write_cost_run(
        tmp_path,
        "pft-full",
        "fedpft",
        cost_rows([0.0, 700.0, 650.0], [1_000_000, 3_000_000, 2_000_000], 0.4),
        fedpft={"submodel": "full", "rank": 4},
    )
    drop = write_cost_run(
        tmp_path,
        "pft-drop",
        "fedpft",
        cost_rows([300.0, 320.5], [500_000, 1_500_000], 0.3),
        fedpft={"submodel": "layerdrop", "rank": 4},
        fed={"mode": "standalone"},
    )
    seeds = write_cost_run(tmp_path, "kseed", "fedkseed", cost_rows([None, None], [1_028, 1_028], 0.2))

    # Execute
    report = write_report(full, compare=[drop, seeds])

    # Assert: peak = max of the non-zero peaks, traffic = mean per training round in MB, n/a where unrecorded
    table = cost_table(report)
    assert table[0] == (
        "| Run | Method | Variant | Task | final rougeL | Client peak memory (MiB) | Up per round (MB) "
        "| Down per round (MB) |"
    )
    assert table[2] == "| pft-full | fedpft | fedpft.submodel=full | dolly (rougeL) | 0.4 | 700 | 2 | 4 |"
    assert table[3] == (
        "| pft-drop | fedpft | fed.mode=standalone, fedpft.submodel=layerdrop | dolly (rougeL) "
        "| 0.3 | 320.5 | 1 | 2 |"
    )
    assert table[4] == "| kseed | fedkseed | | dolly (rougeL) | 0.2 | n/a | 0.001028 | 0.002056 |"
    text = report.read_text(encoding="utf-8")
    assert "Not plotted (no client peak memory or no final evaluation): kseed." in text
    assert "(plots/compare_quality_vs_memory.png)" in text
    assert_valid_png(full / "plots" / "compare_quality_vs_memory.png")


def test_compare_puts_runs_of_different_tasks_on_separate_panels_and_says_so(tmp_path: Path) -> None:
    # Prepare: same dataset with another metric set, and another dataset
    dolly = write_cost_run(tmp_path, "a", "fedit", cost_rows([500.0], [10], 0.3))
    alpaca = write_cost_run(tmp_path, "b", "fedit", cost_rows([400.0], [10], 0.2), dataset="alpaca")
    perplexity_rows = cost_rows([450.0], [10], 0.2)
    perplexity_rows[-1]["eval"] = {"perplexity": 12.0}
    perplexity_rows[0]["eval"] = {"perplexity": 20.0}
    other_metric = write_cost_run(tmp_path, "c", "fedit", perplexity_rows)

    # Execute
    report = write_report(dolly, compare=[alpaca, other_metric])

    # Assert
    text = report.read_text(encoding="utf-8")
    assert (
        "The runs differ in task, so each task has its own panels and none share an axis: "
        "a: dolly (rougeL); b: alpaca (rougeL); c: dolly (perplexity)."
    ) in text
    assert_valid_png(dolly / "plots" / "compare_quality_vs_memory.png")


def test_a_single_task_comparison_has_no_task_note(tmp_path: Path) -> None:
    first = write_cost_run(tmp_path, "a", "fedit", cost_rows([500.0], [10], 0.3))
    second = write_cost_run(tmp_path, "b", "fedkseed", cost_rows([400.0], [10], 0.2))

    text = write_report(first, compare=[second]).read_text(encoding="utf-8")

    assert "### Quality against client cost" in text and "(plots/compare_quality_vs_memory.png)" in text
    assert "differ in task" not in text and "Not plotted" not in text


def test_marker_area_grows_with_the_logarithm_of_the_upload() -> None:
    from fedtune.report.plots import MARKER_AREA, marker_areas

    smallest, largest = MARKER_AREA

    areas = marker_areas([0.001, 0.1, 10.0, None])

    assert areas == [smallest, (smallest + largest) / 2, largest, smallest]
    assert marker_areas([2.0, 2.0]) == [(smallest + largest) / 2] * 2


def test_many_runs_are_numbered_on_the_cost_plot_and_named_in_its_legend() -> None:
    # Names beside ten points overlap: above NAMED_BESIDE runs a point carries a number, the legend its name
    from fedtune.report.plots import NAMED_BESIDE, CostPoint, point_texts

    def point(i: int) -> CostPoint:
        return CostPoint(
            f"run{i}", "fedit", "dolly (rougeL)", {"rougeL": 0.1 * i}, 100.0 * i, 0.5 if i else None
        )

    few, no_legend = point_texts([point(i) for i in range(NAMED_BESIDE)])
    assert no_legend == [] and few[1] == "run1 (fedit)\n0.5 MB up/round" and few[0].endswith("n/a up/round")
    marks, legend = point_texts([point(i) for i in range(NAMED_BESIDE + 6)])
    assert marks == [str(i) for i in range(1, NAMED_BESIDE + 7)]
    assert legend[1] == "2: run1 (fedit), 0.5 MB up/round"
