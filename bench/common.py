"""Helpers shared by the benchmark scripts: arguments, machine facts, results files, tables.

Conventions every benchmark of ``bench/ids.py`` with a ``--smoke`` size follows:
- ``--smoke`` runs a CI-sized version (tiny model, a few steps, seconds) and writes
  ``<name>.smoke.json`` so a smoke run never overwrites the real results;
- ``--results-dir`` (default ``bench/results``) is where ``<name>.json`` and ``<name>.md`` go;
- ``--threads`` (default 2) pins torch's intra-op threads, the same for both sides of a comparison.

The benchmarks that measure a config's job (``config_parser``) write ``<kind>-<config name>.{md,json}``
through ``write_table``; the paper tables of ``experiments/`` write theirs the same way.
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
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
DEFAULT_RESULTS_DIR = BENCH_DIR / "results"


MODEL, SMOKE_MODEL = "smollm2-135m-instruct", "tiny-llama"


def base_parser(description: str, *, model: bool = False) -> argparse.ArgumentParser:
    """The options of every pN benchmark (and ``--model`` with ``model``: see ``parse``)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--smoke", action="store_true", help="CI-sized run on a tiny model (seconds)")
    parser.add_argument(
        "--results-dir", type=Path, default=DEFAULT_RESULTS_DIR, help="where <name>.json / .md are written"
    )
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads (both sides)")
    parser.add_argument("--seed", type=int, default=0)
    if model:
        parser.add_argument("--model", default=None, help=f"default {MODEL} ({SMOKE_MODEL} with --smoke)")
    return parser


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> tuple[argparse.Namespace, Start]:
    """The arguments (``--model`` resolved to its default), torch's threads pinned, and the start of
    the measurement."""
    args = parser.parse_args(argv)
    if "model" in vars(args) and args.model is None:
        args.model = SMOKE_MODEL if args.smoke else MODEL
    setup_torch(args.threads)
    return args, Start()


def config_parser(description: str | None) -> argparse.ArgumentParser:
    """The options of a benchmark that measures one config's job: the config, ``--set`` overrides and
    ``--results-dir``; the script adds its own."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("config", type=Path)
    parser.add_argument("--results-dir", type=Path, default=DEFAULT_RESULTS_DIR)
    parser.add_argument("--set", action="append", default=[], help="a config override for every run")
    return parser


def command_line(script: str, argv: Sequence[str] | None) -> str:
    """``python <script> <arguments>`` as a results file quotes it, the script relative to the checkout."""
    path = Path(script).resolve()
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    return " ".join(["python", shown.as_posix(), *(argv if argv is not None else sys.argv[1:])])


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


@dataclass(frozen=True)
class Start:
    """When a measurement started and the machine's load then (``write_results`` records both)."""

    time: str = field(default_factory=now)
    load: list[float] = field(default_factory=load_avg)


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
    name: str, results: dict[str, Any], markdown: str, args: argparse.Namespace, start: Start
) -> Path:
    """Write ``<name>.json`` (results plus run metadata) and ``<name>.md`` into ``args.results_dir``
    (``<name>.smoke.*`` with ``args.smoke``); return the JSON path."""
    results_dir: Path = args.results_dir
    results_dir.mkdir(parents=True, exist_ok=True)
    stem = results_name(name, args.smoke)
    record = {
        "benchmark": name,
        "load_avg_at_start": start.load,
        "smoke": args.smoke,
        "command": [Path(sys.executable).name, *sys.argv],
        "started": start.time,
        "finished": now(),
        "machine": machine_info(),
        **results,
    }
    path = results_dir / f"{stem}.json"
    path.write_text(json.dumps(record, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    (results_dir / f"{stem}.md").write_text(markdown + "\n", encoding="utf-8")
    print(f"wrote {path}", file=sys.stderr)
    return path


def sibling(stem: Path, suffix: str) -> Path:
    """``<stem><suffix>``; not ``with_suffix``, which cuts a name holding a dot ("llm1.5b", "s0.33")."""
    return stem.with_name(stem.name + suffix)


def write_table(stem: Path, text: str, config: str, command: str, results: Any) -> None:
    """A table's output: ``<stem>.md`` (what it prints) and ``<stem>.json`` (the numbers, the config, the
    command and the machine)."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    sibling(stem, ".md").write_text(text if text.endswith("\n") else text + "\n")
    record = {"config": config, "command": command, "machine": machine_info(), "results": results}
    sibling(stem, ".json").write_text(json.dumps(record, indent=1))
    print(text)
