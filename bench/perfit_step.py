"""P10: PerFIT's masked LoRA step vs dense LoRA steps, and the one-off mask search vs a local epoch.

Side by side in one process, the variants alternating within every repeat, on the same batches:
- ``dense_r``: a dense LoRA of the budget rank r (FIT's step), on q/k/v;
- ``dense_re``: a dense LoRA of the expanded rank r_e = r / (1 - s);
- ``masked_re``: the rank-r_e LoRA trained through gradient masks that keep exactly the rank-r
  count (PerFIT's step: ``train_local(..., grad_masks=...)``).
Each run: AdamW, one warm-up step, then ``--timed-steps`` timed steps; medians over repeats.
Target (bench/ids.py): masked_re <= 1.15 x dense_r. The search (T_p steps of ``--search-batches``
batches, gradients only) is timed against one local epoch of the same client's data.

    python bench/perfit_step.py              # SmolLM2-135M-Instruct, batch 8 x 96 tokens
    python bench/perfit_step.py --smoke      # tiny random model, seconds
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import base_parser, markdown_table, median, parse, write_results

VARIANTS = ("dense_r", "dense_re", "masked_re")
TARGETS = ["q_proj", "k_proj", "v_proj"]


def _batches(tokenizer: Any, count: int, batch_size: int, max_length: int) -> list[Any]:
    from fedtune.data.builtin import load_builtin
    from fedtune.data.tokenize import encode_records, make_batches

    records = load_builtin("wordnet-instruct", "train")[: count * batch_size]
    examples = encode_records(records, tokenizer, "alpaca", max_length)
    return make_batches(examples, batch_size, int(tokenizer.pad_token_id or 0), seed=0)


def _model(name: str, rank: int) -> tuple[Any, Any]:
    from fedtune.models.loading import load_causal_lm
    from fedtune.models.lora import attach_lora

    model, tokenizer = load_causal_lm(name, dtype="fp32", device="cpu", seed=0)
    return attach_lora(model, r=rank, alpha=rank, dropout=0.0, target_modules=TARGETS), tokenizer


def _random_masks(model: Any, rank: int, seed: int) -> dict[str, Any]:
    """Masks keeping exactly the rank-``rank`` count, drawn at random (timing does not depend on which)."""
    import numpy as np
    import torch

    from fedtune.algorithms.perfit import kept_count, top_entries
    from fedtune.models.lora import adapter_parameters

    params = adapter_parameters(model)
    shapes = {k: tuple(p.shape) for k, p in params.items()}
    rng = np.random.default_rng(seed)
    scores = {k: rng.random(s) for k, s in shapes.items()}
    masks = top_entries(scores, {k: np.ones(s, bool) for k, s in shapes.items()}, kept_count(shapes, rank))
    names = {id(p): n for n, p in model.named_parameters()}
    return {names[id(params[k])]: torch.from_numpy(m) for k, m in masks.items()}


def time_steps(model: Any, batches: Sequence[Any], masks: Any, timed_steps: int) -> float:
    """Median seconds per optimizer step after one warm-up step."""
    from fedtune.train.loop import train_local
    from fedtune.train.optim import build_optimizer

    optimizer = build_optimizer(model.parameters(), "adamw", lr=1e-4)
    train_local(model, batches[:1], optimizer, None, steps=1, grad_masks=masks)
    seconds = []
    for step in range(timed_steps):
        start = time.perf_counter()
        train_local(model, [batches[(step + 1) % len(batches)]], optimizer, None, steps=1, grad_masks=masks)
        seconds.append(time.perf_counter() - start)
    return median(seconds)


def time_search(model: Any, batches: Sequence[Any], steps: int, per_step: int) -> float:
    """Seconds of T_p search steps (gradients of ``per_step`` batches each) on the expanded LoRA."""
    import numpy as np

    from fedtune.algorithms.perfit import local_gradients
    from fedtune.models.lora import adapter_parameters

    weights = {k: p.detach().numpy().copy() for k, p in adapter_parameters(model).items()}
    start = time.perf_counter()
    for step in range(steps):
        chosen = [batches[(step * per_step + i) % len(batches)] for i in range(per_step)]
        local_gradients(model, {k: np.asarray(w) for k, w in weights.items()}, chosen)
    return time.perf_counter() - start


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = base_parser(__doc__.splitlines()[0] if __doc__ else "P10", model=True)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--sparsity", type=float, default=0.5)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-length", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=None, help="default 3 (1 with --smoke)")
    parser.add_argument("--timed-steps", type=int, default=None, help="default 4 (2 with --smoke)")
    parser.add_argument("--search-steps", type=int, default=5)
    parser.add_argument("--search-batches", type=int, default=2)
    parser.add_argument("--epoch-batches", type=int, default=4, help="a client's local epoch, in batches")
    args, began = parse(parser, argv)
    from fedtune.algorithms.perfit import expanded_rank

    repeats = args.repeats or (1 if args.smoke else 3)
    timed = args.timed_steps or (2 if args.smoke else 4)
    rank_e = expanded_rank(args.rank, args.sparsity)
    models = {"dense_r": _model(args.model, args.rank), "dense_re": _model(args.model, rank_e)}
    models["masked_re"] = models["dense_re"]
    batches = _batches(
        models["dense_r"][1], max(timed + 1, args.epoch_batches), args.batch_size, args.max_length
    )
    masks = _random_masks(models["masked_re"][0], args.rank, args.seed)
    seconds: dict[str, list[float]] = {v: [] for v in VARIANTS}
    search, epoch = [], []
    for repeat in range(repeats):
        for variant in VARIANTS:
            model = models[variant][0]
            seconds[variant].append(
                time_steps(model, batches, masks if variant == "masked_re" else None, timed)
            )
            print(f"repeat {repeat} {variant:>10}: {seconds[variant][-1]:.3f} s/step", flush=True)
        search.append(time_search(models["dense_re"][0], batches, args.search_steps, args.search_batches))
        epoch.append(median(seconds["dense_r"][-1:]) * args.epoch_batches)
    step = {v: median(s) for v, s in seconds.items()}
    ratios = {v: step[v] / step["dense_r"] for v in VARIANTS}
    search_ratio = median(search) / median(epoch)
    rows = [[v, f"{step[v]:.3f}", f"{ratios[v]:.2f}x"] for v in VARIANTS]
    markdown = "\n".join(
        [
            f"P10 PerFIT masked LoRA step, {args.model} fp32 CPU, {args.threads} thread(s), batch "
            f"{args.batch_size} x <= {args.max_length} tokens, r = {args.rank}, r_e = {rank_e}, "
            f"{repeats} repeats x {timed} timed steps (medians)",
            "",
            markdown_table(["variant", "s/step", "vs dense rank r"], rows),
            "",
            f"Mask search ({args.search_steps} steps x {args.search_batches} batches): "
            f"{median(search):.2f} s = {search_ratio:.2f} x one local epoch of {args.epoch_batches} batches "
            f"(target <= 1.15x per step, search <= 1 epoch).",
        ]
    )
    print(markdown)
    results = {
        "model": args.model,
        "config": vars(args) | {"results_dir": str(args.results_dir), "rank_e": rank_e},
        "seconds_per_step": seconds,
        "median_seconds_per_step": step,
        "ratio_to_dense_r": ratios,
        "search_seconds": search,
        "epoch_seconds": epoch,
        "search_over_epoch": search_ratio,
    }
    write_results("p10", results, markdown, args, began)
    return results


if __name__ == "__main__":
    main()
