"""P4 on Ray: per-actor memory with 1,000 clients a round, each keeping its own adapter.

FedIT in standalone mode on the tiny model: every client trains its own LoRA adapter and keeps it in
its state (``ctx.state``) on the actor that serves it, as personalised methods do, so an actor holds
the base model once and ``clients / actors`` adapters. Two runs on the same local Ray instance:

- ``baseline``: 2 clients (one per actor): each actor's peak RSS with the model loaded and the run built
  (Python, torch, the data, one adapter);
- ``clients``: ``--clients`` clients, all in one round.

Reported per actor: its peak RSS in both runs, the adapters it holds and their bytes (read from the
run's checkpoint), and the check ``peak <= baseline + held adapters + 1 GB`` (the target: base model +
the adapters it holds + 1 GB per worker; the baseline stands for the base model, measured, not
computed, so it includes the runtime an actor needs anyway).

    python bench/ray_memory.py                 # 1,000 clients, 2 actors
    python bench/ray_memory.py --smoke         # 20 clients
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ROOT, Start, base_parser, command_line, markdown_table, now, write_results
from bench.flower_overhead import in_process
from bench.ray_overhead import start_ray

GB_MB = 1024.0


def run(config: Path, clients: int, actors: int, run_dir: Path) -> tuple[dict[str, float], dict[str, float]]:
    """One round of ``clients`` standalone clients on Ray: each actor's peak RSS (MB) and the adapter
    megabytes its clients hold at the end (from the checkpoint)."""
    from fedtune.config import load_config
    from fedtune.fl.checkpoint import latest_checkpoint, load_checkpoint

    cfg = load_config(
        config,
        [
            "fed.backend=ray",
            "fed.mode=standalone",
            "fed.rounds=1",
            f"ray.actors={actors}",
            "ray.num_cpus=1",
            "data.partition.scheme=iid",
            f"data.partition.num_clients={clients}",
            f"data.max_train_examples={2 * clients}",
            "train.max_steps=1",
            "train.batch_size=2",
            "eval.before=false",
            "eval.max_examples=2",
            "eval.metrics=[perplexity]",
            "progress=false",
        ],
    )
    rows = in_process(cfg, run_dir)
    peaks: dict[str, float] = dict(rows[-1].get("actor_peak_rss_mb") or {})
    tree = load_checkpoint(latest_checkpoint(run_dir))  # type: ignore[arg-type]
    held: dict[str, float] = {f"actor{i}": 0.0 for i in range(actors)}
    for index, state in enumerate(tree["federation"]["clients"].values()):
        held[f"actor{index % actors}"] += _array_bytes(state) / 2**20
    return peaks, held


def _array_bytes(tree: Any) -> int:
    if isinstance(tree, dict):
        return sum(_array_bytes(value) for value in tree.values())
    if isinstance(tree, list):
        return sum(_array_bytes(value) for value in tree)
    return int(getattr(tree, "nbytes", 0))


def main(argv: list[str] | None = None) -> None:
    parser = base_parser(__doc__ or "P4 on Ray")
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "test" / "fedit-tiny.yaml")
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--actors", type=int, default=2)
    args = parser.parse_args(argv)
    clients = 20 if args.smoke else args.clients
    began = Start()
    ray_seconds = start_ray(args.actors)
    with tempfile.TemporaryDirectory(prefix="fedtune-p4-ray-") as tmp:
        base_peaks, _ = run(args.config, args.actors, args.actors, Path(tmp) / "baseline")
        peaks, held = run(args.config, clients, args.actors, Path(tmp) / "clients")
    rows = []
    verdicts = []
    for actor in sorted(peaks):
        bound = base_peaks.get(actor, 0.0) + held.get(actor, 0.0) + GB_MB
        verdicts.append(peaks[actor] <= bound)
        rows.append(
            [actor, base_peaks.get(actor), peaks[actor], held.get(actor), bound, peaks[actor] <= bound]
        )
    text = "\n".join(
        [
            f"P4 on Ray: per-actor peak RSS with {clients} standalone clients ({args.actors} actors)",
            "",
            f"`{command_line(__file__, argv)}` — {now()}, load {began.load}, config `{args.config.name}`, "
            f"Ray start-up {ray_seconds:.1f} s",
            "",
            markdown_table(
                ["actor", "baseline peak MB", "peak MB", "adapters held MB", "bound MB", "within"],
                rows,
            ),
            "",
            f"bound = baseline (model loaded, run built) + adapters held + 1 GB; all within: {all(verdicts)}",
            "",
        ]
    )
    write_results(
        "p4-ray",
        {
            "config": str(args.config),
            "clients": clients,
            "actors": args.actors,
            "baseline_peak_mb": base_peaks,
            "peak_mb": peaks,
            "held_adapter_mb": held,
            "within": all(verdicts),
            "ray_start_seconds": ray_seconds,
        },
        text,
        args,
        began,
    )
    print(text)


if __name__ == "__main__":
    main()
