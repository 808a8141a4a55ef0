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
OVERRIDES = ["fed.rounds=4", "progress=false"]


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "fedtune", *args]


def rows(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def env() -> dict[str, str]:
    return dict(os.environ, HF_HUB_OFFLINE="1")


def kill_when(run_dir: Path, predicate: Any, deadline: float = 120.0) -> int:
    """Start a run, SIGKILL it as soon as ``predicate(run_dir)`` holds; return its exit code."""
    proc = subprocess.Popen(
        command("run", str(CONFIG), "-o", str(run_dir), *OVERRIDES),
        cwd=ROOT,
        env=env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    start = time.monotonic()
    try:
        while proc.poll() is None and not predicate(run_dir) and time.monotonic() - start < deadline:
            time.sleep(0.01)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait()
    return proc.returncode


def rounds_logged(n: int, delay: float = 0.0) -> Any:
    """True ``delay`` seconds after metrics.jsonl first holds ``n`` rows."""
    seen: list[float] = []

    def ready(run_dir: Path) -> bool:
        path = run_dir / "metrics.jsonl"
        if not seen and path.is_file() and len(path.read_text().splitlines()) >= n:
            seen.append(time.monotonic())
        return bool(seen) and time.monotonic() - seen[0] >= delay

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
    # Right after round 1 was logged (round 2 starting), and at two later moments inside round 2/3.
    for name, when in (
        ("after_round_1", rounds_logged(2)),
        ("inside_round_2", rounds_logged(2, delay=0.4)),
        ("inside_round_3", rounds_logged(3, delay=0.15)),
    ):
        cut = tmp_path / name
        assert kill_when(cut, when) == -signal.SIGKILL, f"{name}: the run ended before it could be killed"
        resumed = subprocess.run(
            command("resume", str(cut)), cwd=ROOT, env=env(), capture_output=True, text=True
        )
        assert resumed.returncode == 0, resumed.stderr[-2000:]
        assert stable(rows(cut)) == expected, name
