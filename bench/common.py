"""Helpers shared by the benchmark scripts: arguments, machine facts, results files, tables.

Conventions every ``bench/p*.py`` follows:
- ``--smoke`` runs a CI-sized version (tiny model, a few steps, seconds) and writes
  ``<name>.smoke.json`` so a smoke run never overwrites the real results;
- ``--results-dir`` (default ``bench/results``) is where ``<name>.json`` and ``<name>.md`` go;
- ``--threads`` (default 2) pins torch's intra-op threads, the same for both sides of a comparison.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import sys
from collections.abc import Iterable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
DEFAULT_RESULTS_DIR = BENCH_DIR / "results"


def base_parser(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--smoke", action="store_true", help="CI-sized run on a tiny model (seconds)")
    parser.add_argument(
        "--results-dir", type=Path, default=DEFAULT_RESULTS_DIR, help="where <name>.json / .md are written"
    )
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads (both sides)")
    parser.add_argument("--seed", type=int, default=0)
    return parser


def table_parser(description: str | None) -> argparse.ArgumentParser:
    """The options every paper-table script shares; the script adds its rows and settings."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("config", type=Path)
    parser.add_argument("--runs-dir", type=Path, default=Path("runs/paper"))
    parser.add_argument("--results-dir", type=Path, default=DEFAULT_RESULTS_DIR)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--jobs", type=int, default=1, help="runs at once, one thread each")
    parser.add_argument("--table-only", action="store_true", help="tabulate existing runs, start nothing")
    parser.add_argument("--set", action="append", default=[], help="a config override for every run")
    return parser


def setup_torch(threads: int) -> None:
    # Offline by default: benchmarks use the local zoo and built-in data only.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    torch.set_num_threads(threads)


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_info() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "versions": {p: _version(p) for p in ("torch", "transformers", "peft", "accelerate", "numpy")},
    }
    try:
        import psutil

        info["memory_gb"] = round(psutil.virtual_memory().total / 2**30, 1)
    except ImportError:
        pass
    # The machines are shared: the load says how noisy the numbers of this run may be.
    info["load_avg_at_end"] = load_avg()
    return info


def load_avg() -> list[float]:
    """1, 5 and 15 minute load averages (empty where the OS has none)."""
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else []


def median(values: Iterable[float]) -> float:
    data = list(values)
    if not data:
        raise ValueError("median of no values")
    return float(statistics.median(data))


def rss_mb() -> float:
    """Current resident memory of this process."""
    import psutil

    return float(psutil.Process().memory_info().rss) / 2**20


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MiB (``fedtune.train.loop.peak_rss_mb``)."""
    from fedtune.train.loop import peak_rss_mb as own_peak

    return own_peak()


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
        return str(value)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def results_name(name: str, smoke: bool) -> str:
    return f"{name}.smoke" if smoke else name


def write_results(
    name: str,
    results: dict[str, Any],
    markdown: str,
    *,
    results_dir: Path,
    smoke: bool,
    started: str,
    start_load: list[float] | None = None,
) -> Path:
    """Write ``<name>.json`` (results plus run metadata) and ``<name>.md``; return the JSON path."""
    results_dir.mkdir(parents=True, exist_ok=True)
    stem = results_name(name, smoke)
    record = {
        "benchmark": name,
        "load_avg_at_start": start_load,
        "smoke": smoke,
        "command": [Path(sys.executable).name, *sys.argv],
        "started": started,
        "finished": now(),
        "machine": machine_info(),
        **results,
    }
    path = results_dir / f"{stem}.json"
    path.write_text(json.dumps(record, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    (results_dir / f"{stem}.md").write_text(markdown + "\n", encoding="utf-8")
    return path


def panel_grid(
    count: int, width: float, height: float, margin: float = 0.6
) -> tuple[Any, list[Any], list[Any]]:
    """A figure of ``count`` panels of ``width`` x ``height`` inches, three at most a line (``margin``:
    inches for the title and legend): the figure, its panels in order, the first panel of each line."""
    from matplotlib.figure import Figure

    cols = min(3, count)
    lines = -(-count // cols)
    figure = Figure(figsize=(1.0 + width * cols, margin + height * lines), layout="constrained")
    grid = figure.subplots(lines, cols, squeeze=False)
    axes = [ax for line in grid for ax in line]
    for spare in axes[count:]:
        spare.set_visible(False)
    return figure, axes[:count], [line[0] for line in grid]


def sibling(stem: Path, suffix: str) -> Path:
    """``<stem><suffix>``; not ``with_suffix``, which cuts a name holding a dot ("llm1.5b", "s0.33")."""
    return stem.with_name(stem.name + suffix)


def earlier_results(stem: Path) -> dict[str, Any]:
    """The per-row results of a table's previous write (``<stem>.json``), or {} when there is none."""
    path = sibling(stem, ".json")
    if not path.is_file():
        return {}
    try:
        results = json.loads(path.read_text())["results"]
    except (ValueError, KeyError, TypeError) as error:
        message = f"{path}: not a table's results file ({error}); move it away or drop --keep-earlier"
        raise SystemExit(message) from error
    return results if isinstance(results, dict) else {}


def carried_seeds(earlier: dict[str, Any], key: str, wanted: Iterable[str], done: Iterable[str]) -> list[str]:
    """The seeds asked for that have no finished run here but a value of ``key`` in ``earlier``."""
    have = set(done)
    return [seed for seed in wanted if seed not in have and seed in earlier.get(f"{key}_by_seed", {})]


def write_table(stem: Path, text: str, config: str, command: str, results: Any) -> None:
    """A paper-table script's output: ``<stem>.md`` (what it prints) and ``<stem>.json`` (the numbers)."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    sibling(stem, ".md").write_text(text if text.endswith("\n") else text + "\n")
    record = {"config": config, "command": command, "machine": machine_info(), "results": results}
    sibling(stem, ".json").write_text(json.dumps(record, indent=1))
    print(text)
