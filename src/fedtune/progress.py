"""The live progress display of a run: round, client, step, loss and ETA."""

from __future__ import annotations

from types import TracebackType

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

from fedtune.fl.federation import StepReporter, no_report


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
