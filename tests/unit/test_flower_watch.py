"""What ``fedtune run --backend flower`` says while the ServerApp is out of sight: the run's status,
the SuperNodes online and each finished round, one line per change."""

from __future__ import annotations

import json
from pathlib import Path

from fedtune.flower.watch import RunWatch


def _watch(tmp_path: Path, online: list[int], said: list[str]) -> RunWatch:
    return RunWatch(7, 4, 2, tmp_path / "metrics.jsonl", lambda: online[0], say=said.append)


def test_each_change_is_said_once(tmp_path: Path) -> None:
    # Prepare
    said: list[str] = []
    online = [0]
    watch = _watch(tmp_path, online, said)
    metrics = tmp_path / "metrics.jsonl"

    # Execute: the polls of a run from submission to its first round
    watch("pending")
    watch("pending")
    watch("running")
    online[0] = 2
    watch("running")
    online[0] = 4
    watch("running")
    metrics.write_text(json.dumps({"round": 0}) + "\n" + '{"round": 1, "train_lo')  # round 1 half-written
    watch("running")
    row = {"round": 1, "train_loss": 5.5, "eval": {"rougeL": 0.25}, "bytes_up": 20_000}
    metrics.write_text(json.dumps({"round": 0}) + "\n" + json.dumps(row) + "\n")
    watch("running")
    watch("running")

    # Assert
    assert said == [
        "Flower run 7: waiting for the SuperLink to start the ServerApp",
        "Flower run 7: the ServerApp is running (loading data and models, then waiting for the SuperNodes)",
        "0 of 4 SuperNodes online",
        "2 of 4 SuperNodes online",
        "4 of 4 SuperNodes online",
        "set up (round 0 written); round 1 started",
        "round 1/2: loss 5.5000, rougeL 0.25, up 0.02 MB",
    ]


def test_a_resumed_run_does_not_repeat_its_old_rounds(tmp_path: Path) -> None:
    said: list[str] = []
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"round": 0}) + "\n")
    watch = _watch(tmp_path, [4], said)
    watch("running")
    assert said[-1] == "4 of 4 SuperNodes online"


def test_a_superlink_that_cannot_count_its_nodes_is_no_error(tmp_path: Path) -> None:
    said: list[str] = []

    def refuse() -> int:
        raise RuntimeError("no account")

    RunWatch(7, 4, 2, tmp_path / "metrics.jsonl", refuse, say=said.append)("running")
    assert said == [
        "Flower run 7: the ServerApp is running (loading data and models, then waiting for the SuperNodes)"
    ]


def test_resuming_a_finished_run_says_it_is_complete(tmp_path: Path) -> None:
    said: list[str] = []
    rows = [{"round": 0}, {"round": 1}, {"round": 2}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    _watch(tmp_path, [4], said)
    assert said == ["the run is already complete (round 2 of 2): nothing to train"]
