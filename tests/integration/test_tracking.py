"""Trackers on a real run, stopped in round 2 and resumed: TensorBoard's event files hold every metric
of metrics.jsonl once per round, and W&B (offline) and MLflow (the local store) continue the same
tracked run. The slow variant kills the process with SIGKILL instead."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fedtune.config import load_config
from fedtune.tracking import STATE_FILE, flatten_row
from tests.integration.helpers import ROOT, quiet_runner

CONFIG = ROOT / "configs" / "test" / "fedit-tiny.yaml"
OVERRIDES = ["fed.rounds=3", "progress=false", "report_to=[tensorboard,wandb,mlflow]"]


def tracker_env(tmp_path: Path) -> dict[str, str]:
    """Offline, quiet trackers whose caches live in ``tmp_path``; never the network."""
    return {
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_DISABLE_GIT": "true",
        "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"),
        "WANDB_CACHE_DIR": str(tmp_path / "wandb-cache"),
        "WANDB_DATA_DIR": str(tmp_path / "wandb-data"),
    }


def without_trackers_env() -> dict[str, str]:
    """This process's environment less any W&B or MLflow setting (a key, a server to log to)."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "MLFLOW_"))}


def rows(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def run_killed_after_round_1(run_dir: Path, env: dict[str, str]) -> None:
    command = [sys.executable, "-m", "fedtune", "run", str(CONFIG), "-o", str(run_dir), *OVERRIDES]
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics = run_dir / "metrics.jsonl"
    start = time.monotonic()
    try:
        while proc.poll() is None and time.monotonic() - start < 120:
            if metrics.is_file() and len(metrics.read_text().splitlines()) >= 2:
                break
            time.sleep(0.01)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run ended before it could be killed"


def wandb_records(path: Path) -> Iterator[bytes]:
    """The records of a W&B ``.wandb`` file: a 7-byte header, then a LevelDB-style log of 32 KiB blocks
    whose records (7-byte header: crc, length, type) may span blocks (first/middle/last)."""
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, pending = 7, 32768, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last piece of one
            yield pending
            pending = b""


def wandb_segments(run_dir: Path) -> list[tuple[str, list[dict[str, Any]]]]:
    """Each offline W&B run segment, oldest first: its run id and its history rows."""
    from wandb.proto import wandb_internal_pb2 as pb

    found = []
    for path in sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb")):
        run_id, history = "", []
        for data in wandb_records(path):
            record = pb.Record()
            record.ParseFromString(data)
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run_id = record.run.run_id
            elif kind == "history":
                history.append(
                    {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in record.history.item}
                )
        found.append((run_id, history))
    return found


class Interrupt(BaseException):
    """Stops the run the way a Ctrl-C does (not a client failure)."""

    pass


def test_trackers_hold_every_metric_and_resume_into_the_same_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Execute: stopped by an error in round 2 (what a Ctrl-C does), then resumed
    for key in set(os.environ) - set(without_trackers_env()):
        monkeypatch.delenv(key)
    for key, value in tracker_env(tmp_path).items():
        monkeypatch.setenv(key, value)
    cfg = load_config(CONFIG, [*OVERRIDES, "eval.personal=true"])
    run_dir = tmp_path / "run"

    def die_in_round_2(client: str, task: str, rnd: int) -> None:
        if rnd == 2:
            raise Interrupt

    with pytest.raises(Interrupt):
        quiet_runner(cfg, run_dir, before_task=die_in_round_2).run()
    before = json.loads((run_dir / STATE_FILE).read_text())
    quiet_runner(cfg, run_dir).run(resume=True)

    # Assert
    assert before["logged_round"] == 1
    check_tracked_run(run_dir, before, killed=False)
    assert any(key.startswith("client/") for key in flatten_row(rows(run_dir)[-1]))


@pytest.mark.slow
def test_trackers_continue_after_sigkill(tmp_path: Path) -> None:
    # Execute: killed right after round 1 was written, then resumed
    run_dir, env = (
        tmp_path / "run",
        {**without_trackers_env(), "HF_HUB_OFFLINE": "1", **tracker_env(tmp_path)},
    )
    run_killed_after_round_1(run_dir, env)
    before = json.loads((run_dir / STATE_FILE).read_text())
    resumed = subprocess.run(
        [sys.executable, "-m", "fedtune", "resume", str(run_dir)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )

    # Assert
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    check_tracked_run(run_dir, before, killed=True)


def check_tracked_run(run_dir: Path, before: dict[str, Any], killed: bool) -> None:
    """Every metric of metrics.jsonl in each tracker at its round, once; the same tracked runs as
    before the interruption (``before``: trackers.json then)."""
    after = json.loads((run_dir / STATE_FILE).read_text())
    metrics = {int(row["round"]): flatten_row(row) for row in rows(run_dir)}
    assert sorted(metrics) == [0, 1, 2, 3] and after["logged_round"] == 3
    assert after["wandb"]["run_id"] == before["wandb"]["run_id"]
    assert after["mlflow"]["run_id"] == before["mlflow"]["run_id"]
    assert {"train_loss", "bytes_up", "eval/perplexity"} <= set(metrics[3])

    # TensorBoard, read with its own reader: every metric at its round, once
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = EventAccumulator(str(run_dir / "tensorboard"))
    board.Reload()
    assert set(board.Tags()["scalars"]) == {key for scalars in metrics.values() for key in scalars}
    for rnd, scalars in metrics.items():
        for key, value in scalars.items():
            events = [e for e in board.Scalars(key) if e.step == rnd]
            assert len(events) == 1 and events[0].value == pytest.approx(value, rel=1e-6), (key, rnd)
    assert "config/text_summary" in board.Tags()["tensors"]

    # W&B offline: the stopped process's segment and the resumed one, one run id, no round twice. W&B
    # writes its file every 0.5 s: a killed segment may lack the rounds of its last half second.
    segments = wandb_segments(run_dir)
    assert len(segments) == 2 and {run_id for run_id, _ in segments} == {after["wandb"]["run_id"]}
    first, second = ([row["round"] for row in history] for _, history in segments)
    assert second == list(range(before["logged_round"] + 1, 4))
    assert first == list(range(len(first) if killed else before["logged_round"] + 1))
    for row in (row for _, history in segments for row in history):
        assert {k: v for k, v in row.items() if not k.startswith("_") and k != "round"} == pytest.approx(
            metrics[row["round"]]
        )

    # MLflow's local store: one run, finished, each round once, the final adapter among its artifacts
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{(run_dir / 'mlflow' / 'mlflow.db').resolve()}")
    run = client.get_run(after["mlflow"]["run_id"])
    assert run.info.status == "FINISHED" and run.data.params["fed.rounds"] == "3"
    for key in ("train_loss", "eval/perplexity"):
        history = client.get_metric_history(run.info.run_id, key)
        expected = {rnd: scalars[key] for rnd, scalars in metrics.items() if key in scalars}
        # A kill between MLflow's write and trackers.json's may log that round twice (same value).
        assert {m.step: m.value for m in history} == pytest.approx(expected)
        assert killed or len(history) == len(expected)
    assert "artifacts/adapter" in [a.path for a in client.list_artifacts(run.info.run_id, "artifacts")]
