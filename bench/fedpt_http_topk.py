"""P13: FedPT's large model behind HTTP at top-k: what the residual fill costs in accuracy and time.

The large model is served by ``fedtune serve`` (in-process, loopback, no log-probability limit) and
reached through ``HTTPLogitSource`` at ``k`` in {5, 20, 128, the vocabulary}; the yardstick is the
exact local source (``LocalLogitSource``, the same weights in this process). The small model is a LoRA on
``--small`` (by default the large model itself, with LoRA B ~ 0.02 N(0, 1) so that tuned != base: the
fill's error lives in the large model's term whichever small model steers it).

- **Distillation teacher**: on ``--kd-rows`` public examples (wordnet-instruct, Alpaca, ``--max-length``),
  per labelled position, KL(exact || over HTTP) of the large model's distribution and of FedPT's proxy
  teacher ``softmax(z_large + alpha (z_tuned - z_base))``; the exact mass the named ids hold; API seconds
  per request (one row each) and for FedPT's 128 public examples (``fedpt.kd_examples``, computed once
  per run and cached), against the local source's seconds for the same rows.
- **Proxy-tuned decoding**: ``--prompts`` test prompts decoded greedily for ``--new-tokens`` steps by the
  exact proxy; along that trajectory, per step, KL(exact || over HTTP) of the proxy distribution and
  whether the greedy token agrees; API seconds per step (one request per row, the prefix re-sent).

The vocabulary (k = V) sends V entries per position: its teacher rows are capped at ``--full-rows``
(the JSON of one 64-token row over a 49k vocabulary is ~200 MB); its KL is zero by construction and measured
on those rows.

    python bench/fedpt_http_topk.py            # SmolLM2-135M-Instruct, 2 threads
    python bench/fedpt_http_topk.py --smoke    # tiny models, seconds
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import base_parser, markdown_table, parse, write_results

KD_EXAMPLES = 128
"""FedPT's public set per run (configs/paper/fedpt-smollm2.yaml): the teacher is computed once on it."""


def kl_rows(exact_logits: Any, approx_logits: Any) -> Any:
    """KL(softmax(exact) || softmax(approx)) per row."""
    import torch

    p = torch.log_softmax(exact_logits.float(), dim=-1)
    q = torch.log_softmax(approx_logits.float(), dim=-1)
    return (p.exp() * (p - q)).sum(dim=-1)


class Setup:
    def __init__(self, args: Any) -> None:
        import torch

        from fedtune.config import LoraConfig
        from fedtune.data.builtin import load_builtin
        from fedtune.data.records import Record
        from fedtune.data.templates import build_prompt
        from fedtune.data.tokenize import encode_records, make_batches
        from fedtune.models.loading import load_causal_lm
        from fedtune.models.lora import build_lora
        from fedtune.proxy import LocalLogitSource
        from fedtune.serve import LogitsService

        large, large_tok = load_causal_lm(args.model, dtype="fp32", device="cpu", seed=args.seed)
        small, self.tokenizer = load_causal_lm(
            args.small or args.model, dtype="fp32", device="cpu", seed=args.seed
        )
        targets: Any = "auto" if args.smoke else ["q_proj", "v_proj"]
        self.small = build_lora(small, LoraConfig(r=8, alpha=16, dropout=0.0, target_modules=targets), seed=0)
        generator = torch.Generator().manual_seed(args.seed)
        with torch.no_grad():
            for name, param in self.small.named_parameters():
                if "lora_B" in name:
                    param.copy_(0.02 * torch.randn(param.shape, generator=generator))
        self.small.eval()
        self.local = LocalLogitSource(large, large_tok, args.model)
        self.service = LogitsService(large, large_tok, args.model, max_logprobs=-1)
        pad = int(self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0)
        public = load_builtin("wordnet-instruct", "public")[: args.kd_rows]
        examples = encode_records(public, self.tokenizer, "alpaca", args.max_length)
        self.rows = make_batches(examples, 1, pad, seed=0, bucketing=False, shuffle=False)
        test: list[Record] = load_builtin("wordnet-instruct", "test")[: args.prompts]
        self.prompts = [build_prompt(r, "alpaca") for r in test]

    def small_logits(self, batch: Any) -> tuple[Any, Any]:
        import torch

        from fedtune.train.losses import labelled_logits

        with torch.inference_mode():
            tuned, _ = labelled_logits(self.small, batch)
            with self.small.disable_adapter():
                base, _ = labelled_logits(self.small, batch)
        return tuned.float(), base.float()


def teacher(setup: Setup, source: Any, rows: list[Any], alpha: float) -> dict[str, Any]:
    """The large model's and the proxy teacher's KL to the exact ones over ``rows`` (one request each)."""
    import torch

    large_kl, teacher_kl, mass, seconds, local_seconds = [], [], [], 0.0, 0.0
    before = source.usage.requests, source.usage.bytes_down
    for batch in rows:
        started = time.perf_counter()
        top = source.labelled_logprobs(batch)
        seconds += time.perf_counter() - started
        started = time.perf_counter()
        exact = setup.local.labelled_logits(batch)
        local_seconds += time.perf_counter() - started
        width = top.logprobs.shape[-1]
        exact = exact[:, :width]
        tuned, base = setup.small_logits(batch)
        shift = alpha * (tuned[:, :width] - base[:, :width])
        large_kl.append(kl_rows(exact, top.logprobs))
        teacher_kl.append(kl_rows(exact + shift, top.logprobs + shift))
        probs = torch.softmax(exact, dim=-1)
        mass.append((probs * top.known).sum(dim=-1))
    requests = source.usage.requests - before[0]
    return {
        "rows": len(rows),
        "positions": int(sum(len(k) for k in large_kl)),
        "kl_large": float(torch.cat(large_kl).mean()),
        "kl_teacher": float(torch.cat(teacher_kl).mean()),
        "known_mass": float(torch.cat(mass).mean()),
        "api_s_per_request": seconds / max(1, requests),
        "bytes_down_per_request": (source.usage.bytes_down - before[1]) / max(1, requests),
        "api_s_per_kd_set": seconds / len(rows) * KD_EXAMPLES,
        "local_s_per_kd_set": local_seconds / len(rows) * KD_EXAMPLES,
    }


def decoding(
    setup: Setup, source: Any, alpha: float, new_tokens: int, trajectory: list[list[int]]
) -> dict[str, Any]:
    """Per step along the exact greedy ``trajectory``: KL of the proxy distribution, greedy agreement."""
    import torch

    from fedtune.proxy import ProxyTunedLM

    exact_proxy = ProxyTunedLM(setup.local, setup.small, setup.tokenizer, alpha)
    approx_proxy = ProxyTunedLM(source, setup.small, setup.tokenizer, alpha)
    kls, agree, seconds, steps = [], [], 0.0, 0
    for prompt, forced in zip(setup.prompts, trajectory, strict=True):
        ids = torch.tensor([setup.tokenizer(prompt)["input_ids"]])
        exact_step, approx_step = exact_proxy.step_fn(), approx_proxy.step_fn()
        mask = torch.ones_like(ids)
        positions = torch.arange(ids.shape[1])[None]
        new = ids
        for token in forced[:new_tokens]:
            with torch.inference_mode():
                exact = exact_step(new, mask, positions)
                started = time.perf_counter()
                approx = approx_step(new, mask, positions)
                seconds += time.perf_counter() - started
            steps += 1
            kls.append(float(kl_rows(exact, approx)[0]))
            agree.append(bool(exact.argmax(-1) == approx.argmax(-1)))
            new = torch.tensor([[token]])
            positions = positions[:, -1:] + 1
            mask = torch.cat([mask, mask.new_ones((1, 1))], dim=1)
    return {
        "steps": steps,
        "kl_proxy": statistics.fmean(kls),
        "greedy_agreement": sum(agree) / len(agree),
        "api_s_per_step": seconds / steps,
    }


def main(argv: list[str] | None = None) -> None:
    parser = base_parser(__doc__ or "P13", model=True)
    parser.add_argument(
        "--small", default=None, help="the small model (default: --model, with a random LoRA)"
    )
    parser.add_argument("--ks", default="5,20,128,full", help="comma-separated k; 'full' = the vocabulary")
    parser.add_argument("--kd-rows", type=int, default=16)
    parser.add_argument("--full-rows", type=int, default=1)
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=12)
    parser.add_argument("--alpha", type=float, default=1.0)
    args, start = parse(parser, argv)
    if args.smoke:
        args.kd_rows, args.full_rows, args.prompts, args.new_tokens = 4, 1, 2, 4
    from fedtune.proxy import ProxyTunedLM
    from fedtune.proxy.http_source import HTTPLogitSource, HTTPSettings
    from fedtune.serve import BackgroundServer, build_app

    setup = Setup(args)
    width = len(setup.tokenizer)
    ks = [width if k == "full" else int(k) for k in args.ks.split(",")]
    exact_proxy = ProxyTunedLM(setup.local, setup.small, setup.tokenizer, args.alpha)
    trajectory = [
        setup.tokenizer(text, add_special_tokens=False)["input_ids"]
        for text in exact_proxy.generate(setup.prompts, max_new_tokens=args.new_tokens, batch_size=1)
    ]
    # The exact greedy ids, re-tokenized from text, may end early (EOS): decode as far as they go.
    trajectory = [ids if ids else [0] for ids in trajectory]
    results: dict[str, Any] = {"model": args.model, "small_model": args.small or args.model, "vocab": width}
    rows_out, labels = [], []
    with BackgroundServer(build_app(setup.service)) as server:
        for k in ks:
            source = HTTPLogitSource.connect(server.url, setup.tokenizer, settings=HTTPSettings(top_k=k))
            rows = setup.rows[: args.full_rows] if k >= width else setup.rows
            taught = teacher(setup, source, rows, args.alpha)
            decoded = decoding(setup, source, args.alpha, args.new_tokens, trajectory)
            label = "V" if k >= width else str(k)
            results[label] = {"teacher": taught, "decoding": decoded}
            labels.append(label)
            print(f"k={label}: {taught} {decoded}", flush=True)
            rows_out.append(
                [
                    f"{k:,}" if k < width else f"{width:,} (all)",
                    max(0.0, taught["kl_large"]),  # k = V: zero up to float rounding
                    max(0.0, taught["kl_teacher"]),
                    taught["known_mass"],
                    max(0.0, decoded["kl_proxy"]),
                    decoded["greedy_agreement"],
                    taught["api_s_per_request"],
                    taught["api_s_per_kd_set"],
                    decoded["api_s_per_step"],
                    f"{taught['bytes_down_per_request'] / 1e3:,.0f}",
                ]
            )
            source.close()
    local_kd = statistics.fmean(results[label]["teacher"]["local_s_per_kd_set"] for label in labels)
    table = markdown_table(
        [
            "k",
            "KL large (teacher rows)",
            "KL proxy teacher",
            "exact mass named",
            "KL proxy decoding",
            "greedy tokens agreeing",
            "API s / teacher request",
            f"API s / {KD_EXAMPLES} teacher rows",
            "API s / decoding step",
            "kB / teacher request",
        ],
        rows_out,
    )
    markdown = (
        f"P13: FedPT's large model over HTTP at top-k ({args.model}, V = {width:,}; "
        f"{args.kd_rows} teacher rows of <= {args.max_length} tokens, {args.full_rows} at k = V; "
        f"{args.prompts} prompts x {args.new_tokens} greedy steps; alpha {args.alpha})\n\n{table}\n\n"
        f"The exact local source takes {local_kd:.2f} s for {KD_EXAMPLES} teacher rows on this machine."
    )
    results["local_s_per_kd_set"] = local_kd
    print(markdown)
    write_results("p13", results, markdown, args, start)


if __name__ == "__main__":
    main()
