"""The Flower backend as users start it: TLS with node authentication, and `fedtune resume`
after the server process was killed. Each test starts (and stops) its own loopback deployment.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from fedtune.flower.keys import make_node_key
from fedtune.flower.local import LocalDeployment
from tests.integration.flower_support import assert_close, flower_run, rows
from tests.integration.helpers import ROOT, quiet_runner, stable, tiny_config

CONFIG = ROOT / "configs" / "test" / "fedit-tiny.yaml"
TWO_CLIENTS = ("data.partition.num_clients=2",)


def flower_processes(root: Path) -> list[psutil.Process]:
    """Processes started for a deployment under ``root`` (their FLWR_HOME lies under it)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if str(root) in proc.environ().get("FLWR_HOME", ""):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


@pytest.fixture
def sweep(tmp_path: Path) -> Iterator[Path]:
    """Whatever a test leaves running under ``tmp_path`` is killed, even if the test fails."""
    yield tmp_path
    for proc in flower_processes(tmp_path):
        proc.kill()


def test_tls_and_node_authentication(sweep: Path) -> None:
    with LocalDeployment(root=sweep / "deployment", num_nodes=1, tls=True, auth=True) as deployment:
        # A SuperNode whose key was never registered tries to serve client c01.
        rogue_key = sweep / "rogue" / "node1"
        make_node_key(rogue_key)
        rogue = deployment.start_node(1, private_key=rogue_key)
        cfg = tiny_config("fedit", *TWO_CLIENTS, "fed.rounds=1", "flower.connect_timeout=20")
        history = flower_run(deployment, cfg, sweep / "run")
        assert rogue.wait(timeout=120) != 0
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://{deployment.address}/health", timeout=5)
    superlink_log = (sweep / "deployment" / "logs" / "superlink.log").read_text()
    assert "No SuperNode found with the given public key" in superlink_log
    assert "not connected" in history[1]["failed"]["c01"]
    assert history[1]["train_loss"] is not None and history[1]["num_examples"] == 25


def fedtune(*args: str) -> list[str]:
    return [sys.executable, "-m", "fedtune", *args]


def test_server_killed_then_resume(sweep: Path) -> None:
    run_dir = sweep / "run"
    overrides = [*TWO_CLIENTS, "fed.rounds=3"]
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    with open(sweep / "run.log", "wb") as log:
        launcher = subprocess.Popen(
            fedtune("run", str(CONFIG), "-o", str(run_dir), "--backend", "flower", *overrides),
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 600
        metrics = run_dir / "metrics.jsonl"
        while time.monotonic() < deadline and launcher.poll() is None:
            if metrics.is_file() and len(metrics.read_text().splitlines()) >= 2:
                break
            time.sleep(0.2)
        assert launcher.poll() is None, (sweep / "run.log").read_text()[-3000:]
    finally:
        # The whole server side dies at once: launcher, SuperLink, ServerApp (and the loopback nodes).
        os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait()
    _, alive = psutil.wait_procs(flower_processes(run_dir), timeout=30)
    assert not alive, f"processes outlived the killed launcher: {[p.cmdline() for p in alive]}"
    assert [row["round"] for row in rows(run_dir)][:2] == [0, 1]
    resumed = subprocess.run(
        fedtune("resume", str(run_dir)), cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    assert not flower_processes(run_dir)
    expected = quiet_runner(tiny_config("fedit", *overrides), sweep / "simulation").run()
    assert_close(stable(rows(run_dir)), stable(expected))
