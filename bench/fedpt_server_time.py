"""P6: FedPT server time per round (distillation on D_kd) with the frozen teacher cached vs recomputed.

The frozen part of FedPT's teacher, ``z_l0 - alpha * z_s0`` on the public set, never changes.
``teacher_cache=disk`` computes it in round 1 and reads it back afterwards; the yardstick
(``teacher_cache=recompute``) recomputes the large and the base small model's logits every round.
Both sides distil the same aggregated adapter with the same batches, alternating round by round.

Reported per side (median over rounds 2..R): server seconds per round (``kd_seconds``), the part
spent in the student's own forward/backward/step (``kd_student_seconds`` = "one KD pass of the
small model"), and their ratio; target: cached <= 1.5x one KD pass. Round 1's teacher build time
and the cache's size on disk are reported too.

    python bench/fedpt_server_time.py   # configs/paper/fedpt-smollm2.yaml's models and KD settings
    python bench/fedpt_server_time.py --smoke   # tiny models, seconds
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ROOT, Start, base_parser, command_line, now, setup_torch, write_results


def build(config: Path, overrides: list[str], run_dir: Path) -> tuple[Any, Any]:
    from rich.console import Console

    from fedtune.config import load_config
    from fedtune.progress import RunProgress
    from fedtune.runner import Runner

    cfg = load_config(config, overrides)
    run_dir.mkdir(parents=True, exist_ok=True)
    runner = Runner(cfg, run_dir, console=Console(quiet=True))
    with RunProgress(runner.console, 1, enabled=False) as progress:
        algorithm, _, server = runner._build(progress)
    algorithm.setup(server)
    return algorithm, server


def main(argv: list[str] | None = None) -> None:
    parser = base_parser(__doc__ or "P6")
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "paper" / "fedpt-smollm2.yaml")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--set", action="append", default=[], help="config override, e.g. model.name=...")
    args = parser.parse_args(argv)
    setup_torch(args.threads)
    import numpy as np

    config = args.config
    overrides = ["progress=false", *args.set]
    if args.smoke:
        config = ROOT / "configs" / "test" / "fedpt-tiny.yaml"
        args.rounds = min(args.rounds, 3)
    began = Start()
    work = Path(tempfile.mkdtemp(prefix="fedtune-p6-"))
    rounds: dict[str, list[dict[str, float]]] = {"disk": [], "recompute": []}
    try:
        sides = {
            mode: build(config, [*overrides, f"fedpt.teacher_cache={mode}"], work / mode) for mode in rounds
        }
        _, server = sides["disk"]
        initial = server.resources.initial_adapter()
        rng = np.random.default_rng(args.seed)
        # A non-trivial aggregated adapter (tuned != base), the same for both sides.
        adapter = {k: v + rng.normal(0, 0.02, v.shape).astype(v.dtype) for k, v in initial.items()}
        for rnd in range(1, args.rounds + 1):
            for mode, (algorithm, side_server) in sides.items():
                _, stats = algorithm._distill(rnd, side_server, adapter)
                rounds[mode].append(stats)
                print(
                    f"round {rnd} {mode}: " + ", ".join(f"{k} {v:.3f}" for k, v in stats.items()), flush=True
                )
        cache_bytes = sum(p.stat().st_size for p in (work / "disk" / "cache").rglob("*.npy"))
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def median(mode: str, key: str) -> float:
        return statistics.median(r[key] for r in rounds[mode][1:])

    summary = {
        mode: {
            "server_s_per_round": median(mode, "kd_seconds"),
            "one_kd_pass_s": median(mode, "kd_student_seconds"),
            "ratio_to_kd_pass": median(mode, "kd_seconds") / median(mode, "kd_student_seconds"),
            "round1_teacher_s": rounds[mode][0]["teacher_seconds"],
        }
        for mode in rounds
    }
    speedup = summary["recompute"]["server_s_per_round"] / summary["disk"]["server_s_per_round"]
    cached = summary["disk"]["ratio_to_kd_pass"]
    table = [
        "| teacher | server s/round (rounds 2..R, median) | one KD pass of the small model | ratio "
        "| round-1 teacher build |",
        "|---|---|---|---|---|",
    ]
    for mode, label in (("disk", "cached once (ours)"), ("recompute", "recomputed every round (yardstick)")):
        row = summary[mode]
        table.append(
            f"| {label} | {row['server_s_per_round']:.2f} s | {row['one_kd_pass_s']:.2f} s | "
            f"{row['ratio_to_kd_pass']:.2f}x | {row['round1_teacher_s']:.2f} s |"
        )
    verdict = "meets" if cached <= 1.5 else "misses"
    text = "\n".join(
        [
            "# P6: FedPT server time per round",
            "",
            f"`{command_line(__file__, argv)}` — {now()}, load {began.load}, "
            f"config `{config.name}`, {args.rounds} rounds",
            "",
            *table,
            "",
            f"Cached vs recomputed: **{speedup:.2f}x** faster per round; cached = {cached:.2f}x one KD pass "
            f"({verdict} the <= 1.5x target). Cache on disk: {cache_bytes / 2**20:.1f} MB.",
            "",
        ]
    )
    print(text)
    results = {"config": str(config), "overrides": overrides, "rounds": rounds, "summary": summary}
    write_results("p6", results | {"speedup": speedup, "cache_mb": cache_bytes / 2**20}, text, args, began)


if __name__ == "__main__":
    main()
