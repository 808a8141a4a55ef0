"""How much layer-level distillation a FedPFT sub-model needs: error against the full model vs steps.

The sub-model is built as FedPFT builds it (``fedpft.keep_ratio`` of every FFN's most salient
neurons, ``fedpft.keep_layers`` whole) from the config's model; then eq. 13's distillation
(``fedtune.models.ffn_distill.distill_ffns``, ``fedpft.hidden_loss``, mu = ``fedpft.mu``) runs on
the public texts of the config's dataset, for each learning rate from scratch. After each checkpoint
of steps it reports, on held-out texts of the same set, the relative error of the final hidden state
where the classification head reads it (a decoder's last real token, an encoder's first) --
``|h_sub - h_full| / |h_full|`` averaged over texts (1.0: no closer than a zero vector), and the
distillation's loss.

    python bench/fedpft_distill.py configs/paper/fedpft-smollm2.yaml --lrs 1e-4 1e-3 --steps 20 50
    python bench/fedpft_distill.py configs/paper/fedpft-minilm.yaml --lrs 1e-4 --steps 100
"""

from __future__ import annotations

import copy
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import command_line, config_parser, markdown_table, write_table


def backbone(cfg: Any) -> tuple[Any, Any]:
    """The model as FedPFT loads it (a sequence classifier; the head is not used here), padded right."""
    from fedtune.models.loading import load_encoder_classifier

    return load_encoder_classifier(cfg.model.name, 2, dtype="fp32", device="cpu", padding_side="right")


def texts(cfg: Any) -> list[str]:
    from fedtune.data.loaders import load_dataset_records

    records = load_dataset_records(cfg.fedpft.public_dataset or cfg.data.dataset, "train")
    return [" ".join(part for part in (r.instruction, r.input) if part) for r in records]


def encode(tokenizer: Any, batch: list[str], max_length: int) -> dict[str, torch.Tensor]:
    out = tokenizer(batch, return_tensors="pt", padding=True, truncation=True, max_length=max_length)
    return {"input_ids": out["input_ids"], "attention_mask": out["attention_mask"]}


def read_hidden(model: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The final hidden state where the classification head reads it: an encoder's first token
    ([CLS]), a decoder's last real token (right padding)."""
    from fedtune.models.loading import ENCODER_MODEL_TYPES

    with torch.no_grad():
        hidden = model(**batch, output_hidden_states=True).hidden_states[-1]
    if model.config.model_type in ENCODER_MODEL_TYPES:
        return hidden[:, 0]
    last = batch["attention_mask"].sum(1) - 1
    return hidden[torch.arange(hidden.shape[0]), last]


def main(argv: list[str] | None = None) -> None:
    parser = config_parser(__doc__)
    parser.add_argument("--lrs", nargs="+", type=float, default=[1e-4, 1e-3])
    parser.add_argument("--steps", nargs="+", type=int, default=[20, 50], help="checkpoints, increasing")
    parser.add_argument("--public", type=int, default=128, help="public texts the distillation cycles over")
    parser.add_argument("--held-out", type=int, default=64, help="held-out texts the error is measured on")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    if args.steps != sorted(set(args.steps)) or args.steps[0] < 1:
        parser.error(f"--steps must be increasing positive checkpoints, got {args.steps}")
    from fedtune.config import load_config
    from fedtune.models.ffn import build_submodel, select_neurons
    from fedtune.models.ffn_distill import distill_ffns

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = load_config(args.config, args.set)
    section: Any = cfg.section("fedpft")
    model, tokenizer = backbone(cfg)
    pool = texts(cfg)
    if len(pool) < args.public + args.held_out:
        raise SystemExit(f"{cfg.data.dataset}: {len(pool)} texts, fewer than --public + --held-out")
    size, length = section.distill_batch_size, cfg.data.max_length
    public = [encode(tokenizer, pool[i : i + size], length) for i in range(0, args.public, size)]
    held = encode(tokenizer, pool[-args.held_out :], length)
    full = read_hidden(model, held)
    kept = select_neurons(model, section.keep_ratio, section.keep_layers)

    def error(sub: Any) -> float:
        return float(((read_hidden(sub, held) - full).norm(dim=-1) / full.norm(dim=-1)).mean())

    results: dict[str, Any] = {"start": error(build_submodel(copy.deepcopy(model), kept)), "curves": {}}
    for lr in args.lrs:
        sub = build_submodel(copy.deepcopy(model), kept)
        curve, done, seconds = [], 0, 0.0
        for steps in args.steps:
            start = time.perf_counter()
            stats = distill_ffns(
                model,
                sub,
                public,
                steps=steps - done,
                lr=lr,
                mu=section.mu,
                hidden_loss=section.hidden_loss,
            )
            seconds += time.perf_counter() - start
            done = steps
            curve.append({"steps": steps, "error": error(sub), "loss": stats.last_loss, "seconds": seconds})
            print(f"lr {lr:g}, {steps} steps: error {curve[-1]['error']:.3f}", flush=True)
        results["curves"][f"{lr:g}"] = curve
    rows = [["0 (no distillation)", "-", f"{results['start']:.3f}", "-", "-"]]
    for lr, curve in results["curves"].items():
        rows += [
            [str(p["steps"]), lr, f"{p['error']:.3f}", f"{p['loss']:.3g}", f"{p['seconds']:.0f}"]
            for p in curve
        ]
    command = command_line(__file__, argv)
    text = "\n".join(
        [
            f"# {cfg.name}: layer-level distillation of the FedPFT sub-model ({cfg.model.name})",
            "",
            f"`{command}`; FFNs at keep ratio {section.keep_ratio} (layers {section.keep_layers} whole), "
            f"{section.hidden_loss} hidden-state loss, batches of {size} x <= {length} tokens over "
            f"{args.public} public texts of {cfg.data.dataset}, {args.threads} thread(s).",
            "",
            "Error: relative error of the final hidden state where the head reads it against the full "
            f"model's, mean over {args.held_out} held-out texts (1.0 = unrelated).",
            "",
            markdown_table(["steps", "lr", "error", "last loss", "seconds"], rows),
        ]
    )
    write_table(args.results_dir / f"distill-{cfg.name}", text, cfg.name, command, results)


if __name__ == "__main__":
    main()
