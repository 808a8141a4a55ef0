"""What a run prints when its console is not a terminal (a pipe, a log file, CI): plain lines, no bars."""

from __future__ import annotations

import io
import re
from pathlib import Path

from rich.console import Console

from fedtune.config import load_run_config
from fedtune.runner import Runner
from tests.integration.helpers import tiny_config


def _run_off_a_terminal(tmp_path: Path, *overrides: str, resume: bool = False) -> str:
    stream = io.StringIO()
    run_dir = tmp_path / "run"
    cfg = load_run_config(run_dir) if resume else tiny_config("fedit", "fed.rounds=1", *overrides)
    Runner(cfg, run_dir, console=Console(file=stream, width=80)).run(resume=resume)
    return stream.getvalue()


def test_every_client_task_is_a_line_and_no_bar_fragment_is_left(tmp_path: Path) -> None:
    text = _run_off_a_terminal(tmp_path, "progress=true")
    fits = [line for line in text.splitlines() if line.startswith("round 1/1 · client")]
    assert len(fits) == 4, text
    for index, line in enumerate(fits, 1):
        pattern = rf"round 1/1 · client {index}/4 \(c0{index - 1}\) · fit 3 steps, loss [\d.]+ · \d+ s"
        assert re.fullmatch(pattern, line), line
    # the bars' last frame, which rich prints when they stop off a terminal ("rounds ━ 1… eta 0:…")
    assert " eta " not in text and not any(line.startswith("rounds") for line in text.splitlines())


def test_resuming_a_finished_run_says_it_was_already_complete(tmp_path: Path) -> None:
    first = _run_off_a_terminal(tmp_path)
    assert "already complete" not in first
    again = _run_off_a_terminal(tmp_path, resume=True)
    assert f"{tmp_path / 'run'} is already complete (round 1 of 1): nothing to train" in again
    assert "before vs after" in again
