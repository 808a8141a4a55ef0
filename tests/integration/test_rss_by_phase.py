"""scripts/rss_by_phase.py on a tiny run: a row for every phase, client task and perplexity pass."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.integration.helpers import ROOT


def test_every_phase_and_client_task_gets_a_row(tmp_path: Path) -> None:
    script = ["scripts/rss_by_phase.py", "configs/test/fedit-tiny.yaml", "fed.rounds=1"]
    done = subprocess.run(
        [sys.executable, *script, "-o", str(tmp_path / "run")],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}", "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    labels = [line.split(maxsplit=3)[-1] for line in done.stdout.splitlines()[1:-1]]
    assert labels[:3] == ["imports done", "loading data and models", "setting up"]
    assert [f"r1 c0{i} fit starts" for i in range(4)] == [
        label for label in labels if label.endswith("starts") and "fit" in label
    ]
    assert labels.count("perplexity starts") == 2 and labels[-1] == "done"
    assert done.stdout.splitlines()[-1].startswith("peak RSS of the process (getrusage): ")
