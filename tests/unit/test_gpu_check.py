"""scripts/gpu_check.sh and the gpu marker on a machine without a GPU: the dry run lists every step,
the real run refuses and says why, and the gpu tests collect and skip with their reason."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fedtune.plugins import BUILTIN

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
    # (the built-in methods: other tests register methods of their own in the same process)
    assert {f"run-{m}" for m in BUILTIN} <= set(names)
    assert "nvidia-smi --query-gpu=name,memory.total --format=csv" in lines[0]
    assert "-m gpu tests/gpu" in lines[1]
    runs = [line for line in lines if line.startswith("run-")]
    assert all("model.device=cuda fed.rounds=1" in line for line in runs)
    assert all("bench/results/gpu-check" in line for line in lines if "bench" in line.split(":", 1)[0])


def dry_run_with(**env: str) -> subprocess.CompletedProcess[str]:
    """The dry run with these environment variables set."""
    return subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--dry-run"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )


def test_the_interpreter_can_be_named() -> None:
    # A GPU machine whose own python3 holds a CUDA torch needs no .venv
    done = dry_run_with(PY="python3")
    assert done.returncode == 0, done.stderr
    steps = done.stdout.splitlines()[1:]
    assert steps and all(line.split(": ", 1)[1].startswith("python3 -m ") for line in steps)


@pytest.mark.parametrize("budget", ["0", "ten", "-5"])
def test_a_budget_that_is_not_whole_seconds_is_refused(budget: str) -> None:
    done = dry_run_with(GPU_CHECK_BUDGET_S=budget)
    assert done.returncode == 2 and "GPU_CHECK_BUDGET_S" in done.stderr and budget in done.stderr


def test_an_unknown_argument_is_refused() -> None:
    done = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--dry"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and "usage" in done.stderr


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="a GPU machine would run the whole check")
def test_without_a_gpu_it_refuses_and_says_why(tmp_path: Path) -> None:
    done = subprocess.run(
        ["bash", "scripts/gpu_check.sh"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    assert "no NVIDIA GPU here" in done.stderr and "--dry-run" in done.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA the gpu tests run instead of skipping")
def test_the_gpu_tests_collect_and_skip_with_the_reason() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-rs", "-m", "gpu", "tests/gpu"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stdout[-2000:]
    assert "needs a CUDA device" in done.stdout and " passed" not in done.stdout
    assert "skipped" in done.stdout.splitlines()[-1]
