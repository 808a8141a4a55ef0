"""What a FedKSeed client holds, measured: the peak resident memory of real client processes.

Each variant runs one short round of the config's job (``configs/paper/unequal-smollm2.yaml``) on a
loopback Flower deployment (``fedtune run --backend flower``), so every client is its own process (a
SuperNode's warm worker) that never shares memory with the server. The client reports the peak RSS of
its process (``fedtune.train.loop.peak_rss_mb``, Linux's VmHWM) after its local steps;
``client_peak_mem_mb`` in metrics.jsonl is the largest over the round's clients. Local training is the
config's own (batch size, sequence length); only what does not touch a client is cut short (one round,
two clients, two local steps, a tiny evaluation).

Variants (the rows of ``experiments/unequal_table.py``'s ``kseed`` study):
- ``fedit``: FedIT, a client holding the whole model with LoRA (its gradients and AdamW state on LoRA);
- ``fedkseed``: FedKSeed with ``restore: copy`` (the default: a host copy of the weights, bit-exact);
- ``fedkseed_undo``: FedKSeed with ``restore: undo`` (the paper's in-place way, exact up to rounding).
The ``baseline`` row is a worker-like process that has imported torch, transformers and fedtune and
holds no model. ``KB up`` is what one client sent in the round (the run's byte counter).

    python bench/fedkseed_memory.py configs/paper/unequal-smollm2.yaml
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import command_line, config_parser, markdown_table, write_table
from bench.fedbiot_memory import baseline_mb, measure

SHORT = [
    "fed.rounds=1",
    "train.max_steps=2",
    "data.partition.num_clients=2",
    "fed.clients_per_round=2",
    "eval.before=false",
    "eval.max_examples=2",
    "eval.metrics=[perplexity]",
    "progress=false",
]
# The rows of experiments/unequal_table.py (tests/integration/test_bench_smoke.py checks they agree).
VARIANTS: dict[str, list[str]] = {
    "fedit": ["algorithm=fedit", "fedkseed=null"],
    "fedkseed": ["algorithm=fedkseed"],
    "fedkseed_undo": ["algorithm=fedkseed", "fedkseed.restore=undo"],
}
LABELS = {
    "baseline": "process with torch + transformers + fedtune imported, no model",
    "fedit": "FedIT: the whole model + LoRA (AdamW)",
    "fedkseed": "FedKSeed, restore: copy (default)",
    "fedkseed_undo": "FedKSeed, restore: undo",
}


def main(argv: list[str] | None = None) -> None:
    parser = config_parser(__doc__)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    args = parser.parse_args(argv)
    from fedtune.config import load_config

    cfg = load_config(args.config, args.set)
    results: dict[str, dict[str, Any]] = {"baseline": {"client_peak_mem_mb": baseline_mb()}}
    with tempfile.TemporaryDirectory(prefix="fedkseed-memory-") as tmp:
        for name in args.variants:
            run_dir = Path(tmp) / name
            results[name] = measure(args.config, [*SHORT, *VARIANTS[name], *args.set], run_dir)
            results[name]["kb_up"] = _kb_up(run_dir)
    base = results["baseline"]["client_peak_mem_mb"]
    rows = [
        [
            LABELS[name],
            f"{r['client_peak_mem_mb']:.0f}",
            "-" if name == "baseline" else f"{r['client_peak_mem_mb'] - base:.0f}",
            f"{r['kb_up']:.1f}" if "kb_up" in r else "-",
        ]
        for name, r in results.items()
    ]
    command = command_line(__file__, argv)
    text = "\n".join(
        [
            f"# {cfg.name}: peak memory of one client process (CPU RSS), {cfg.model.name}",
            "",
            f"`{command}`; each client is its own process on a loopback Flower deployment; local steps as "
            f"in the config (batch {cfg.train.batch_size}, max_length {cfg.data.max_length}), one round "
            "of two steps.",
            "",
            markdown_table(["client", "peak RSS (MB)", "above baseline (MB)", "KB up per client"], rows),
        ]
    )
    write_table(args.results_dir / f"memory-{cfg.name}", text, cfg.name, command, results)


def _kb_up(run_dir: Path) -> float:
    from fedtune.report.io import read_metrics

    first = next(r for r in read_metrics(run_dir) if r["round"] > 0)
    return float(first["bytes_up"]) / len(first["clients"]) / 1e3


if __name__ == "__main__":
    main()
