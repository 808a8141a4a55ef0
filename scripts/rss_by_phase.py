"""Where a run's memory goes: the process's RSS sampled every 20 ms while a run runs in-process, with the
peak between consecutive phases (loading, each client task, each perplexity pass) printed as a table.

    python scripts/rss_by_phase.py configs/demo/fedit-smollm2.yaml -o runs/rss fed.rounds=1 train.max_steps=2

Each row: seconds since the imports were done, the RSS at that moment, the highest RSS sampled since the
row before it, and what starts or ends there. docs/memory.md has its numbers for the demo.
"""

from __future__ import annotations

import argparse
import resource
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
from rich.console import Console

import fedtune.eval.evaluate as evaluate_module
from fedtune import progress as progress_module
from fedtune.config import load_config
from fedtune.runner import Runner

MB = 2**20


class RssLog:
    """Marks with the RSS now and the peak sampled since the previous mark."""

    def __init__(self) -> None:
        self.process = psutil.Process()
        self.start = time.perf_counter()
        self.rows: list[tuple[float, float, float, str]] = []
        self.window_peak = 0.0
        self.stopped = threading.Event()
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self) -> None:
        while not self.stopped.wait(0.02):
            self.window_peak = max(self.window_peak, self.process.memory_info().rss / MB)

    def mark(self, label: str) -> None:
        now = self.process.memory_info().rss / MB
        self.rows.append((time.perf_counter() - self.start, now, max(self.window_peak, now), label))
        self.window_peak = 0.0


def instrument(rss: RssLog) -> None:
    """Mark every progress phase, client task and perplexity pass of the run."""
    phase, task, perplexity = (
        progress_module.RunProgress.phase,
        progress_module.RunProgress.task,
        evaluate_module.perplexity,
    )

    def marked_phase(self: progress_module.RunProgress, text: str) -> None:
        rss.mark(text)
        phase(self, text)

    @contextmanager
    def marked_task(
        self: progress_module.RunProgress, rnd: int, client: str, name: str, *rest: int
    ) -> Iterator[Any]:
        rss.mark(f"r{rnd} {client} {name} starts")
        with task(self, rnd, client, name, *rest) as report:
            yield report
        rss.mark(f"r{rnd} {client} {name} ends")

    def marked_perplexity(*args: Any, **kwargs: Any) -> float:
        rss.mark("perplexity starts")
        value = perplexity(*args, **kwargs)
        rss.mark("perplexity ends")
        return value

    progress_module.RunProgress.phase = marked_phase  # type: ignore[method-assign]
    progress_module.RunProgress.task = marked_task  # type: ignore[assignment,method-assign]
    evaluate_module.perplexity = marked_perplexity


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", type=Path)
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("-o", "--output-dir", type=Path, required=True)
    args = parser.parse_intermixed_args()
    rss = RssLog()
    instrument(rss)
    rss.mark("imports done")
    cfg = load_config(args.config, args.overrides)
    Runner(cfg, args.output_dir, console=Console(quiet=True)).run()
    rss.mark("done")
    rss.stopped.set()
    print(f"{'s':>7}  {'RSS MB':>7}  {'peak MB':>7}  (peak since the row before)")
    for seconds, now, peak, label in rss.rows:
        print(f"{seconds:7.1f}  {now:7.0f}  {peak:7.0f}  {label}")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024  # KiB on Linux
    print(f"peak RSS of the process (getrusage): {peak} MB")


if __name__ == "__main__":
    main()
