"""How much layer-level distillation a FedPFT sub-model needs: error against the full model vs steps.

The sub-model is built as FedPFT builds it (``fedpft.keep_ratio`` of every FFN's most salient
neurons, ``fedpft.keep_layers`` whole) from the config's model; then eq. 13's distillation
(``fedtune.train.ffn_distill.distill_ffns``, ``fedpft.hidden_loss``, mu = ``fedpft.mu``) runs on
the public texts of the config's dataset, for each learning rate from scratch. After each checkpoint
of steps it reports, on held-out texts of the same set, the relative error of the final hidden state
where the classification head reads it (a decoder's last real token, an encoder's first) --
``|h_sub - h_full| / |h_full|`` averaged over texts (1.0: no closer than a zero vector), and the
distillation's loss.

The schedule (``fedpft.distill_schedule``, ``fedpft.distill_warmup_ratio``) and the compressed layers'
output norms (``fedpft.distill_norms``) are the config's, as the server runs them. With a constant
schedule the checkpoints are points along one distillation; with a cosine schedule or warmup each
checkpoint is a distillation of its own from the compressed model (its schedule spans its steps).
``--corpus`` distils on other texts than the config's dataset: built-in datasets' public splits
(``all``: every built-in dataset's); the held-out texts stay the config dataset's.

    python bench/fedpft_distill.py configs/paper/fedpft-smollm2.yaml --lrs 1e-4 1e-3 --steps 20 50
    python bench/fedpft_distill.py configs/paper/fedpft-minilm.yaml --lrs 1e-4 --steps 100
    python bench/fedpft_distill.py configs/paper/fedpft-minilm.yaml --corpus all --steps 300 1000 \
        --set fedpft.hidden_loss=layer_relative --set fedpft.distill_schedule=cosine \
        --set fedpft.distill_norms=true
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
    return [_text(r) for r in records]


def _text(record: Any) -> str:
    return " ".join(part for part in (record.instruction, record.input) if part)


def corpus_texts(names: list[str], seed: int = 0) -> list[str]:
    """The public splits of the built-in datasets ``names`` (``all``: every one), shuffled together."""
    import random

    from fedtune.data.builtin import ALL_PUBLIC, load_all_public, load_builtin

    records = (
        load_all_public() if names == [ALL_PUBLIC] else [r for n in names for r in load_builtin(n, "public")]
    )
    pool = [_text(r) for r in records]
    random.Random(seed).shuffle(pool)
    return pool


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
    parser.add_argument(
        "--corpus",
        nargs="+",
        default=None,
        help="built-in datasets whose public splits are distilled on ('all': every one); "
        "default: the config's dataset",
    )
    parser.add_argument("--tag", default="", help="names the result files distill-<config name>-<tag>")
    args = parser.parse_args(argv)
    if args.steps != sorted(set(args.steps)) or args.steps[0] < 1:
        parser.error(f"--steps must be increasing positive checkpoints, got {args.steps}")
    from fedtune.algorithms.fedpft.wire import output_norm_parameters
    from fedtune.config import load_config
    from fedtune.models.ffn import build_submodel, ffn_widths, select_neurons
    from fedtune.train.ffn_distill import distill_ffns

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = load_config(args.config, args.set)
    section: Any = cfg.section("fedpft")
    model, tokenizer = backbone(cfg)
    pool = texts(cfg)
    train_pool = corpus_texts(args.corpus) if args.corpus else pool
    source = "+".join(args.corpus) + " (public splits)" if args.corpus else cfg.data.dataset
    if (
        len(pool) < args.held_out
        or len(train_pool) < args.public
        or (not args.corpus and len(pool) < args.public + args.held_out)
    ):
        raise SystemExit(f"{source}: too few texts for --public {args.public} and --held-out {args.held_out}")
    size, length = section.distill_batch_size, cfg.data.max_length
    public = [encode(tokenizer, train_pool[i : i + size], length) for i in range(0, args.public, size)]
    held = encode(tokenizer, pool[-args.held_out :], length)
    full = read_hidden(model, held)
    kept = select_neurons(model, section.keep_ratio, section.keep_layers)
    widths = ffn_widths(model)
    compressed = [layer for layer, idx in kept.items() if len(idx) < widths[layer]]
    restart = section.distill_schedule != "constant" or section.distill_warmup_ratio > 0

    def error(sub: Any) -> float:
        return float(((read_hidden(sub, held) - full).norm(dim=-1) / full.norm(dim=-1)).mean())

    results: dict[str, Any] = {"start": error(build_submodel(copy.deepcopy(model), kept)), "curves": {}}
    for lr in args.lrs:
        sub = build_submodel(copy.deepcopy(model), kept)
        curve, done, seconds = [], 0, 0.0
        for steps in args.steps:
            if restart:  # a schedule spans its own steps: distil from the compressed model again
                sub, done, seconds = build_submodel(copy.deepcopy(model), kept), 0, 0.0
            start = time.perf_counter()
            stats = distill_ffns(
                model,
                sub,
                public,
                steps=steps - done,
                lr=lr,
                mu=section.mu,
                hidden_loss=section.hidden_loss,
                schedule=section.distill_schedule,
                warmup_ratio=section.distill_warmup_ratio,
                extra_params=output_norm_parameters(sub, compressed) if section.distill_norms else None,
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
            f"{section.hidden_loss} hidden-state loss, {section.distill_schedule} schedule "
            f"(warmup {section.distill_warmup_ratio:g}), output norms "
            f"{'trained' if section.distill_norms else 'frozen'}, batches of {size} x <= {length} tokens "
            f"over {args.public} texts of {source}, {args.threads} thread(s); "
            + ("each row a distillation of its own." if restart else "rows are points along one run."),
            "",
            "Error: relative error of the final hidden state where the head reads it against the full "
            f"model's, mean over {args.held_out} held-out texts (1.0 = unrelated).",
            "",
            markdown_table(["steps", "lr", "error", "last loss", "seconds"], rows),
        ]
    )
    stem = f"distill-{cfg.name}" + (f"-{args.tag}" if args.tag else "")
    write_table(args.results_dir / stem, text, cfg.name, command, results)


if __name__ == "__main__":
    main()
