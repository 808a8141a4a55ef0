"""scripts/setup.sh says what it does, one line per step, with pip itself kept quiet. The script runs in a
copy of the repository whose python3 and .venv are stubs that only record their arguments."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Stands in for both python3 (``-m venv .venv`` makes the .venv/bin/python stub) and .venv's python (pip).
STUB_PYTHON = """#!/usr/bin/env bash
echo "$0 $*" >> "$STUB_LOG"
if [ "$1 $2" = "-m venv" ]; then
  mkdir -p "$3/bin" && cp "$0" "$3/bin/python"
fi
"""


def _setup_copy(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "setup.sh", repo / "scripts" / "setup.sh")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / "python3"
    stub.write_text(STUB_PYTHON)
    stub.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "STUB_LOG": str(tmp_path / "calls.log")}
    return repo, env


def test_setup_prints_one_line_per_step_and_keeps_pip_quiet(tmp_path: Path) -> None:
    repo, env = _setup_copy(tmp_path)
    done = subprocess.run(
        ["bash", "scripts/setup.sh"], cwd=repo, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:3] == [
        "setup: creating .venv",
        "setup: installing torch 2.13.0 (CPU wheel)",
        "setup: installing fedtune with the dev extras (pip install -e '.[dev]')",
    ]
    assert len(lines) == 4 and lines[3].startswith("setup: done in ") and lines[3].endswith(" s")
    pip_calls = [line for line in (tmp_path / "calls.log").read_text().splitlines() if " pip install" in line]
    assert len(pip_calls) == 2 and all(" -q " in call for call in pip_calls)


def test_setup_on_an_existing_venv_says_it_reuses_it(tmp_path: Path) -> None:
    repo, env = _setup_copy(tmp_path)
    (repo / ".venv" / "bin").mkdir(parents=True)
    shutil.copy(tmp_path / "bin" / "python3", repo / ".venv" / "bin" / "python")
    done = subprocess.run(
        ["bash", "scripts/setup.sh"], cwd=repo, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "setup: using the existing .venv"
    assert "-m venv" not in (tmp_path / "calls.log").read_text()
