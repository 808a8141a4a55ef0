"""The run's live progress (bars on a terminal, plain lines elsewhere) and its closing before/after table."""

from __future__ import annotations

import io
import re

from rich.console import Console

from fedtune.decode.generate import generate_texts
from fedtune.models.tiny import tiny_model
from fedtune.progress import RunProgress, generation_progress, summary_table


def _render(history: list[dict]) -> str:
    console = Console(width=120, record=True)
    console.print(summary_table(history, "run"))
    return " ".join(console.export_text().split())


def test_before_is_round_zero_and_a_run_without_it_shows_no_false_change() -> None:
    final = {"round": 3, "eval": {"rougeL": 0.1727}}
    text = _render([{"round": 1}, final])
    # eval.before=false: the final round is not also the "before" with a change of +0
    assert "+0.0000" not in text and "0.1727" in text
    assert "not evaluated before training" in text
    text = _render([{"round": 0, "eval": {"rougeL": 0.10}}, {"round": 2, "eval": {"rougeL": 0.05}}, final])
    assert "0.1000" in text and "+0.0727" in text and "0.0500" not in text


def _plain_console() -> tuple[Console, io.StringIO]:
    """A console writing to a file, as a run's stderr does under a pipe, CI or ``> log``."""
    stream = io.StringIO()
    return Console(file=stream, width=80), stream


def test_off_a_terminal_the_bars_leave_no_fragment_in_the_log() -> None:
    console, stream = _plain_console()
    with RunProgress(console, 2) as progress:
        progress.phase("r2 evaluating")
        progress.end_round(2, "loss 5.5228")
    text = stream.getvalue()
    assert "eta" not in text and "━" not in text and "…" not in text
    assert "round 2/2: loss 5.5228\n" in text


def test_off_a_terminal_each_client_task_is_one_plain_line() -> None:
    console, stream = _plain_console()
    with RunProgress(console, 4) as progress:
        progress.phase("loading data and models")
        with progress.task(1, "c01", "train", 2, 4) as report:
            for step in range(1, 11):
                report(step, 10, 2.5 - step / 100)
        with progress.task(1, "c02", "evaluate", 3, 4):
            pass
    lines = stream.getvalue().splitlines()
    assert lines[0] == "loading data and models"
    assert re.fullmatch(r"round 1/4 · client 2/4 \(c01\) · train 10 steps, loss 2\.4000 · \d+ s", lines[1])
    assert re.fullmatch(r"round 1/4 · client 3/4 \(c02\) · evaluate · \d+ s", lines[2])


def test_on_a_terminal_the_bars_stay_and_no_plain_lines_are_printed() -> None:
    stream = io.StringIO()
    console = Console(file=stream, width=80, force_terminal=True)
    with RunProgress(console, 4) as progress, progress.task(1, "c01", "train", 2, 4) as report:
        report(1, 10, 2.5)
    assert "round 1/4 · client" not in stream.getvalue()
    assert "━" in stream.getvalue()


def test_without_progress_nothing_but_the_round_lines() -> None:
    console, stream = _plain_console()
    with RunProgress(console, 4, enabled=False) as progress:
        progress.phase("setting up")
        with progress.task(1, "c01", "train", 2, 4) as report:
            report(1, 10, 2.5)
        progress.end_round(1, "loss 2.5")
    assert stream.getvalue() == "round 1/4: loss 2.5\n"


def _generate_three_prompts() -> None:
    """A model generating for 3 prompts in batches of 2, as an evaluation's decoder does."""
    model, tokenizer = tiny_model("gpt2")
    generate_texts(model, tokenizer, ["a", "bb", "ccc"], max_new_tokens=1, batch_size=2)


def test_eval_generation_off_a_terminal_is_one_line_per_batch() -> None:
    console, stream = _plain_console()
    with generation_progress(console):
        _generate_three_prompts()
    lines = stream.getvalue().splitlines()
    assert [line.split(" · ")[0] for line in lines] == ["generated 2/3 prompts", "generated 3/3 prompts"]
    assert all(re.fullmatch(r".* · \d+ s", line) for line in lines)


def test_eval_generation_on_a_terminal_is_a_bar_that_goes_away() -> None:
    stream = io.StringIO()
    console = Console(file=stream, width=80, force_terminal=True)
    with generation_progress(console):
        _generate_three_prompts()
    assert "generated" not in stream.getvalue()
    assert "━" in stream.getvalue() and "3/3" in stream.getvalue()


def test_a_runs_live_evaluation_counts_prompts_and_a_logged_one_prints_nothing_more() -> None:
    stream = io.StringIO()
    console = Console(file=stream, width=80, force_terminal=True)
    with RunProgress(console, 2) as progress:
        progress.phase("r2 evaluating")
        with progress.generating():
            _generate_three_prompts()
        counted = progress.progress.tasks[progress.step_task]
        assert (counted.completed, counted.total) == (3, 3)
    console, stream = _plain_console()
    with RunProgress(console, 2) as progress:
        progress.phase("r2 evaluating")
        with progress.generating():
            _generate_three_prompts()
    assert stream.getvalue() == "r2 evaluating\n"
