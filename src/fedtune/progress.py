"""What a run shows on the console: the live progress (round, client, step, loss, ETA), each round's
summary line and the before/after table at the end."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
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
    """What a run shows while it runs. On a terminal: two bars, rounds (with ETA for the run) and the
    current client's local steps. Elsewhere (a log file, a pipe, CI) bars cannot redraw, so each phase and
    each finished client task is one plain line instead, e.g.
    ``round 1/4 · client 2/4 (c01) · train 10 steps, loss 2.3456 · 41 s``.
    ``enabled=False`` (``progress: false``) shows neither, only each round's summary line."""

    def __init__(self, console: Console, rounds: int, start_round: int = 0, enabled: bool = True) -> None:
        self.console = console
        self.rounds = rounds
        self.live = enabled and console.is_terminal
        self.plain = enabled and not console.is_terminal
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
            # Off a terminal rich prints the bars' last frame when they stop: a fragment in the log.
            disable=not self.live,
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

    def _line(self, text: str) -> None:
        self.console.print(text, soft_wrap=True, markup=False, highlight=False)

    def phase(self, text: str) -> None:
        if self.plain:
            self._line(text)
        self.progress.update(self.step_task, description=text, info="", completed=0, total=None, visible=True)

    @contextmanager
    def task(self, rnd: int, client: str, task: str, index: int, count: int) -> Iterator[StepReporter]:
        """The progress of one client task (a ``TaskReporter`` once the round is bound)."""
        if self.live:
            self.progress.reset(
                self.step_task, total=1, visible=True, description=f"r{rnd} {client}", info=""
            )
        steps = TaskSteps()
        start = time.perf_counter()

        def report(step: int, total: int, loss: float | None) -> None:
            steps.step, steps.loss = step, loss
            info = f"loss {loss:.4f}" if loss is not None else ""
            self.progress.update(self.step_task, completed=step, total=total, info=info)

        yield report if self.enabled else no_report
        if self.plain:
            seconds = time.perf_counter() - start
            where = f"round {rnd}/{self.rounds} · client {index}/{count} ({client})"
            self._line(f"{where} · {steps.describe(task)} · {seconds:.0f} s")

    @contextmanager
    def generating(self) -> Iterator[None]:
        """On a terminal, the step bar counts the prompts an evaluation has generated for (the phase's
        text stays); elsewhere nothing more is printed than the phase's line."""
        if not self.live:
            yield
            return
        from fedtune.decode.generate import watching  # torch: not for what only reads a run's files

        def report(done: int, total: int) -> None:
            self.progress.update(self.step_task, completed=done, total=total, info="generated")

        with watching(report):
            yield

    @property
    def enabled(self) -> bool:
        return self.live or self.plain

    def end_round(self, rnd: int, summary: str) -> None:
        self.progress.update(self.rounds_task, completed=rnd, info=summary)
        if self.console.is_terminal:
            self.console.log(f"round {rnd}: {summary}")
        else:
            self._line(f"round {rnd}/{self.rounds}: {summary}")


@contextmanager
def generation_progress(console: Console) -> Iterator[None]:
    """What ``fedtune eval`` shows while the final model generates (7-14 min for HumanEval's 164 problems
    on one thread): on a terminal a bar of prompts done with its ETA; elsewhere (a log file) one line per
    batch, e.g. ``generated 32/164 prompts · 95 s``. A decoder that generates more than once (one pass per
    sampling seed or per variant) starts the count again."""
    from fedtune.decode.generate import watching

    started = time.perf_counter()
    bar = Progress(
        TextColumn("generating"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    )
    task = bar.add_task("generating", total=None)

    def report(done: int, total: int) -> None:
        if console.is_terminal:
            bar.update(task, completed=done, total=total)
        else:
            seconds = time.perf_counter() - started
            console.print(
                f"generated {done}/{total} prompts · {seconds:.0f} s", markup=False, highlight=False
            )

    with bar, watching(report):
        yield


@dataclass
class TaskSteps:
    """The last step a client task reported, for its plain progress line."""

    step: int = 0
    loss: float | None = None

    def describe(self, task: str) -> str:
        if not self.step:
            return task
        loss = f", loss {self.loss:.4f}" if self.loss is not None else ""
        return f"{task} {self.step} steps{loss}"


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
