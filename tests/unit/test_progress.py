"""The run's closing before/after table."""

from __future__ import annotations

from rich.console import Console

from fedtune.progress import summary_table


def _render(history: list[dict]) -> str:
    console = Console(width=120, record=True)
    console.print(summary_table(history, "run"))
    return " ".join(console.export_text().split())


def test_before_is_round_zero_and_a_run_without_it_shows_no_false_change() -> None:
    final = {"round": 3, "eval": {"rougeL": 0.1727}}
    text = _render([{"round": 1}, final])
    # eval.before=false: the final round is not also the "before" with a change of +0
    assert "+0.0000" not in text and "0.1727" in text
    assert "not evaluated before training" in text
    text = _render([{"round": 0, "eval": {"rougeL": 0.10}}, {"round": 2, "eval": {"rougeL": 0.05}}, final])
    assert "0.1000" in text and "+0.0727" in text and "0.0500" not in text
