"""P5: proxy-tuned decoding throughput vs the proxy-tuning reference loop.

Three models: the large LM (a ``LocalLogitSource``), the tuned small LM (LoRA r=8 on q_proj/v_proj
with a random B, so tuned != base) and the base small LM. Greedy, fp32, CPU. Measured, alternated
within every repeat:

- each model alone (``large``, ``small_tuned``, ``small_base``): a plain Hugging Face loop,
  forward with ``past_key_values``, argmax, batch 1. The bound is ``1 / (t_large + t_small_tuned +
  t_small_base)`` tokens/s: what running the three one after the other cannot beat;
- ``yardstick``: the proxy-tuning reference loop, written plainly below: per step three sequential
  forwards (large, tuned, base; each its own model object and KV cache), combine, argmax; batch 1;
- ours (``ProxyTunedLM.step_fn`` driven by ``decode_loop``, what ``generate`` runs) at batch 1 and
  batch 8 (left-padded prompts of different lengths), with the two small forwards fused into one
  (``fused``, the default) and as two forwards (``separate``, ``fuse_small=False``).

Every run feeds a prompt of ``--prompt-tokens`` tokens (batch 8: that many down to 7 fewer), then
decodes ``--new-tokens`` tokens; the clock runs from the end of the prompt step to the end of the
last step, so only decoding steps are timed. Throughput counts every row. Targets: ours at batch 1
>= 0.9x the bound; ours at batch 8 >= 2x the yardstick. Greedy tokens of the yardstick and of ours
at batch 1 are compared (they must be identical), as are fused and separate at batch 8.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import base_parser, load_avg, markdown_table, median, parse, write_results

LORA_TARGETS = ["q_proj", "v_proj"]
DERIVED_SMALL = "smollm2-135m-instruct-l10"
ALONE = ("large", "small_tuned", "small_base")
OURS = ("ours_fused_b1", "ours_separate_b1", "ours_fused_b8", "ours_separate_b8")
VARIANTS = (*ALONE, "yardstick", *OURS)


@dataclass
class Run:
    variant: str
    repeat: int
    rows: int
    steps: int
    seconds: float
    tokens: list[list[int]]

    @property
    def ms_per_step(self) -> float:
        return 1000 * self.seconds / self.steps

    @property
    def tokens_per_s(self) -> float:
        return self.rows * self.steps / self.seconds


def plain_loop(models: Sequence[Any], combine: Callable[[list[Any]], Any], prompt: Any, steps: int) -> Run:
    """The reference loop: each model in turn with its own KV cache, ``combine`` its logits, argmax.

    Batch 1, so no padding and no attention mask. Returns the timing of the ``steps`` decoding
    steps after the prompt step.
    """
    import torch

    caches: list[Any] = [None] * len(models)
    new_ids, tokens, stamps = prompt, [], []
    with torch.inference_mode():
        for _ in range(steps + 1):
            logits = []
            for index, model in enumerate(models):
                output = model(input_ids=new_ids, past_key_values=caches[index], use_cache=True)
                caches[index] = output.past_key_values
                logits.append(output.logits[:, -1, :])
            new_ids = combine(logits).argmax(dim=-1, keepdim=True)
            tokens.append(int(new_ids[0, 0]))
            stamps.append(time.perf_counter())
    return Run("", 0, 1, steps, stamps[-1] - stamps[0], [tokens])


def proxy_combine(alpha: float) -> Callable[[list[Any]], Any]:
    def combine(logits: list[Any]) -> Any:
        large, tuned, base = logits
        width = min(large.shape[-1], tuned.shape[-1], base.shape[-1])
        return large[:, :width] + alpha * (tuned[:, :width] - base[:, :width])

    return combine


class Bench:
    """The three models (the base small model twice: as peft's adapter-off view and as its own copy)."""

    def __init__(self, large_name: str, small_name: str, alpha: float, prompt_tokens: int, seed: int) -> None:
        import torch

        from fedtune.data.builtin import load_builtin
        from fedtune.data.templates import build_prompt
        from fedtune.models.loading import load_causal_lm
        from fedtune.models.lora import attach_lora
        from fedtune.proxy import LocalLogitSource, ProxyTunedLM

        large_model, large_tokenizer = load_causal_lm(large_name, dtype="fp32", device="cpu", seed=seed)
        small_model, tokenizer = load_causal_lm(small_name, dtype="fp32", device="cpu", seed=seed)
        # The reference loop runs the base small model as a model of its own, as proxy-tuning does.
        self.base_copy, _ = load_causal_lm(small_name, dtype="fp32", device="cpu", seed=seed)
        self.tuned = attach_lora(
            small_model, r=8, alpha=16, dropout=0.0, target_modules=LORA_TARGETS, seed=seed
        )
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, param in self.tuned.named_parameters():
                if "lora_B" in name:
                    param.copy_(0.02 * torch.randn(param.shape, generator=generator))
        self.tuned.eval()
        self.large_model = large_model.eval()
        source = LocalLogitSource(large_model, large_tokenizer, large_name)
        self.alpha = alpha
        self.proxies = {
            "fused": ProxyTunedLM(source, self.tuned, tokenizer, alpha, fuse_small=True),
            "separate": ProxyTunedLM(source, self.tuned, tokenizer, alpha, fuse_small=False),
        }
        self.pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
        records = load_builtin("wordnet-instruct", "test")
        texts = [build_prompt(record, "alpaca") + record.output for record in records[:8]]
        ids = tokenizer(texts)["input_ids"]
        # Row i keeps prompt_tokens - i tokens: batch 8 has rows of 8 different lengths.
        self.prompts = [row[: prompt_tokens - i] for i, row in enumerate(ids)]
        if min(len(row) for row in self.prompts) < prompt_tokens - 7:
            raise ValueError(f"the built-in prompts are shorter than {prompt_tokens} tokens")

    def alone(self, variant: str, steps: int) -> Run:
        import torch

        model = {"large": self.large_model, "small_tuned": self.tuned, "small_base": self.base_copy}[variant]
        return plain_loop([model], lambda logits: logits[0], torch.tensor(self.prompts[:1]), steps)

    def yardstick(self, steps: int) -> Run:
        import torch

        models = [self.large_model, self.tuned, self.base_copy]
        return plain_loop(models, proxy_combine(self.alpha), torch.tensor(self.prompts[:1]), steps)

    def ours(self, variant: str, steps: int) -> Run:
        from fedtune.decode.generate import decode_loop, evaluating, pad_sequences

        proxy = self.proxies["fused" if "fused" in variant else "separate"]
        rows = 8 if variant.endswith("b8") else 1
        input_ids, attention_mask = pad_sequences(self.prompts[:rows], self.pad_id, side="left")
        stamps: list[float] = []
        with evaluating(proxy.small):
            step = proxy.step_fn()

            def timed(*args: Any) -> Any:
                logits = step(*args)
                stamps.append(time.perf_counter())
                return logits

            # No EOS: every run decodes the same number of steps.
            new_tokens = decode_loop(
                timed,
                input_ids,
                attention_mask,
                max_new_tokens=steps + 1,
                eos_token_ids=[],
                pad_token_id=self.pad_id,
            )
        return Run(variant, 0, rows, steps, stamps[-1] - stamps[0], new_tokens.tolist())

    def run(self, variant: str, repeat: int, steps: int) -> Run:
        if variant in ALONE:
            run = self.alone(variant, steps)
        elif variant == "yardstick":
            run = self.yardstick(steps)
        else:
            run = self.ours(variant, steps)
        run.variant, run.repeat = variant, repeat
        return run


def summarise(runs: Sequence[Run]) -> dict[str, Any]:
    ms = {v: median(r.ms_per_step for r in runs if r.variant == v) for v in VARIANTS}
    tokens_per_s = {v: median(r.tokens_per_s for r in runs if r.variant == v) for v in VARIANTS}
    bound = 1000 / (ms["large"] + ms["small_tuned"] + ms["small_base"])
    yardstick = tokens_per_s["yardstick"]
    return {
        "ms_per_step": ms,
        "tokens_per_s": tokens_per_s,
        "bound_tokens_per_s": bound,
        "vs_bound": {v: tokens_per_s[v] / bound for v in ("yardstick", *OURS)},
        "vs_yardstick": {v: tokens_per_s[v] / yardstick for v in OURS},
    }


def paired(runs: Sequence[Run], variant: str, reference: str) -> list[float]:
    """``variant`` over ``reference`` tokens/s within each repeat (the side-by-side pairs)."""
    by_key = {(r.variant, r.repeat): r for r in runs}
    return [
        by_key[(variant, k)].tokens_per_s / by_key[(reference, k)].tokens_per_s
        for k in sorted({r.repeat for r in runs})
    ]


def exactness(runs: Sequence[Run]) -> dict[str, bool]:
    """Greedy tokens that must agree: ours vs the yardstick at batch 1, fused vs separate at batch 8."""
    first = {r.variant: r.tokens for r in runs if r.repeat == 0}
    return {
        "fused_b1_equals_yardstick": first["ours_fused_b1"] == first["yardstick"],
        "separate_b1_equals_yardstick": first["ours_separate_b1"] == first["yardstick"],
        "fused_b8_equals_separate_b8": first["ours_fused_b8"] == first["ours_separate_b8"],
    }


def table(summary: dict[str, Any]) -> str:
    rows: list[list[Any]] = []
    for variant in VARIANTS:
        batch = 8 if variant.endswith("b8") else 1
        rows.append(
            [
                variant,
                batch,
                f"{summary['ms_per_step'][variant]:.1f}",
                f"{summary['tokens_per_s'][variant]:.2f}",
                f"{summary['vs_bound'][variant]:.2f}" if variant in summary["vs_bound"] else "",
                f"{summary['vs_yardstick'][variant]:.2f}" if variant in summary["vs_yardstick"] else "",
            ]
        )
    rows.append(
        ["bound 1/(t_large+t_tuned+t_base)", 1, "", f"{summary['bound_tokens_per_s']:.2f}", "1.00", ""]
    )
    headers = ["variant", "batch", "ms/step", "tokens/s", "vs bound", "vs yardstick"]
    return markdown_table(headers, rows)


def pick_small(smoke: bool) -> tuple[str, bool]:
    """The derived same-vocabulary small model when it is in the cache, else SmolLM2 itself."""
    if smoke:
        return "tiny-llama-L2-H32", False
    from fedtune.models.loading import ModelError, load_causal_lm

    try:
        load_causal_lm(DERIVED_SMALL, device="cpu")
    except ModelError:
        return "smollm2-135m-instruct", True
    return DERIVED_SMALL, False


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = base_parser(__doc__.splitlines()[0] if __doc__ else "P5")
    parser.add_argument("--large", default=None, help="default smollm2-135m-instruct (tiny with --smoke)")
    parser.add_argument("--small", default=None, help=f"default {DERIVED_SMALL} if cached, else the large")
    parser.add_argument("--alpha", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=None, help="default 3 (1 with --smoke)")
    parser.add_argument("--prompt-tokens", type=int, default=None, help="default 40 (12 with --smoke)")
    parser.add_argument("--new-tokens", type=int, default=None, help="default 32 (4 with --smoke)")
    args, began = parse(parser, argv)
    large_name = args.large or ("tiny-llama-L4-H64" if args.smoke else "smollm2-135m-instruct")
    small_name, fallback = (args.small, False) if args.small else pick_small(args.smoke)
    repeats = args.repeats or (1 if args.smoke else 3)
    prompt_tokens = args.prompt_tokens or (12 if args.smoke else 40)
    steps = args.new_tokens or (4 if args.smoke else 32)

    bench = Bench(large_name, small_name, args.alpha, prompt_tokens, args.seed)
    for variant in VARIANTS:  # warm-up: first calls allocate and pick kernels
        bench.run(variant, -1, 2)
    runs: list[Run] = []
    for repeat in range(repeats):
        for variant in VARIANTS:
            run = bench.run(variant, repeat, steps)
            runs.append(run)
            print(
                f"repeat {repeat} {variant:>17}: {run.ms_per_step:.1f} ms/step, {run.tokens_per_s:.2f} tok/s",
                flush=True,
            )
    summary = summarise(runs)
    checks = exactness(runs)
    targets = {
        "ours_b1_vs_bound": summary["vs_bound"]["ours_fused_b1"],
        "ours_b1_vs_bound_met": summary["vs_bound"]["ours_fused_b1"] >= 0.9,
        "ours_b8_vs_yardstick": summary["vs_yardstick"]["ours_fused_b8"],
        "ours_b8_vs_yardstick_met": summary["vs_yardstick"]["ours_fused_b8"] >= 2.0,
    }
    small_note = f" (fallback: {DERIVED_SMALL} is not in the cache)" if fallback else ""
    markdown = (
        f"P5 proxy-tuned decoding, large {large_name}, small {small_name}{small_note}, fp32 CPU "
        f"({args.threads} threads), "
        f"alpha {args.alpha}, prompt {prompt_tokens} tokens, {steps} greedy steps, {repeats} repeats "
        f"(medians), load {began.load} -> {load_avg()}\n\n"
        + table(summary)
        + f"\n\ntargets: {targets}\nexact: {checks}"
    )
    print(markdown)
    results = {
        "large_model": large_name,
        "small_model": small_name,
        "small_model_fallback": fallback,
        "config": {
            "alpha": args.alpha,
            "repeats": repeats,
            "prompt_tokens": prompt_tokens,
            "new_tokens": steps,
            "threads": args.threads,
            "lora": {"r": 8, "alpha": 16, "targets": LORA_TARGETS, "init_b": "normal(0, 0.02)"},
            "variants": list(VARIANTS),
        },
        "summary": summary,
        "targets": targets,
        "exact": checks,
        "paired_vs_yardstick": {v: paired(runs, v, "yardstick") for v in OURS},
        "runs": [
            {"variant": r.variant, "repeat": r.repeat, "rows": r.rows, "steps": r.steps, "seconds": r.seconds}
            for r in runs
        ],
    }
    write_results("p5", results, markdown, args, began)
    return results


if __name__ == "__main__":
    main()
