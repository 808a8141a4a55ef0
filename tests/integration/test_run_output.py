"""What a run prints when its console is not a terminal (a pipe, a log file, CI): plain lines, no bars."""

from __future__ import annotations

import io
import re
from pathlib import Path

from rich.console import Console

from fedtune.runner import Runner
from tests.integration.helpers import tiny_config


def _run_off_a_terminal(tmp_path: Path, *overrides: str) -> str:
    stream = io.StringIO()
    cfg = tiny_config("fedit", "fed.rounds=1", *overrides)
    Runner(cfg, tmp_path / "run", console=Console(file=stream, width=80)).run()
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
