"""What a FedMKT client holds, measured: the peak resident memory of real client processes.

Each variant runs one short round of a ``configs/paper/fedmkt-*.yaml`` job on a loopback Flower
deployment (``fedtune run --backend flower``) with a single client, so the client is its own process
(a SuperNode's warm worker) that never shares memory with the server's LLM. It reports the peak RSS
of its process (``fedtune.train.loop.peak_rss_mb``, Linux's VmHWM) after its round: local SFT on its
private data, its losses and top-k logits on the public set, then the alignment of the LLM's
knowledge and the distillation on it. The local training is the config's own (batch size, sequence
length, optimizer); only what does not change a client's footprint is cut short (two local steps, 8
public examples, a tiny evaluation). In the simulation, which the paper table runs, one process
holds the LLM and every SLM, so its ``client_peak_mem_mb`` is that process's, not a client's.

Variants: ``slm:<name>``, a FedMKT client holding SLM ``<name>`` (default: each of the config's
``fedmkt.clients``); ``fedit``, a FedIT client holding the whole LLM with LoRA (what FedMKT spares its
clients). The ``baseline`` row is a worker-like process with torch, transformers and fedtune imported
and no model.

    python bench/fedmkt_memory.py configs/paper/fedmkt-wic.yaml
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
    "data.partition.num_clients=1",
    "fed.clients_per_round=1",
    "eval.before=false",
    "eval.max_examples=2",
    "fedmkt.public_examples=8",
    "fedmkt.llm_train.max_steps=2",
    "progress=false",
]


def variants(cfg: Any, chosen: list[str] | None) -> dict[str, list[str]]:
    everything = {f"slm:{name}": [f"fedmkt.clients=[{name}]"] for name in dict.fromkeys(cfg.fedmkt.clients)}
    everything["fedit"] = ["algorithm=fedit", "fedmkt=null", "eval.personal=false"]
    unknown = sorted(set(chosen or []) - set(everything))
    if unknown:
        raise SystemExit(f"unknown variant(s) {', '.join(unknown)}; choose from {', '.join(everything)}")
    return {name: everything[name] for name in (chosen or everything)}


def main(argv: list[str] | None = None) -> None:
    parser = config_parser(__doc__)
    parser.add_argument("--variants", nargs="+", default=None, help="slm:<name> ... fedit (default: all)")
    args = parser.parse_args(argv)
    from fedtune.config import load_config

    cfg = load_config(args.config, args.set)
    chosen = variants(cfg, args.variants)  # an unknown one is refused before minutes of measuring
    results: dict[str, dict[str, Any]] = {"baseline": {"client_peak_mem_mb": baseline_mb()}}
    with tempfile.TemporaryDirectory(prefix="fedmkt-memory-") as tmp:
        for name, overrides in chosen.items():
            run_dir = Path(tmp) / name.replace(":", "-")
            results[name] = measure(args.config, [*SHORT, *overrides, *args.set], run_dir)
    base = results["baseline"]["client_peak_mem_mb"]
    rows = []
    for name, r in results.items():
        label = {
            "baseline": "process with torch + transformers + fedtune imported, no model",
            "fedit": f"FedIT: the whole LLM ({cfg.model.name}) + LoRA",
        }.get(name, f"FedMKT: {name.removeprefix('slm:')} + LoRA")
        above = "-" if name == "baseline" else f"{r['client_peak_mem_mb'] - base:.0f}"
        rows.append([label, f"{r['client_peak_mem_mb']:.0f}", above])
    command = command_line(__file__, argv)
    text = "\n".join(
        [
            f"# {cfg.name}: peak memory of one client process (CPU RSS)",
            "",
            f"`{command}`; the client is its own process on a loopback Flower deployment; local training "
            f"as in the config (batch {cfg.train.batch_size}, max_length {cfg.data.max_length}, "
            f"{cfg.train.optimizer}), one round of two local steps, 8 public examples.",
            "",
            markdown_table(["client", "peak RSS (MB)", "above baseline (MB)"], rows),
        ]
    )
    write_table(args.results_dir / f"memory-{cfg.name}", text, cfg.name, command, results)


if __name__ == "__main__":
    main()
