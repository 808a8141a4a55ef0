"""FedPT's client memory, beside its table: the peak RSS of one client training its model, each in a fresh
process (``python experiments/fedpt_memory.py CONFIG MODEL [--set KEY=VALUE ...]`` prints it as JSON).

The process loads the model, attaches the run's LoRA, trains 3 steps at batch 1 (the paper's "VRAM to
train one sample") on real client examples, and reads the peak RSS (``VmHWM``,
`fedtune.train.loop.peak_rss_mb`); the process's RSS before loading the model is reported too.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import setup_torch


def measure_client(model: str, config: Path, extra: list[str]) -> dict[str, float]:
    """Peak RSS of one client training ``model`` (`client_memory_probe` in a subprocess of its own)."""
    command = [
        sys.executable,
        __file__,
        str(config),
        model,
        *[part for item in extra for part in ("--set", item)],
    ]
    output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    result: dict[str, float] = json.loads(output.strip().splitlines()[-1])
    return result


def client_memory_probe(model_name: str, config: Path, extra: list[str]) -> dict[str, float]:
    setup_torch(2)
    from fedtune.config import load_config
    from fedtune.data.tokenize import encode_records, make_batches
    from fedtune.models.loading import load_causal_lm
    from fedtune.models.lora import attach_lora
    from fedtune.rundata import prepare_data
    from fedtune.train.loop import peak_rss_mb, train_local
    from fedtune.train.optim import build_optimizer

    cfg = load_config(config, extra)
    records = next(iter(prepare_data(cfg).clients.values()))[:8]
    before = peak_rss_mb()
    model, tokenizer = load_causal_lm(model_name, dtype=cfg.model.dtype, seed=cfg.seed)
    lora = cfg.lora
    targets = None if lora.target_modules == "auto" else lora.target_modules
    model = attach_lora(model, r=lora.r, alpha=lora.alpha, dropout=lora.dropout, target_modules=targets)
    examples = encode_records(records, tokenizer, cfg.data.template, cfg.data.max_length)
    pad = int(tokenizer.pad_token_id or 0)
    batches = make_batches(examples, 1, pad, seed=0, bucketing=False)
    optimizer = build_optimizer(model.parameters(), cfg.train.optimizer, lr=cfg.train.lr)
    train_local(model, batches, optimizer, None, steps=3)
    return {
        "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
        "trainable_m": sum(p.numel() for p in model.parameters() if p.requires_grad) / 1e6,
        "rss_before_model_mb": before,
        "peak_rss_mb": peak_rss_mb(),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", type=Path)
    parser.add_argument("model")
    parser.add_argument("--set", action="append", default=[], help="a config override")
    args = parser.parse_args(argv)
    print(json.dumps(client_memory_probe(args.model, args.config, args.set)))


if __name__ == "__main__":
    main()
