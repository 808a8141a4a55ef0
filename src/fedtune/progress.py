"""What a run shows on the console: the live progress (round, client, step, loss, ETA), each round's
summary line and the before/after table at the end."""

from __future__ import annotations

import json
from pathlib import Path
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from fedtune.fl.federation import StepReporter, no_report
from fedtune.units import megabytes


class RunProgress:
    """Two bars: rounds (with ETA for the run) and the current client's local steps."""

    def __init__(self, console: Console, rounds: int, start_round: int = 0, enabled: bool = True) -> None:
        self.console = console
        self.enabled = enabled
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=console,
            transient=False,
            disable=not enabled,
        )
        self.rounds_task: TaskID = self.progress.add_task(
            "rounds", total=rounds, completed=start_round, info=""
        )
        self.step_task: TaskID = self.progress.add_task("client", total=1, info="", visible=False)

    def __enter__(self) -> RunProgress:
        self.progress.__enter__()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.progress.__exit__(kind, exc, tb)

    def phase(self, text: str) -> None:
        self.progress.update(self.step_task, description=text, info="", completed=0, total=None, visible=True)

    def client(self, rnd: int, client: str) -> StepReporter:
        if not self.enabled:
            return no_report
        self.progress.reset(self.step_task, total=1, visible=True, description=f"r{rnd} {client}", info="")

        def report(step: int, total: int, loss: float | None) -> None:
            info = f"loss {loss:.4f}" if loss is not None else ""
            self.progress.update(self.step_task, completed=step, total=total, info=info)

        return report

    def end_round(self, rnd: int, summary: str) -> None:
        self.progress.update(self.rounds_task, completed=rnd, info=summary)
        self.console.log(f"round {rnd}: {summary}")


def round_summary(row: dict[str, Any]) -> str:
    parts = [f"loss {row['train_loss']:.4f}" if row.get("train_loss") is not None else "loss -"]
    parts += [f"{k} {v:.4g}" for k, v in row.get("eval", {}).items()]
    parts.append(f"up {megabytes(row['bytes_up'])}")
    if "dp_epsilon" in row:
        parts.append(f"epsilon {row['dp_epsilon']:.3g}")
    failed = len(row.get("failed", {})) + len(row.get("rejected", {}))
    if failed:
        parts.append(f"{failed} client(s) dropped")
    return ", ".join(parts)


def summary_table(history: list[dict[str, Any]], title: str) -> Table:
    """Before (round 0) vs after (last evaluated round) for every eval metric; without a round-0
    evaluation (``eval.before: false``) the before column is empty rather than the final round again."""
    evaluated = [row for row in history if row.get("eval")]
    first = evaluated[0] if evaluated and evaluated[0].get("round") == 0 else None
    note = "" if first is not None or not evaluated else " (not evaluated before training)"
    table = Table(title=f"{title}: before vs after{note}")
    table.add_column("metric")
    table.add_column("before", justify="right")
    table.add_column("after", justify="right")
    table.add_column("change", justify="right")
    if not evaluated:
        return table
    last = evaluated[-1]
    for metric, after in last["eval"].items():
        before = first["eval"].get(metric) if first is not None else None
        change = f"{after - before:+.4f}" if before is not None else "-"
        table.add_row(metric, "-" if before is None else f"{before:.4f}", f"{after:.4f}", change)
    return table


def print_run_summary(run_dir: Path, title: str, console: Console) -> None:
    """The before/after table of a finished run, read back from its metrics.jsonl."""
    path = run_dir / "metrics.jsonl"
    history = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
    console.print(summary_table(history, title))
