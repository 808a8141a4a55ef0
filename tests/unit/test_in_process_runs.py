"""The ``fedtune_in_process`` fixture (tests/conftest.py) that the table tests run their runs under: a
failing run must fail the table as the subprocess did, with its error in the run's log."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from experiments.tables import runs

pytestmark = pytest.mark.usefixtures("fedtune_in_process")


def test_a_failing_run_raises_naming_its_log(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    missing = tmp_path / "missing.yaml"
    command = [sys.executable, "-m", "fedtune", "run", str(missing), "-o", str(tmp_path / "r")]
    with pytest.raises(RuntimeError, match="fedtune exited with 2"):
        runs.logged(command, log, tmp_path / "r")
    assert "missing.yaml" in log.read_text()


def test_other_commands_still_run_as_subprocesses(tmp_path: Path) -> None:
    log = tmp_path / "echo.log"
    runs.logged([sys.executable, "-c", "print('from a subprocess')"], log, tmp_path)
    assert log.read_text() == "from a subprocess\n"


def test_an_exit_with_a_message_is_code_1_with_the_message_in_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``sys.exit("why")`` in a subprocess prints "why" to stderr and exits 1: the same in process."""
    import fedtune.cli

    def app(*args: object, **kwargs: object) -> None:
        sys.exit("the config names no model")

    monkeypatch.setattr(fedtune.cli, "app", app)
    log = tmp_path / "run.log"
    command = [sys.executable, "-m", "fedtune", "run", "x.yaml", "-o", str(tmp_path / "r")]
    with pytest.raises(RuntimeError, match="fedtune exited with 1"):
        runs.logged(command, log, tmp_path / "r")
    assert "the config names no model" in log.read_text()
