"""P9: the model FLOPs utilisation (MFU) of a LoRA training step on a ~1B Llama in bf16 on CUDA.

A random-init Llama (hidden 2048, 16 layers, 32 heads, intermediate 5632, vocab 32000: 0.95B
parameters, printed) with LoRA of rank ``--rank`` on every linear layer of the decoder, trained with
AdamW on random tokens (``--batch-size`` x ``--seq-len``, no padding), the forward under bf16
autocast, SDPA attention. ``--warmup`` steps untimed, then ``--steps`` timed one by one (CUDA
synchronised); the median step gives tokens/s.

FLOPs per token, two counts (``N`` = the parameters that take part in matrix multiplies: every
linear layer of the decoder and the LM head, not the input embedding, which is a lookup; ``L`` layers
of width ``d``; ``s`` the sequence length):

- **model FLOPs** (what MFU is computed from, the target): ``6 N + 12 L d s``, PaLM's count (appendix
  B of Chowdhery et al. 2022): 2N forward + 4N backward per token for the weights, and the attention
  scores and weighted sum (forward 4 L d s, backward twice that, causal mask ignored). It counts the
  frozen base as if it were trained, as published MFU figures of LoRA/QLoRA runs do, so the number
  compares with theirs;
- **executed FLOPs**, reported alongside: ``4 N + 6 N_lora + 12 L d s``: a frozen weight needs its
  forward (2N) and the gradient to its input (2N), not its own gradient (the 2N the first count
  adds); the LoRA matrices are trained in full. MFU from this count is the share of the card the step
  actually keeps busy with useful work, about 2/3 of the first figure.

MFU = achieved FLOP/s / the card's peak dense bf16 FLOP/s: a table of known cards (``PEAK_TFLOPS``:
the vendors' dense, no-sparsity figures) or ``--peak-tflops``. Target (bench/ids.py): >= 40% MFU.

    python bench/lora_mfu.py                      # CUDA, the ~1B model
    python bench/lora_mfu.py --peak-tflops 756    # a card outside the table (e.g. H100 PCIe)
    python bench/lora_mfu.py --smoke              # tiny width on the CPU, seconds (CI): MFU only
                                                  # with --peak-tflops, the code path otherwise
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import base_parser, markdown_table, median, parse, write_results

# Peak dense (no 2:4 sparsity) bf16 tensor-core TFLOP/s, from the vendors' data sheets. The keys are
# matched as whole words against torch.cuda.get_device_name(): "L4" does not match "L40S".
PEAK_TFLOPS: dict[str, float] = {
    "H200": 989.0,  # SXM
    "H100": 989.0,  # SXM (PCIe: 756, pass --peak-tflops 756)
    "A100": 312.0,
    "L4": 121.0,
    "4090": 165.0,  # RTX 4090 (with fp32 accumulation: half this)
}

# The ~1B Llama of the real run; the tiny width of --smoke.
FULL = {
    "hidden_size": 2048,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "intermediate_size": 5632,
    "vocab_size": 32000,
}
SMOKE = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "intermediate_size": 176,
    "vocab_size": 256,
}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def peak_tflops(device_name: str, override: float | None) -> float | None:
    """The card's peak dense bf16 TFLOP/s: ``override``, else the table's entry for ``device_name``,
    else None (the caller says what to pass)."""
    if override is not None:
        return override
    for card, tflops in PEAK_TFLOPS.items():
        if re.search(rf"\b{re.escape(card)}\b", device_name):
            return tflops
    return None


def param_counts(shape: dict[str, int]) -> dict[str, int]:
    """The Llama's parameters by formula (untied head, no biases): all of them, and ``matmul`` (the
    ``N`` of the FLOPs counts: every linear layer and the head, not the input embedding)."""
    d, layers, ff, vocab = (
        shape[k] for k in ("hidden_size", "num_hidden_layers", "intermediate_size", "vocab_size")
    )
    kv = d * shape["num_key_value_heads"] // shape["num_attention_heads"]
    per_layer = d * d * 2 + d * kv * 2 + 3 * d * ff  # q, o; k, v; gate, up, down
    matmul = layers * per_layer + vocab * d
    return {"total": matmul + vocab * d + (2 * layers + 1) * d, "matmul": matmul, "per_layer": per_layer}


def flops_per_token(shape: dict[str, int], matmul: int, lora: int, seq_len: int) -> dict[str, int]:
    """The two counts of the module docstring, per token."""
    attention = 12 * shape["num_hidden_layers"] * shape["hidden_size"] * seq_len
    return {"model": 6 * matmul + attention, "executed": 4 * matmul + 6 * lora + attention}


def _build(shape: dict[str, int], rank: int, device: Any, seed: int) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from fedtune.models.lora import attach_lora

    config = LlamaConfig(**shape, tie_word_embeddings=False, attn_implementation="sdpa")
    torch.manual_seed(seed)
    with device:
        model = LlamaForCausalLM(config)
    model.to(torch.bfloat16 if device.type == "cuda" else torch.float32)
    model.config.use_cache = False
    return attach_lora(model, r=rank, alpha=2 * rank, dropout=0.0, target_modules=TARGETS, seed=seed)


def time_steps(model: Any, batch: Any, warmup: int, steps: int) -> list[float]:
    """Seconds of each of ``steps`` AdamW steps on ``batch`` after ``warmup`` untimed ones."""
    import torch

    device = batch.device
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    seconds: list[float] = []
    for step in range(warmup + steps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        begin = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if step >= warmup:
            seconds.append(time.perf_counter() - begin)
        if not torch.isfinite(loss):
            raise RuntimeError(f"P9: the loss is {loss.item()} at step {step}")
    return seconds


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = base_parser(__doc__.splitlines()[0] if __doc__ else "P9")
    parser.add_argument("--batch-size", type=int, default=None, help="default 4 (2 with --smoke)")
    parser.add_argument("--seq-len", type=int, default=None, help="default 2048 (32 with --smoke)")
    parser.add_argument("--rank", type=int, default=None, help="LoRA rank, default 16 (4 with --smoke)")
    parser.add_argument("--warmup", type=int, default=None, help="default 3 (1 with --smoke)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps, default 10 (2 with --smoke)")
    parser.add_argument("--peak-tflops", type=float, default=None, help="the card's peak dense bf16 TFLOP/s")
    args, began = parse(parser, argv)
    import torch

    if not args.smoke and not torch.cuda.is_available():
        raise SystemExit(
            "P9 measures a CUDA device and torch sees none here (--smoke runs a tiny width on the CPU)"
        )
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peak = peak_tflops(device_name, args.peak_tflops)
    if peak is None and not args.smoke:
        known = ", ".join(f"{k} {v:g}" for k, v in PEAK_TFLOPS.items())
        raise SystemExit(f"P9: no peak bf16 TFLOP/s known for {device_name!r} ({known}): pass --peak-tflops")
    shape = SMOKE if args.smoke else FULL
    batch_size = args.batch_size or (2 if args.smoke else 4)
    seq_len = args.seq_len or (32 if args.smoke else 2048)
    warmup = args.warmup if args.warmup is not None else (1 if args.smoke else 3)
    steps = args.steps or (2 if args.smoke else 10)
    args.rank = args.rank or (4 if args.smoke else 16)

    counts = param_counts(shape)
    model = _build(shape, args.rank, device, args.seed)
    built = sum(p.numel() for p in model.base_model.model.parameters() if not p.requires_grad)
    lora = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if built != counts["total"]:
        raise RuntimeError(f"P9: the model has {built} base parameters, the formula says {counts['total']}")
    size = f"{counts['total'] / 1e9:.3f}B" if counts["total"] >= 1e8 else f"{counts['total'] / 1e6:.2f}M"
    print(
        f"P9 model: {size} parameters ({counts['matmul'] / counts['total']:.0%} in matmuls), "
        f"LoRA r={args.rank}: {lora / 1e6:.2f}M trained",
        flush=True,
    )
    generator = torch.Generator().manual_seed(args.seed)
    batch = torch.randint(0, shape["vocab_size"], (batch_size, seq_len), generator=generator).to(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    seconds = time_steps(model, batch, warmup, steps)
    step_s = median(seconds)
    tokens_per_s = batch_size * seq_len / step_s
    flops = flops_per_token(shape, counts["matmul"], lora, seq_len)
    achieved = {k: v * tokens_per_s / 1e12 for k, v in flops.items()}
    mfu = {k: (v / peak if peak else None) for k, v in achieved.items()}
    peak_mem = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None

    def pct(value: float | None) -> str:
        return "n/a (no peak)" if value is None else f"{100 * value:.1f}%"

    rows = [
        ["model: 6N + 12Lds", f"{flops['model'] / 1e9:.2f}", f"{achieved['model']:.1f}", pct(mfu["model"])],
        [
            "executed: 4N + 6N_lora + 12Lds",
            f"{flops['executed'] / 1e9:.2f}",
            f"{achieved['executed']:.1f}",
            pct(mfu["executed"]),
        ],
    ]
    precision = "bf16 autocast" if device.type == "cuda" else "fp32"
    markdown = "\n".join(
        [
            f"P9 LoRA step MFU, Llama {size} random init, {precision} on {device_name}, "
            f"LoRA r={args.rank} on all linear layers ({lora / 1e6:.2f}M), batch {batch_size} x {seq_len} "
            f"tokens, median of {steps} steps after {warmup} warm-up",
            "",
            f"{step_s:.4f} s/step, {tokens_per_s:,.0f} tokens/s, peak "
            f"{'n/a' if peak is None else f'{peak:g}'} TFLOP/s"
            + ("" if peak_mem is None else f", peak memory {peak_mem:.1f} GiB"),
            "",
            markdown_table(["FLOPs count", "GFLOP/token", "TFLOP/s", "MFU"], rows),
            "",
            "Target: >= 40% MFU on the model count.",
        ]
    )
    print(markdown)
    results = {
        "device": device_name,
        "precision": precision,
        "config": vars(args) | {"results_dir": str(args.results_dir)},
        "shape": shape,
        "batch_size": batch_size,
        "seq_len": seq_len,
        "params": counts | {"lora": lora},
        "seconds_per_step": seconds,
        "median_seconds_per_step": step_s,
        "tokens_per_s": tokens_per_s,
        "flops_per_token": flops,
        "achieved_tflops": achieved,
        "peak_tflops": peak,
        "mfu": mfu,
        "peak_memory_gib": peak_mem,
    }
    write_results("p9", results, markdown, args, began)
    return results


if __name__ == "__main__":
    main()
