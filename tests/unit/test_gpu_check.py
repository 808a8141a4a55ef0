"""scripts/gpu_check.sh: its dry run lists every step on any machine, GPU or not."""

from __future__ import annotations

import subprocess
from pathlib import Path

from fedtune.algorithms.registry import algorithm_names

ROOT = Path(__file__).resolve().parents[2]


def test_the_dry_run_lists_every_step_and_exits_0() -> None:
    # Execute
    done = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--dry-run"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    # Assert: one line a step, in order; every method run on CUDA; both benchmarks
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    names = [line.split(" ", 1)[0] for line in lines]
    assert names[:2] == ["device-info", "pytest-gpu"] and names[-2:] == ["bench-p9", "bench-p16"]
    assert {f"run-{m}" for m in algorithm_names()} <= set(names)
    assert "nvidia-smi --query-gpu=name,memory.total --format=csv" in lines[0]
    assert "-m gpu tests/gpu" in lines[1]
    runs = [line for line in lines if line.startswith("run-")]
    assert all("model.device=cuda fed.rounds=1" in line for line in runs)
    assert all("bench/results/gpu-check" in line for line in lines if "bench" in line.split(":", 1)[0])


def test_an_unknown_argument_is_refused() -> None:
    done = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--dry"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and "usage" in done.stderr
