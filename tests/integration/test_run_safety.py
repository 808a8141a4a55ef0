"""A run directory is never silently damaged: bad checkpoints, two processes, Ctrl-C, failed rounds."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

import fedtune.runner
from fedtune.algorithms.base import RoundFailed
from fedtune.fl.checkpoint import CheckpointDamaged, save_checkpoint
from fedtune.rundir import RunDirBusy, run_dir_lock
from tests.integration.helpers import ROOT, quiet_runner, stable, tiny_config
from tests.integration.test_cli_kill_resume import CONFIG, command, env
from tests.unit.test_checkpoint import DAMAGES


@pytest.mark.parametrize("damage", ["flipped bytes", "missing state.json"])
def test_resume_falls_back_from_a_damaged_checkpoint(damage: str, tmp_path: Path) -> None:
    cfg = tiny_config("fedit", "fed.rounds=3")
    full = quiet_runner(cfg, tmp_path / "full").run()
    quiet_runner(tiny_config("fedit", "fed.rounds=2"), tmp_path / "cut").run()
    DAMAGES[damage](tmp_path / "cut" / "checkpoints" / "round_0002")

    resumed = quiet_runner(cfg, tmp_path / "cut").run(resume=True)

    # Round 2 is trained again from round 1's checkpoint: the same numbers as never interrupted.
    assert stable(resumed) == stable(full)


def test_resume_with_no_intact_checkpoint_fails_and_writes_nothing(tmp_path: Path) -> None:
    quiet_runner(tiny_config("fedit", "fed.rounds=1"), tmp_path / "run").run()
    for checkpoint in (tmp_path / "run" / "checkpoints").glob("round_*"):
        DAMAGES["flipped bytes"](checkpoint)
    metrics = (tmp_path / "run" / "metrics.jsonl").read_text()

    with pytest.raises(CheckpointDamaged, match="no intact checkpoint"):
        quiet_runner(tiny_config("fedit", "fed.rounds=2"), tmp_path / "run").run(resume=True)
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == metrics


def test_a_second_process_on_the_same_run_directory_fails_at_once(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with run_dir_lock(run_dir), pytest.raises(RunDirBusy, match=r"in use by process \d+"):
        quiet_runner(tiny_config("fedit"), run_dir).run()
    assert not (run_dir / "metrics.jsonl").exists()
    quiet_runner(tiny_config("fedit", "fed.rounds=1"), run_dir).run()  # released: it runs now


def test_a_round_where_every_reply_is_rejected_says_why_and_what_to_change(tmp_path: Path) -> None:
    cfg = tiny_config("fedit", "fed.norm_bound=1e-9")
    with pytest.raises(RoundFailed) as failure:
        quiet_runner(cfg, tmp_path / "run").run()
    message = str(failure.value)
    assert "0 of 4 sampled clients replied" in message
    assert "c00: rejected: update norm" in message and "fed.norm_bound" in message


def test_cli_reports_a_failed_round_without_a_traceback(tmp_path: Path) -> None:
    done = subprocess.run(
        command("run", str(CONFIG), "-o", str(tmp_path / "run"), "progress=false", "fed.norm_bound=1e-9"),
        cwd=ROOT,
        env=env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and "fed.norm_bound" in done.stderr


@pytest.mark.parametrize("after_round", [0, 1])
def test_ctrl_c_just_after_a_checkpoint_still_writes_its_metrics_row(
    after_round: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def checkpoint_then_ctrl_c(run_dir: Path, rnd: int, tree: dict, **kwargs: object) -> None:
        save_checkpoint(run_dir, rnd, tree, **kwargs)  # type: ignore[arg-type]
        if rnd == after_round:
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(fedtune.runner, "save_checkpoint", checkpoint_then_ctrl_c)
    # Started as a background job, the tests inherit SIGINT ignored (and a run then rightly ignores it too):
    # give this process the handler an interactive Ctrl-C meets.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    run_dir = tmp_path / "run"
    try:
        with pytest.raises(KeyboardInterrupt):
            quiet_runner(tiny_config("fedit", "fed.rounds=3"), run_dir).run()
    finally:
        signal.signal(signal.SIGINT, previous)

    # The round whose checkpoint landed has its row in metrics.jsonl, and no later round ran.
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["round"] for row in rows] == list(range(after_round + 1))


def test_ctrl_c_exits_with_how_to_resume(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        command("run", str(CONFIG), "-o", str(run_dir), "progress=false", "fed.rounds=50"),
        cwd=ROOT,
        env=env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        # A shell starts background jobs with SIGINT ignored and children inherit that: give the run
        # the disposition an interactive Ctrl-C meets, whoever started the tests.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 180
    # Any round's checkpoint: round 1's is pruned two rounds later (fed.keep_checkpoints), which a
    # starved poller on a loaded machine could miss until the whole run had ended.
    while not any((run_dir / "checkpoints").glob("round_*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)

    assert proc.returncode == 130
    assert "Traceback" not in stderr
    assert f"continue with: fedtune resume {run_dir}" in stderr.replace("\n", "")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["round"] for row in rows] == list(range(len(rows)))
