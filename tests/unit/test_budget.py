"""fed.budget_mb: the prediction of the next round's traffic, the stop decision, its message, the report's
line and the key's validation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from fedtune.config import ConfigError, load_config
from fedtune.fl.budget import budget_stop, next_round_mb, used_mb
from fedtune.report import write_report

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs" / "test" / "fedit-tiny.yaml"


def rows(*megabytes: tuple[float, float]) -> list[dict[str, Any]]:
    """Round 0 and one row per (up, down) pair in MB, as metrics.jsonl holds them (bytes)."""
    trained = [
        {"round": rnd, "bytes_up": int(up * 1e6), "bytes_down": int(down * 1e6)}
        for rnd, (up, down) in enumerate(megabytes, start=1)
    ]
    return [{"round": 0}, *trained]


def test_the_next_round_is_the_first_while_alone_then_the_largest_later_round() -> None:
    assert next_round_mb(rows()) is None
    assert next_round_mb(rows((1, 2))) == pytest.approx(3)
    # Round 1's one-off download (10 MB) does not count against later rounds.
    assert next_round_mb(rows((1, 10), (1, 1), (2, 1), (1, 1))) == pytest.approx(3)
    assert used_mb(rows((1, 10), (1, 1))) == pytest.approx(13)


def test_no_budget_or_no_round_yet_never_stops() -> None:
    assert budget_stop(rows((100, 100)), None) is None
    assert budget_stop(rows(), 1.0) is None


def test_the_stop_comes_before_the_round_predicted_to_pass_the_budget() -> None:
    # Prepare: 3 MB a round, a budget of 10 MB: rounds 1-3 fit (9 MB), round 4 would make 12.
    history = rows((1, 2), (1, 2))

    # Execute
    after_two = budget_stop(history, 10.0)
    after_three = budget_stop(rows((1, 2), (1, 2), (1, 2)), 10.0)

    # Assert
    assert after_two is None
    assert after_three is not None
    assert after_three.next_round == 4
    assert after_three.used == pytest.approx(9) and after_three.predicted == pytest.approx(3)
    message = after_three.message()
    assert "budget" in message and "fed.budget_mb is 10 MB" in message
    assert "9 MB used in rounds 1-3" in message and "about 3 MB more" in message
    assert "stopping before round 4" in message


def test_a_first_round_over_the_budget_stops_after_it_saying_so() -> None:
    stop = budget_stop(rows((4, 4)), 5.0)
    assert stop is not None and stop.next_round == 2
    assert "8 MB used in round 1; that alone passes the budget" in stop.message()


def test_exactly_the_budget_still_runs() -> None:
    assert budget_stop(rows((1, 1)), 4.0) is None
    assert budget_stop(rows((1, 1)), 3.999) is not None


@pytest.mark.parametrize("value", ["0", "-5", "abc", "inf", "nan"])
def test_a_budget_that_is_not_a_positive_number_names_the_key(value: str) -> None:
    with pytest.raises(ConfigError, match=r"fed\.budget_mb"):
        load_config(TINY, [f"fed.budget_mb={value}"])


def test_the_default_is_no_budget_and_a_number_is_taken() -> None:
    assert load_config(TINY).fed.budget_mb is None
    assert load_config(TINY, ["fed.budget_mb=200000"]).fed.budget_mb == 200000


def write_run(run_dir: Path, history: list[dict[str, Any]], **fed: Any) -> Path:
    run_dir.mkdir()
    config = {"name": "tiny", "fed": {"rounds": 5, **fed}}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in history))
    return run_dir


def test_the_report_shows_the_budget_used_and_where_it_stopped(tmp_path: Path) -> None:
    history = rows((4, 2.15), (4, 2.15))
    report = write_report(write_run(tmp_path / "run", history, budget_mb=15)).read_text()
    assert "Communication budget: 12.3 of 15 MB" in report
    assert "stopped before round 3 of 5, which would have needed about 6.15 MB more" in report


def test_the_report_of_a_run_without_a_budget_says_nothing_of_one(tmp_path: Path) -> None:
    report = write_report(write_run(tmp_path / "run", rows((4, 2)))).read_text()
    assert "Communication budget" not in report
