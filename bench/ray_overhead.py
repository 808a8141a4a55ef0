"""P16: round time of the same FedIT job on Ray actors (2 actors x 1 thread) vs in-process (2 threads).

Both sides get the same two cores: in-process runs the clients one after another in this process
with ``--threads`` torch threads; the Ray side runs ``--actors`` persistent actors of
``threads // actors`` CPUs (and torch threads) each, on a local Ray instance started once with
``--threads`` CPUs, so clients on different actors train at the same time. Within every repeat the
two sides alternate; ``round_seconds`` of each round is read back from metrics.jsonl. Timed rounds
are 2..R-1: round 1 on Ray includes each actor's first model load (in-process loads it in setup,
outside rounds) and round R evaluates.

Reported: median round seconds per side, their ratio (Ray / in-process; no target: a number to
report) and the ratio within each repeat (load from other jobs moves whole runs), each run's wall
time including the actors' start-up (a process each, importing torch and building the data), the
Ray instance's start-up, and whether both sides wrote the same metrics (to 1e-5: the sides sum floats
on different thread counts, so a last digit may differ; ``tests/integration/test_ray.py`` compares
the backends at equal threads).

    python bench/ray_overhead.py           # configs/test/fedit-tiny.yaml (tiny Llama, 4 clients)
    python bench/ray_overhead.py --smoke   # 3 rounds, 1 repeat
"""

from __future__ import annotations

import logging
import os
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
from bench.flower_overhead import in_process, same_metrics

SIDES = ("in_process", "ray")


def start_ray(cpus: int) -> float:
    """A local Ray instance with ``cpus`` CPUs (its workers find fedtune on their path); seconds taken
    (0 when this process already holds one, which is then used as it is)."""
    import ray

    if ray.is_initialized():
        return 0.0
    paths = [str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")]
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    # Ray's memory monitor off: on a shared machine another job's memory would get the actors killed.
    os.environ.setdefault("RAY_memory_monitor_refresh_ms", "0")
    begin = time.perf_counter()
    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    return time.perf_counter() - begin


def one_run(side: str, config: Path, overrides: list[str], run_dir: Path) -> dict[str, Any]:
    from fedtune.config import load_config

    cfg = load_config(config, overrides if side == "in_process" else [*overrides, "fed.backend=ray"])
    begin = time.perf_counter()
    rows = in_process(cfg, run_dir)
    return {
        "side": side,
        "wall_seconds": time.perf_counter() - begin,
        "round_seconds": [row.get("round_seconds") for row in rows],
        "client_seconds": [row.get("client_seconds") for row in rows],
        "actor_peak_rss_mb": rows[-1].get("actor_peak_rss_mb"),
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> None:
    parser = base_parser(__doc__ or "P16")
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "test" / "fedit-tiny.yaml")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per run (timed: 2..R-1)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--actors", type=int, default=2, help="Ray actors, threads // actors CPUs each")
    parser.add_argument("--set", action="append", default=[], help="config override, e.g. train.max_steps=5")
    args = parser.parse_args(argv)
    setup_torch(args.threads)
    rounds, repeats = (3, 1) if args.smoke else (args.rounds, args.repeats)
    actor_cpus = max(1, args.threads // args.actors)
    overrides = [
        f"fed.rounds={rounds}",
        f"seed={args.seed}",
        "progress=false",
        "eval.before=false",
        "eval.every=100000",
        f"ray.actors={args.actors}",
        f"ray.num_cpus={actor_cpus}",
        *args.set,
    ]
    began = Start()
    ray_seconds = start_ray(args.actors * actor_cpus)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="fedtune-p16-") as tmp:
        for repeat in range(repeats):
            for side in SIDES if repeat % 2 == 0 else SIDES[::-1]:
                run_dir = Path(tmp) / f"{side}-{repeat}"
                runs.append({"repeat": repeat, **one_run(side, args.config, overrides, run_dir)})
                print(f"repeat {repeat} {side}: {runs[-1]['round_seconds']}", flush=True)
    timed = range(2, rounds) if rounds > 2 else range(1, rounds + 1)

    def seconds(side: str, repeat: int | None = None) -> float:
        chosen = [r for r in runs if r["side"] == side and repeat in (None, r["repeat"])]
        return median(run["round_seconds"][t] for run in chosen for t in timed)

    summary = {side: seconds(side) for side in SIDES}
    ratio = summary["ray"] / summary["in_process"]
    paired = [seconds("ray", k) / seconds("in_process", k) for k in range(repeats)]
    identical = all(
        same_metrics(*(next(r["rows"] for r in runs if r["side"] == s and r["repeat"] == k) for s in SIDES))
        for k in range(repeats)
    )
    walls = {side: median(r["wall_seconds"] for r in runs if r["side"] == side) for side in SIDES}
    text = "\n".join(
        [
            "P16: Ray actors vs in-process, same FedIT job (round seconds, median)",
            "",
            f"`{command_line(__file__, argv)}` — {now()}, load {began.load}, config `{args.config.name}`, "
            f"{rounds} rounds (timed: {list(timed)}), {repeats} repeat(s), in-process {args.threads} "
            f"threads / Ray {args.actors} actors x {actor_cpus} thread(s)",
            "",
            markdown_table(
                ["side", "round s (median)", "run wall s (median)"],
                [[side, summary[side], walls[side]] for side in SIDES],
            ),
            "",
            f"Ray / in-process: **{ratio:.2f}x** per round; paired per repeat: "
            f"{', '.join(f'{p:.2f}' for p in paired)}. Same metrics on both sides: {identical}. "
            f"Ray instance start-up: {ray_seconds:.1f} s, once.",
            "",
        ]
    )
    for run in runs:
        run.pop("rows")
    write_results(
        "p16",
        {
            "config": str(args.config),
            "overrides": overrides,
            "rounds": rounds,
            "timed_rounds": list(timed),
            "summary": {"round_seconds": summary, "ratio": ratio, "paired_ratios": paired},
            "run_wall_seconds": walls,
            "ray_start_seconds": ray_seconds,
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
