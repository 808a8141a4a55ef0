"""What a FedBiOT client holds, measured: the peak resident memory of real client processes.

Each variant runs one short round of a ``configs/paper/fedbiot-*.yaml`` job on a loopback Flower
deployment (``fedtune run --backend flower``), so every client is its own process (a SuperNode's
warm worker) that never shares memory with the server. The client reports the peak RSS of its
process (``fedtune.train.loop.peak_rss_mb``, Linux's VmHWM) after its local steps;
``client_peak_mem_mb`` in metrics.jsonl is the largest over the round's clients. The run's local
training is the config's own (batch size, sequence length, optimizer, adapter mode); only what does
not touch a client is cut short (one round, two local steps, a few server alignment steps, a tiny
evaluation).

Variants (the rows of ``experiments/fedbiot_table.py``, plus the usual alternative):
- ``fedit``: FedIT, a client holding the whole LLM with LoRA on it (what FedBiOT avoids);
- ``fedot``: Offsite-tuning / FedOT's client (first 2 + last 2 layers + emulator);
- ``fedbiot_a2`` / ``fedbiot_a4`` at dropout 0.2, ``fedbiot_a2`` at 0.5.
The ``baseline`` row is a worker-like process that has imported torch, transformers and fedtune
and holds no model: everything above it is the model, its gradients, optimizer and activations.

    python bench/fedbiot_memory.py configs/paper/fedbiot-math.yaml
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import command_line, config_parser, markdown_table, write_table

SHORT = [
    "fed.rounds=1",
    "train.max_steps=2",
    "data.partition.num_clients=2",
    "fed.clients_per_round=2",
    "eval.before=false",
    "eval.max_examples=2",
    "eval.max_new_tokens=4",
    "fedbiot.init_steps=1",
    "fedbiot.align_steps=1",
    "progress=false",
]
# The client-side settings of the paper table's rows ``fedot``, ``fedbiot_a2`` and ``fedbiot_a4``
# (tests/integration/test_bench_smoke.py checks that they agree with experiments/fedbiot_table.py).
FEDOT = [
    "fedbiot.split=first_last",
    "fedbiot.adapter_layers=4",
    "fedbiot.align_steps=0",
    "fedbiot.prox_eps=0",
    "fedbiot.align_lambda=0",  # the baselines align without FedBiOT's KL term (server side only)
]
ADAPTER2 = ["fedbiot.split=last", "fedbiot.adapter_layers=2"]
ADAPTER4 = ["fedbiot.split=last", "fedbiot.adapter_layers=4"]
VARIANTS: dict[str, list[str]] = {
    "fedit": ["algorithm=fedit", "fedbiot=null", "eval.metrics=[perplexity]"],
    "fedot": [*FEDOT, "fedbiot.dropout=0.2"],
    "fedbiot_a2": [*ADAPTER2, "fedbiot.dropout=0.2"],
    "fedbiot_a4": [*ADAPTER4, "fedbiot.dropout=0.2"],
    "fedbiot_a2_d0.5": [*ADAPTER2, "fedbiot.dropout=0.5"],
}
LABELS = {
    "baseline": "process with torch + transformers + fedtune imported, no model",
    "fedit": "FedIT: the whole LLM + LoRA",
    "fedot": "Offsite-tuning / FedOT: first 2 + last 2, emulator d=0.2",
    "fedbiot_a2": "FedBiOT adapter 2, emulator d=0.2",
    "fedbiot_a4": "FedBiOT adapter 4, emulator d=0.2",
    "fedbiot_a2_d0.5": "FedBiOT adapter 2, emulator d=0.5",
}


def baseline_mb() -> float:
    code = (
        "import torch, transformers, fedtune.flower.worker, fedtune.algorithms;"
        "from fedtune.train.loop import peak_rss_mb; print(peak_rss_mb())"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return float(out.stdout.strip().splitlines()[-1])


def measure(config: Path, overrides: list[str], run_dir: Path) -> dict[str, Any]:
    from fedtune.report.io import read_metrics

    command = [sys.executable, "-m", "fedtune", "run", str(config), "--backend", "flower"]
    command += [*overrides, "-o", str(run_dir)]
    print(" ".join(command), flush=True)
    subprocess.run(command, check=True)
    trained = [r for r in read_metrics(run_dir) if r["round"] > 0]
    if not trained or "client_peak_mem_mb" not in trained[-1]:
        raise RuntimeError(f"{run_dir}/metrics.jsonl has no client_peak_mem_mb")
    out: dict[str, Any] = {
        "client_peak_mem_mb": max(float(r["client_peak_mem_mb"]) for r in trained),
        "mb_down": trained[0]["bytes_down"] / 2**20 / len(trained[0]["clients"]),
    }
    info = run_dir / "artifacts" / "fedbiot.json"
    if info.is_file():
        out["params"] = json.loads(info.read_text()).get("params", {})
    return out


def main(argv: list[str] | None = None) -> None:
    parser = config_parser(__doc__)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    args = parser.parse_args(argv)
    from fedtune.config import load_config

    cfg = load_config(args.config, args.set)
    results: dict[str, dict[str, Any]] = {"baseline": {"client_peak_mem_mb": baseline_mb()}}
    with tempfile.TemporaryDirectory(prefix="fedbiot-memory-") as tmp:
        for name in args.variants:
            results[name] = measure(args.config, [*SHORT, *VARIANTS[name], *args.set], Path(tmp) / name)
    base = results["baseline"]["client_peak_mem_mb"]
    rows = []
    for name, r in results.items():
        params = r.get("params", {})
        rows.append(
            [
                LABELS[name],
                f"{r['client_peak_mem_mb']:.0f}",
                "-" if name == "baseline" else f"{r['client_peak_mem_mb'] - base:.0f}",
                f"{params['client_params'] / 1e6:.1f}" if "client_params" in params else "-",
                f"{r['mb_down']:.0f}" if "mb_down" in r else "-",
            ]
        )
    command = command_line(__file__, argv)
    text = "\n".join(
        [
            f"# {cfg.name}: peak memory of one client process (CPU RSS), {cfg.model.name}",
            "",
            f"`{command}`; each client is its own process on a loopback Flower deployment; local "
            f"training as in the config (batch {cfg.train.batch_size}, max_length "
            f"{cfg.data.max_length}, {cfg.train.optimizer}), one round of two steps.",
            "",
            markdown_table(
                ["client", "peak RSS (MB)", "above baseline (MB)", "params held (M)", "MB received, round 1"],
                rows,
            ),
        ]
    )
    write_table(args.results_dir / f"memory-{cfg.name}", text, cfg.name, command, results)


if __name__ == "__main__":
    main()
