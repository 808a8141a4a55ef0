"""What a local Flower run is waiting for, said as it changes.

After ``flwr run`` the SuperLink starts the ServerApp, which loads data and models, waits for the
SuperNodes and only then runs round 1; its own output goes to Flower's logs, not to the terminal that
started the run. ``RunWatch`` fills that silence with one line per change: the run's status on the
SuperLink, how many of the SuperNodes are online, and each round the ServerApp finishes (read back from
the run directory's ``metrics.jsonl``, the file the ServerApp's ``Runner`` writes).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedtune.progress import round_summary

log = logging.getLogger("fedtune.flower")

STATUS_MEANING = {
    "pending": "waiting for the SuperLink to start the ServerApp",
    "starting": "the ServerApp is starting",
    "running": "the ServerApp is running (loading data and models, then waiting for the SuperNodes)",
}


@dataclass
class RunWatch:
    """Called with the run's status at every poll of ``wait_for_run``; ``say`` gets each new line."""

    run_id: int
    num_nodes: int
    rounds: int
    metrics: Path
    online_nodes: Callable[[], int]
    say: Callable[[str], None] = log.info
    status: str = ""
    online: int = -1
    rows: int = field(init=False)

    def __post_init__(self) -> None:
        # A resumed run's rows from before were said by the run that wrote them.
        rows = _complete_rows(self.metrics.read_text()) if self.metrics.is_file() else []
        self.rows = len(rows)
        last = int(rows[-1].get("round", 0)) if rows else 0
        if last >= self.rounds:
            self.say(f"the run is already complete (round {last} of {self.rounds}): nothing to train")

    def __call__(self, status: str) -> None:
        if status != self.status:
            self.status = status
            if status in STATUS_MEANING:
                self.say(f"Flower run {self.run_id}: {STATUS_MEANING[status]}")
        if status == "running":
            self._nodes()
            self._rounds()

    def _nodes(self) -> None:
        if self.online >= self.num_nodes:
            return
        try:
            online = self.online_nodes()
        except Exception:  # the count only informs; a SuperLink that will not say is no error
            return
        if online != self.online:
            self.online = online
            self.say(f"{online} of {self.num_nodes} SuperNodes online")

    def _rounds(self) -> None:
        if not self.metrics.is_file():
            return
        rows = _complete_rows(self.metrics.read_text())
        for row in rows[self.rows :]:
            if row.get("round") == 0:
                self.say("set up (round 0 written); round 1 started")
            else:
                self.say(f"round {row.get('round')}/{self.rounds}: {round_summary(row)}")
        self.rows = max(self.rows, len(rows))


def _complete_rows(text: str) -> list[dict[str, Any]]:
    """The rows of a metrics.jsonl another process may be writing: a last line without its newline is
    not complete yet."""
    lines = text.split("\n")[:-1]
    return [json.loads(line) for line in lines if line.strip()]
