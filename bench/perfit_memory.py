"""PerFIT at the paper's scale of 100 clients: the memory of 100 personal sparse adapters, measured.

One round in which all ``--clients`` clients are sampled, so that every client searches its mask and
trains once and then holds its personal state (packed mask + masked values, ``ClientContext.state``)
in the in-process simulation, next to the server's copy of every mask. Each variant is its own
``python -m fedtune run`` process; ``peak_rss_mb`` in its metrics.jsonl is that process's peak RSS.

- ``fit``: FIT (FedIT at rank r), the same round with no personal state: the reference;
- ``perfit``: PerFIT s = 0.5 (r_e = 16), the config's search and training.

Only what does not change what is held is cut short: one search step of one batch, one local step,
batch 2 of at most 48 tokens, a perplexity-only evaluation at the end. The budget is P4's
(``bench/README.md``): the reference's RSS + clients x a dense rank-r_e adapter + 1 GB; the
table also gives the state that each client holds, read from the run's checkpoint.

    python bench/perfit_memory.py configs/paper/perfit-smollm2.yaml            # 100 clients
    python bench/perfit_memory.py configs/paper/perfit-smollm2.yaml --clients 10
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import command_line, config_parser, markdown_table, write_table

SHORT = [
    "fed.rounds=1",
    "train.max_steps=1",
    "train.batch_size=2",
    "data.max_length=48",
    "eval.before=false",
    "eval.metrics=[perplexity]",
    "progress=false",
]
# The paper table's rows ``fit`` and ``perfit_s0.5`` (tests/integration/test_bench_smoke.py checks that
# they agree with experiments/perfit_table.py), PerFIT's search cut to one step of one batch.
VARIANTS: dict[str, list[str]] = {
    "fit": ["algorithm=fedit", "perfit=null"],
    "perfit": ["perfit.sparsity=0.5", "perfit.search_steps=1", "perfit.search_batches=1"],
}
LABELS = {
    "fit": "FIT (FedIT, rank r): no personal state",
    "perfit": "PerFIT s = 0.5: personal sparse adapters",
}


def state_bytes(run_dir: Path) -> dict[str, float]:
    """Bytes each client holds (its ``ClientContext.state``) and the server's masks, from the checkpoint."""
    from fedtune.fl.checkpoint import latest_checkpoint, load_checkpoint

    path = latest_checkpoint(run_dir)
    if path is None:
        raise RuntimeError(f"{run_dir} has no checkpoint")
    saved = load_checkpoint(path)

    def nbytes(tree: Any) -> int:
        if isinstance(tree, dict):
            return sum(nbytes(v) for v in tree.values())
        if isinstance(tree, (list, tuple)):
            return sum(nbytes(v) for v in tree)
        return int(tree.nbytes) if isinstance(tree, np.ndarray) else 0

    clients = saved["federation"]["clients"]
    per_client = [nbytes(state) for state in clients.values()]
    return {
        "clients_holding": sum(b > 0 for b in per_client),
        "client_state_mb": float(np.mean(per_client)) / 2**20 if per_client else 0.0,
        "server_state_mb": nbytes(saved["algorithm"]) / 2**20,
    }


def measure(config: Path, overrides: list[str], run_dir: Path) -> dict[str, Any]:
    from fedtune.report.io import read_metrics

    command = [sys.executable, "-m", "fedtune", "run", str(config), *overrides, "-o", str(run_dir)]
    print(" ".join(command), flush=True)
    subprocess.run(command, check=True)
    trained = [r for r in read_metrics(run_dir) if r["round"] > 0]
    if not trained or "peak_rss_mb" not in trained[-1]:
        raise RuntimeError(f"{run_dir}/metrics.jsonl has no peak_rss_mb")
    return {
        "peak_rss_mb": max(float(r["peak_rss_mb"]) for r in trained),
        "clients_trained": len(trained[0]["clients"]),
        "round_seconds": float(trained[0]["round_seconds"]),
        **state_bytes(run_dir),
    }


def dense_adapter_mb(cfg: Any) -> float:
    """A dense LoRA of the expanded rank r_e on the config's modules, fp32."""
    from fedtune.algorithms.perfit import PerFIT
    from fedtune.resources import Resources

    shapes = PerFIT(cfg).module_shapes(Resources(cfg))
    return sum(int(np.prod(s)) for s in shapes.values()) * 4 / 2**20


def main(argv: list[str] | None = None) -> None:
    parser = config_parser(__doc__)
    parser.add_argument("--clients", type=int, default=100)
    args = parser.parse_args(argv)
    from fedtune.config import load_config

    scale = [f"data.partition.num_clients={args.clients}", f"fed.clients_per_round={args.clients}"]
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="perfit-memory-") as tmp:
        for name, variant in VARIANTS.items():
            overrides = [*SHORT, *scale, *variant, *args.set]
            results[name] = measure(args.config, overrides, Path(tmp) / name)
    cfg = load_config(args.config, [*scale, *VARIANTS["perfit"], *args.set])
    dense = dense_adapter_mb(cfg)
    budget = results["fit"]["peak_rss_mb"] + args.clients * dense + 1024
    held = results["perfit"]["peak_rss_mb"] - results["fit"]["peak_rss_mb"]
    results["budget"] = {"dense_adapter_mb": dense, "budget_mb": budget, "perfit_above_fit_mb": held}
    rows = [
        [
            LABELS[name],
            f"{r['peak_rss_mb']:.0f}",
            f"{r['clients_holding']}",
            f"{r['client_state_mb']:.2f}",
            f"{r['server_state_mb']:.1f}",
            f"{r['round_seconds']:.0f}",
        ]
        for name, r in results.items()
        if name in VARIANTS
    ]
    command = command_line(__file__, argv)
    verdict = "met" if results["perfit"]["peak_rss_mb"] <= budget else "NOT met"
    text = "\n".join(
        [
            f"# {cfg.name}: {args.clients} clients in one in-process simulation, peak RSS, {cfg.model.name}",
            "",
            f"`{command}`; one round with every client sampled (each searches once and trains one step "
            "at batch 2 x 48 tokens), so every client ends the round holding its personal state.",
            "",
            markdown_table(
                [
                    "variant",
                    "peak RSS (MB)",
                    "clients holding state",
                    "state per client (MB)",
                    "server state (MB)",
                    "round (s)",
                ],
                rows,
            ),
            "",
            f"- PerFIT's peak above FIT's: {held:.1f} MB for {args.clients} clients "
            f"({held / args.clients:.2f} MB each; the state each holds: "
            f"{results['perfit']['client_state_mb']:.2f} MB).",
            f"- P4 budget, FIT's RSS + {args.clients} x a dense adapter of the expanded rank "
            f"({dense:.2f} MB) + 1 GB = {budget:.0f} MB: **{verdict}** "
            f"({results['perfit']['peak_rss_mb']:.0f} MB).",
        ]
    )
    write_table(args.results_dir / f"memory-{cfg.name}", text, cfg.name, command, results)


if __name__ == "__main__":
    main()
