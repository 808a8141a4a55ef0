"""`kill -9` at arbitrary moments, then `fedtune resume`: same metrics as an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.integration.helpers import ROOT, stable

CONFIG = ROOT / "configs" / "test" / "fedit-tiny.yaml"
OVERRIDES = ["fed.rounds=3", "progress=false"]


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "fedtune", *args]


def rows(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def env() -> dict[str, str]:
    return dict(os.environ, HF_HUB_OFFLINE="1")


def kill_when(run_dir: Path, predicate: Any, deadline: float = 120.0) -> None:
    proc = subprocess.Popen(
        command("run", str(CONFIG), "-o", str(run_dir), *OVERRIDES),
        cwd=ROOT,
        env=env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    start = time.monotonic()
    try:
        while not predicate(run_dir) and time.monotonic() - start < deadline:
            if proc.poll() is not None:
                break
            time.sleep(0.02)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


def checkpoint_count(n: int) -> Any:
    def ready(run_dir: Path) -> bool:
        root = run_dir / "checkpoints"
        return root.is_dir() and len(list(root.glob("*round_*"))) >= n

    return ready


def test_sigkill_then_resume_matches_uninterrupted(tmp_path: Path) -> None:
    full_dir = tmp_path / "full"
    done = subprocess.run(
        command("run", str(CONFIG), "-o", str(full_dir), *OVERRIDES),
        cwd=ROOT,
        env=env(),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    expected = stable(rows(full_dir))
    # Kill while the round-1 checkpoint is being written (a temp dir exists) and later, mid-round 2.
    for name, when in (("during_ckpt", checkpoint_count(2)), ("mid_round", checkpoint_count(3))):
        cut = tmp_path / name
        kill_when(cut, when)
        resumed = subprocess.run(
            command("resume", str(cut)), cwd=ROOT, env=env(), capture_output=True, text=True
        )
        assert resumed.returncode == 0, resumed.stderr[-2000:]
        assert stable(rows(cut)) == expected, name
