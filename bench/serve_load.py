"""``fedtune serve`` under load: many short chat requests at once on loopback, their latency.

A tiny FedIT run (``configs/test/fedit-tiny.yaml``, one round) is trained into a temporary directory and
served on 127.0.0.1 by ``BackgroundServer``; ``--requests`` chat completions (``--max-tokens`` each,
greedy) are sent at once from as many threads, each with a timeout, and the whole run has a deadline,
so it stops by itself. It prints the p50 / p99 / max latency (seconds from send to the whole answer),
the wall time and every status seen. The server decodes on one model thread, each request one step per
turn, so the latency of every request grows with the number in flight: p50 and p99 stay close.

    python bench/serve_load.py                      # 50 requests, 8 tokens each
    python bench/serve_load.py --requests 100 --max-tokens 16
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import ROOT, base_parser, markdown_table, parse, write_results

PROMPT = "Give a synonym of 'happy'."


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``values``, nearest rank."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def train_run(directory: Path) -> Path:
    from rich.console import Console

    from fedtune.config import load_config
    from fedtune.runner import Runner

    cfg = load_config(ROOT / "configs" / "test" / "fedit-tiny.yaml", ["fed.rounds=1", "eval.before=false"])
    run_dir = directory / "run"
    Runner(cfg, run_dir, console=Console(quiet=True)).run()
    return run_dir


def fire(url: str, requests: int, max_tokens: int, timeout: float) -> tuple[list[float], Counter[str]]:
    """``requests`` chat completions sent at once (one thread each, released together): the latency of
    every answered one and the count of each outcome (a status code or an exception's name)."""
    import httpx

    body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": max_tokens, "temperature": 0}
    latencies: list[float] = []
    outcomes: Counter[str] = Counter()
    lock, barrier = threading.Lock(), threading.Barrier(requests)

    def one() -> None:
        barrier.wait()
        start = time.perf_counter()
        try:
            status = str(httpx.post(f"{url}/chat/completions", json=body, timeout=timeout).status_code)
        except httpx.HTTPError as exc:
            status = type(exc).__name__
        with lock:
            outcomes[status] += 1
            if status == "200":
                latencies.append(time.perf_counter() - start)

    threads = [threading.Thread(target=one, daemon=True) for _ in range(requests)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout + 5)
    return latencies, outcomes


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from fedtune.serve import BackgroundServer, build_app, run_service

    with tempfile.TemporaryDirectory() as directory:
        service = run_service(train_run(Path(directory)), served_name="tiny")
        with BackgroundServer(build_app(service, max_concurrent=max(64, args.requests))) as server:
            fire(server.url, 2, args.max_tokens, args.timeout)  # warm-up
            start = time.perf_counter()
            latencies, outcomes = fire(server.url, args.requests, args.max_tokens, args.timeout)
            wall = time.perf_counter() - start
    return {
        "requests": args.requests,
        "max_tokens": args.max_tokens,
        "answered": len(latencies),
        "outcomes": dict(outcomes),
        "p50_s": statistics.median(latencies) if latencies else None,
        "p99_s": percentile(latencies, 99) if latencies else None,
        "max_s": max(latencies) if latencies else None,
        "wall_s": wall,
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = base_parser(__doc__.strip().splitlines()[0])
    parser.add_argument("--requests", type=int, default=50, help="chat requests sent at once")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    args, start = parse(parser, argv)
    if args.smoke:
        args.requests, args.max_tokens = min(args.requests, 10), min(args.max_tokens, 4)
    results = measure(args)

    def seconds(key: str) -> str:
        value = results[key]
        return "-" if value is None else f"{value:.2f}"

    table = markdown_table(
        ["requests at once", "max_tokens", "answered", "p50 s", "p99 s", "max s", "wall s", "outcomes"],
        [
            [
                results["requests"],
                results["max_tokens"],
                results["answered"],
                seconds("p50_s"),
                seconds("p99_s"),
                seconds("max_s"),
                seconds("wall_s"),
                ", ".join(f"{k}: {v}" for k, v in sorted(results["outcomes"].items())),
            ]
        ],
    )
    print(table)
    write_results("serve-load", results, table, args, start)


if __name__ == "__main__":
    main()
