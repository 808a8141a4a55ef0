"""P8: round time of the same FedIT job on the Flower loopback deployment vs in-process.

One ``LocalDeployment`` (a SuperLink and one SuperNode, with its warm client worker, per client,
all subprocesses on 127.0.0.1) is started once; then, alternating within every repeat, the job
runs in-process (``Runner``, clients one after another in this process) and as a Flower run on
the deployment (ServerApp + ``GridFederation``, clients in parallel in their own processes).
Both sides write their own run directory; ``round_seconds`` of each round (sampling, broadcast,
local training, replies, validation, aggregation; evaluation only in the last round) is read
back from metrics.jsonl. Timed rounds are 2..R-1: round 1 on Flower includes each worker's
first model load (in-process loads it in setup, outside rounds) and round R evaluates.

Reported: median round seconds per side, their ratio (target: Flower <= 1.25x in-process),
the per-repeat paired ratios, each run's wall time including the Flower run's start-up
(ServerApp process, data, models, greeting the SuperNodes), and whether the two sides wrote the
same metrics. Threads: in-process uses ``--threads``; each SuperNode's worker gets
``max(1, threads // clients)`` so that both sides use the same cores.

    python bench/flower_overhead.py   # configs/demo/fedit-smollm2.yaml (SmolLM2-135M, 4 clients)
    python bench/flower_overhead.py --smoke   # tiny random model, 2 clients, 1 timed round
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import (
    ROOT,
    Start,
    base_parser,
    command_line,
    markdown_table,
    median,
    now,
    setup_torch,
    write_results,
)

VOLATILE = {
    "client_seconds",
    "server_seconds",
    "round_seconds",
    "peak_rss_mb",
    "actor_peak_rss_mb",
    "gpu_peak_mb",
    "client_peak_mem_mb",
}


def load_rows(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def in_process(cfg: Any, run_dir: Path) -> list[dict[str, Any]]:
    from rich.console import Console

    from fedtune.runner import Runner

    Runner(cfg, run_dir, console=Console(quiet=True)).run()
    return load_rows(run_dir)


def on_flower(deployment: Any, cfg: Any, run_dir: Path) -> list[dict[str, Any]]:
    import yaml

    from fedtune.flower.node import task_names

    cfg.fed.backend = "flower"
    text = yaml.safe_dump(cfg.to_yaml_dict(), sort_keys=False)
    deployment.run(text, run_dir, False, task_names(text), poll=0.5)
    return load_rows(run_dir)


def same_metrics(first: list[dict[str, Any]], second: list[dict[str, Any]]) -> bool:
    def close(a: Any, b: Any) -> bool:
        if isinstance(a, dict) and isinstance(b, dict):
            return set(a) == set(b) and all(close(a[k], b[k]) for k in a)
        if isinstance(a, list) and isinstance(b, list):
            return len(a) == len(b) and all(close(x, y) for x, y in zip(a, b, strict=True))
        if isinstance(a, float) and isinstance(b, float):
            return abs(a - b) <= 1e-5 * max(1.0, abs(a), abs(b))
        return bool(a == b)

    strip = [
        [{k: v for k, v in row.items() if k not in VOLATILE} for row in rows] for rows in (first, second)
    ]
    return close(strip[0], strip[1])


def main(argv: list[str] | None = None) -> None:
    parser = base_parser(__doc__ or "P8")
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "demo" / "fedit-smollm2.yaml")
    parser.add_argument("--rounds", type=int, default=4, help="rounds per run (timed: 2..R-1)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--set", action="append", default=[], help="config override, e.g. train.max_steps=5")
    args = parser.parse_args(argv)
    setup_torch(args.threads)
    from fedtune.config import load_config
    from fedtune.flower.local import LocalDeployment

    config, rounds, repeats = args.config, args.rounds, args.repeats
    extra: list[str] = []
    if args.smoke:
        config, rounds, repeats = ROOT / "configs" / "test" / "fedit-tiny.yaml", 3, 1
        extra = ["data.partition.num_clients=2"]
    overrides = [
        *extra,
        f"fed.rounds={rounds}",
        f"seed={args.seed}",
        "progress=false",
        "eval.before=false",
        "eval.every=100000",
        *args.set,
    ]
    clients = load_config(config, overrides).data.partition.num_clients
    node_threads = max(1, args.threads // clients)
    began = Start()
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="fedtune-p8-") as tmp:
        root = Path(tmp)
        begin = time.perf_counter()
        deployment = LocalDeployment(
            root=root / "deployment",
            num_nodes=clients,
            node_env=lambda index: {"OMP_NUM_THREADS": str(node_threads)},
        )
        with deployment:
            deployment_seconds = time.perf_counter() - begin
            for repeat in range(repeats):
                order = ("in_process", "flower") if repeat % 2 == 0 else ("flower", "in_process")
                for side in order:
                    cfg = load_config(config, overrides)
                    run_dir = root / f"{side}-{repeat}"
                    begin = time.perf_counter()
                    rows = (
                        in_process(cfg, run_dir)
                        if side == "in_process"
                        else on_flower(deployment, cfg, run_dir)
                    )
                    runs.append(
                        {
                            "side": side,
                            "repeat": repeat,
                            "wall_seconds": time.perf_counter() - begin,
                            "round_seconds": [row.get("round_seconds") for row in rows],
                            "client_seconds": [row.get("client_seconds") for row in rows],
                            "bytes_up": [row.get("bytes_up") for row in rows],
                            "rows": rows,
                        }
                    )
                    print(f"repeat {repeat} {side}: {runs[-1]['round_seconds']}", flush=True)
    timed = range(2, rounds) if rounds > 2 else range(1, rounds + 1)

    def seconds(side: str) -> list[float]:
        return [run["round_seconds"][r] for run in runs if run["side"] == side for r in timed]

    summary = {side: median(seconds(side)) for side in ("in_process", "flower")}
    ratio = summary["flower"] / summary["in_process"]
    paired = []
    for repeat in range(repeats):
        pair = {run["side"]: run for run in runs if run["repeat"] == repeat}
        paired.append(
            statistics.median(pair["flower"]["round_seconds"][r] for r in timed)
            / statistics.median(pair["in_process"]["round_seconds"][r] for r in timed)
        )
    identical = all(
        same_metrics(
            next(r["rows"] for r in runs if r["side"] == "in_process" and r["repeat"] == repeat),
            next(r["rows"] for r in runs if r["side"] == "flower" and r["repeat"] == repeat),
        )
        for repeat in range(repeats)
    )
    walls = {side: median(r["wall_seconds"] for r in runs if r["side"] == side) for side in summary}
    verdict = "meets" if ratio <= 1.25 else "misses"
    text = "\n".join(
        [
            "P8: Flower loopback deployment vs in-process, same FedIT job (round seconds, median)",
            "",
            f"`{command_line(__file__, argv)}` — {now()}, load {began.load}, "
            f"config `{config.name}` ({clients} clients), {rounds} rounds (timed: {list(timed)}), "
            f"{repeats} repeat(s), threads {args.threads} in-process / {node_threads} per SuperNode",
            "",
            markdown_table(
                ["side", "round s (median)", "run wall s (median)"],
                [[side, summary[side], walls[side]] for side in summary],
            ),
            "",
            f"Flower / in-process: **{ratio:.2f}x** per round ({verdict} the <= 1.25x target); paired "
            f"per repeat: {', '.join(f'{p:.2f}' for p in paired)}. Same metrics on both sides: {identical}. "
            f"Deployment start-up (SuperLink + SuperNodes + workers): {deployment_seconds:.1f} s, once.",
            "",
        ]
    )
    for run in runs:
        run.pop("rows")
    write_results(
        "p8",
        {
            "config": str(config),
            "overrides": overrides,
            "clients": clients,
            "rounds": rounds,
            "timed_rounds": list(timed),
            "summary": {"round_seconds": summary, "ratio": ratio, "paired_ratios": paired},
            "run_wall_seconds": walls,
            "deployment_seconds": deployment_seconds,
            "same_metrics": identical,
            "runs": runs,
        },
        text,
        args,
        began,
    )
    print(text)


if __name__ == "__main__":
    main()
