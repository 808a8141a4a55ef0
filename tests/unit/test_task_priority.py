"""The process that trains on a Flower node runs below its SuperNode's priority, so a client training on
every core cannot starve the node's heartbeat (the SuperLink drops a node whose heartbeat is late)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

from fedtune.flower.worker import TASK_NICENESS


def test_the_client_worker_runs_below_its_supernode(tmp_path: Path) -> None:
    # Prepare: a worker started as the local deployment starts it, from a parent at our own niceness
    address = str(tmp_path / "worker.sock")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    worker = subprocess.Popen(
        [sys.executable, "-c", f"from fedtune.flower.worker import main; main(['--socket', {address!r}])"],
        env=env,
    )
    try:
        # Execute: wait for it to lower itself (it does so before its imports)
        deadline = time.monotonic() + 60
        while psutil.Process(worker.pid).nice() == os.nice(0) and time.monotonic() < deadline:
            time.sleep(0.05)

        # Assert
        assert psutil.Process(worker.pid).nice() == min(19, os.nice(0) + TASK_NICENESS)
    finally:
        worker.kill()
        worker.wait()
