"""The `fedtune` command's start-up: the CPU and wall seconds of commands that need no model.

Each command (``--help``, ``run --help``, a config with a misspelt key, ``models list``, ``data list``)
runs ``--repeats`` times as ``python -m fedtune ...`` in a fresh process with ``src/`` on the path; its
CPU time is the child's user + sys (``getrusage``), its wall time from start to exit. The commands take
turns within every repeat, so load from other jobs hits them alike. ``--baseline-src`` times the same
commands with another source tree (e.g. an older commit's ``src/``, checked out with
``git worktree add``), alternating with this one, and reports the ratio.

    python bench/cli_startup.py                          # 5 repeats -> bench/results/cli-startup.{json,md}
    python bench/cli_startup.py --baseline-src /tmp/before/src
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import ROOT, base_parser, markdown_table, median, parse, write_results

CONFIG = "configs/test/fedit-tiny.yaml"
COMMANDS: dict[str, list[str]] = {
    "--help": ["--help"],
    "run --help": ["run", "--help"],
    f"run {CONFIG} fed.round=3": ["run", CONFIG, "fed.round=3"],  # a misspelt key: exit 2
    "models list": ["models", "list"],
    "data list": ["data", "list"],
}
EXPECTED_EXIT = {f"run {CONFIG} fed.round=3": 2}


def time_command(label: str, src: Path, cache_dir: Path) -> tuple[float, float]:
    """CPU (user + sys) and wall seconds of one run of the command ``label`` with ``src`` on the path;
    ``models list`` reads an empty cache (``cache_dir``), the same on every side."""
    argv = COMMANDS[label] + (["--cache-dir", str(cache_dir)] if label == "models list" else [])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(ROOT)]), "OMP_NUM_THREADS": "1"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "fedtune", *argv], cwd=ROOT, env=env, capture_output=True, text=True
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != EXPECTED_EXIT.get(label, 0):
        raise RuntimeError(f"fedtune {' '.join(argv)} exited {done.returncode}: {done.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall


def measure(sources: dict[str, Path], repeats: int) -> dict[str, dict[str, dict[str, Any]]]:
    """For each source tree and command: every run's CPU and wall seconds, and their medians."""
    runs: dict[str, dict[str, list[tuple[float, float]]]] = {
        side: {label: [] for label in COMMANDS} for side in sources
    }
    with tempfile.TemporaryDirectory() as cache_dir:
        for _ in range(repeats):
            for label in COMMANDS:
                for side, src in sources.items():
                    runs[side][label].append(time_command(label, src, Path(cache_dir)))
    return {
        side: {
            label: {
                "cpu_s": [cpu for cpu, _ in timed],
                "wall_s": [wall for _, wall in timed],
                "median_cpu_s": median(cpu for cpu, _ in timed),
                "median_wall_s": median(wall for _, wall in timed),
            }
            for label, timed in by_label.items()
        }
        for side, by_label in runs.items()
    }


def table(results: dict[str, dict[str, dict[str, Any]]]) -> str:
    headers = ["command", "CPU s (median)", "wall s (median)"]
    baseline = results.get("baseline")
    if baseline:
        headers += ["baseline CPU s", "baseline wall s", "CPU baseline / this"]
    rows = []
    for label in COMMANDS:
        ours = results["this"][label]
        row: list[Any] = [f"fedtune {label}", ours["median_cpu_s"], ours["median_wall_s"]]
        if baseline:
            theirs = baseline[label]
            ratio = theirs["median_cpu_s"] / max(ours["median_cpu_s"], 1e-9)
            row += [theirs["median_cpu_s"], theirs["median_wall_s"], f"{ratio:.2g}x"]
        rows.append(row)
    return markdown_table(headers, rows)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = base_parser(__doc__.strip().splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="runs of each command (the median is kept)")
    parser.add_argument("--src", type=Path, default=ROOT / "src", help="the source tree to time")
    parser.add_argument("--baseline-src", type=Path, default=None, help="another source tree to compare")
    args, start = parse(parser, argv)
    repeats = 1 if args.smoke else args.repeats
    sources = {"this": args.src.resolve()}
    if args.baseline_src is not None:
        sources["baseline"] = args.baseline_src.resolve()
    results: dict[str, Any] = {
        "repeats": repeats,
        "commands": {label: ["fedtune", *command] for label, command in COMMANDS.items()},
        # This checkout's own tree by its path in the repository, not this machine's.
        "sources": {
            side: str(src.relative_to(ROOT)) if src.is_relative_to(ROOT) else str(src)
            for side, src in sources.items()
        },
        "results": measure(sources, repeats),
    }
    text = table(results["results"])
    print(text)
    write_results("cli-startup", results, text, args, start)
    return results


if __name__ == "__main__":
    main()
