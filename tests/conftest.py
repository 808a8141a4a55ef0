from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Subprocesses started by tests (the CLI) sleep instead of spin-waiting between parallel regions,
# which keeps them from starving each other on a small shared machine.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

ROOT = Path(__file__).resolve().parents[1]
TINY_CONFIG = ROOT / "configs" / "test" / "fedit-tiny.yaml"


def pytest_configure(config: pytest.Config) -> None:
    """Tiny models gain nothing from intra-op threads; one thread keeps them fast under load."""
    markers = str(config.getoption("markexpr") or "")
    if "slow" not in markers or "not slow" in markers:
        import torch

        torch.set_num_threads(1)
        os.environ.setdefault("OMP_NUM_THREADS", "1")  # the CLI subprocesses of the integration tests


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``gpu`` skip, with the reason, where torch sees no CUDA device (CI, laptops): they
    still import and collect everywhere, so a broken GPU test shows before a GPU is at hand."""
    if not any(item.get_closest_marker("gpu") for item in items):
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


@pytest.fixture
def tiny_config_path() -> Path:
    return TINY_CONFIG


_IN_PROCESS = threading.Lock()


@pytest.fixture
def fedtune_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """``python -m fedtune ...`` subprocesses (the experiment tables' runs) run in this process instead,
    one at a time, their output appended to the log file they were given.

    Each subprocess spent ~8 s of its ~11 s importing torch, transformers and peft before a tiny run;
    a table test starts up to a dozen. The command line, the exit code and the run directory are the
    same; ``tests/integration/test_perfit_table.py`` keeps the real subprocesses (and ``--jobs 2``).
    """
    real_run = subprocess.run

    def run(command: Any, *args: Any, **kwargs: Any) -> Any:
        argv = [str(part) for part in command] if isinstance(command, (list, tuple)) else None
        if argv is None or argv[:3] != [sys.executable, "-m", "fedtune"] or args:
            return real_run(command, *args, **kwargs)
        from fedtune.cli import app

        out = kwargs.get("stdout")
        sink = out if hasattr(out, "write") else io.StringIO()
        with _IN_PROCESS, contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            try:
                code = app(argv[3:], prog_name="fedtune", standalone_mode=False)
            except SystemExit as exc:  # as a subprocess: sys.exit("why") prints why and exits 1
                code = exc.code
                if code is not None and not isinstance(code, int):
                    print(code, file=sys.stderr)
                    code = 1
            except Exception:  # as a subprocess: a traceback in the log, exit code 1 (Ctrl-C still stops)
                traceback.print_exc()
                code = 1
        return subprocess.CompletedProcess(command, int(code or 0))

    monkeypatch.setattr(subprocess, "run", run)
