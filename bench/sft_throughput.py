"""P3: local LoRA SFT throughput of fedtune's training loop vs ``transformers.Trainer``.

Same model (fp32, CPU), same LoRA (r=8, alpha=16, dropout 0.05 on q_proj/v_proj), same examples
(built-in wordnet-instruct, alpaca template, max_length 256), batch size 8, AdamW at the same lr,
constant schedule, grad-norm clipping 1.0, the same number of optimizer steps; no eval, no
checkpoints, no logging for Trainer. Variants, alternated within every repeat:

- ``ours``: ``train_local`` on random batches padded to the longest example of each batch (what
  Trainer's ``DataCollatorForSeq2Seq`` does);
- ``trainer``: ``Trainer`` with ``DataCollatorForSeq2Seq``, fed the very same batches in the same
  order (a sequential sampler over the pre-shuffled examples, i.e. no length grouping);
- ``ours_bucketed``: ``train_local`` on the same examples batched by ``make_batches`` with length
  bucketing;
- ``ours_full_logits`` (``--ablation``): ``ours`` with the loss computed from the full [B, T, V]
  logits of the model's forward (``causal_lm_nll``), as ``sft_loss`` did before it applied the LM
  head only at labelled positions: what that change buys.

The first step of every run is warm-up and is not timed: a run's clock starts when step 1 ends
and stops when the last step ends, on both sides (our ``report`` hook, Trainer's ``on_step_end``).
"""

from __future__ import annotations

import gc
import itertools
import random
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import base_parser, markdown_table, median, parse, write_results

VARIANTS = ("ours", "trainer", "ours_bucketed")
ABLATION = "ours_full_logits"
LORA_TARGETS = ["q_proj", "v_proj"]


@dataclass
class Run:
    variant: str
    repeat: int
    timed_steps: int
    seconds: float
    real_tokens: int
    padded_tokens: int
    step_seconds: list[float] = field(default_factory=list)

    @property
    def steps_per_s(self) -> float:
        return self.timed_steps / self.seconds

    @property
    def real_tokens_per_s(self) -> float:
        return self.real_tokens / self.seconds


def _timed(stamps: Sequence[float]) -> tuple[float, list[float]]:
    """Seconds from the end of step 1 to the end of the last step, and each timed step's length."""
    if len(stamps) < 2:
        raise RuntimeError("a run needs at least one timed step after the warm-up step")
    return stamps[-1] - stamps[0], [b - a for a, b in itertools.pairwise(stamps)]


def full_logits_sft_loss(model: Any, batch: dict[str, Any]) -> tuple[Any, int]:
    """The loss from the model's full [B, T, V] logits (KV cache as loaded), for the ablation."""
    from fedtune.train.losses import causal_lm_nll

    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    return causal_lm_nll(logits, batch["labels"])


class Bench:
    """One model with one LoRA adapter, shared by every variant so that all run the same weights."""

    def __init__(self, model_name: str, num_examples: int, batch_size: int, lr: float, seed: int) -> None:
        from fedtune.data.builtin import load_builtin
        from fedtune.data.tokenize import batch_indices, encode_records, make_batches
        from fedtune.models.loading import load_causal_lm
        from fedtune.models.lora import adapter_state, attach_lora

        base, tokenizer = load_causal_lm(model_name, dtype="fp32", device="cpu", seed=seed)
        self.model = attach_lora(base, r=8, alpha=16, dropout=0.05, target_modules=LORA_TARGETS, seed=seed)
        self.initial = adapter_state(self.model)
        self.tokenizer = tokenizer
        self.pad = int(tokenizer.pad_token_id)
        # Trainer sets config.use_cache = False on the shared model; ours runs as fedtune loads it.
        self.use_cache = bool(getattr(self.model.config, "use_cache", False))
        self.batch_size, self.lr, self.seed = batch_size, lr, seed
        records = load_builtin("wordnet-instruct", "train")
        picked = random.Random(seed).sample(range(len(records)), num_examples)
        self.examples = encode_records([records[i] for i in picked], tokenizer, "alpaca", 256)
        self.random_batches = make_batches(self.examples, batch_size, self.pad, seed=seed, bucketing=False)
        self.bucketed_batches = make_batches(self.examples, batch_size, self.pad, seed=seed, bucketing=True)
        lengths = [len(ex.input_ids) for ex in self.examples]
        order = batch_indices(lengths, batch_size, seed=seed, bucketing=False)
        self.random_order = [self.examples[i] for idx in order for i in idx]

    def _reset(self) -> None:
        import torch

        from fedtune.models.lora import load_adapter

        load_adapter(self.model, self.initial)
        self.model.config.use_cache = self.use_cache
        torch.manual_seed(self.seed)

    def run_ours(self, variant: str, repeat: int) -> Run:
        from fedtune.train.loop import sft_loss, train_local
        from fedtune.train.optim import build_optimizer

        self._reset()
        batches = self.bucketed_batches if variant == "ours_bucketed" else self.random_batches
        loss_fn: Callable[..., Any] = full_logits_sft_loss if variant == ABLATION else sft_loss
        optimizer = build_optimizer(self.model.parameters(), "adamw", lr=self.lr)
        stamps: list[float] = []
        train_local(
            self.model,
            batches,
            optimizer,
            None,
            steps=len(batches),
            clip_norm=1.0,
            loss_fn=loss_fn,
            report=lambda step, total, loss: stamps.append(time.perf_counter()),
        )
        seconds, per_step = _timed(stamps)
        timed = batches[1:]
        return Run(
            variant,
            repeat,
            len(timed),
            seconds,
            real_tokens=sum(int(b["attention_mask"].sum()) for b in timed),
            padded_tokens=sum(int(b["input_ids"].numel()) for b in timed),
            step_seconds=per_step,
        )

    def run_trainer(self, repeat: int) -> Run:
        from transformers import DataCollatorForSeq2Seq, Trainer, TrainerCallback, TrainingArguments
        from transformers.trainer_callback import PrinterCallback

        self._reset()
        stamps: list[float] = []
        seen: list[tuple[int, int]] = []  # (real, padded) tokens of each batch the collator built

        class StepClock(TrainerCallback):
            def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                stamps.append(time.perf_counter())

        inner = DataCollatorForSeq2Seq(self.tokenizer, padding=True, label_pad_token_id=-100)

        def collator(features: list[dict[str, Any]]) -> Any:
            batch = inner(features)
            seen.append((int(batch["attention_mask"].sum()), int(batch["input_ids"].numel())))
            return batch

        dataset = [
            {"input_ids": ex.input_ids, "attention_mask": [1] * len(ex.input_ids), "labels": ex.labels}
            for ex in self.random_order
        ]
        steps = len(self.random_batches)
        with tempfile.TemporaryDirectory() as out:
            args = TrainingArguments(
                output_dir=out,
                per_device_train_batch_size=self.batch_size,
                max_steps=steps,
                learning_rate=self.lr,
                lr_scheduler_type="constant",
                warmup_steps=0,
                weight_decay=0.0,
                max_grad_norm=1.0,
                # "sequential" over examples already in our random order = the same batches as
                # ``ours``, with no length grouping (what group_by_length=False meant before v5).
                train_sampling_strategy="sequential",
                eval_strategy="no",
                save_strategy="no",
                logging_strategy="no",
                report_to="none",
                disable_tqdm=True,
                dataloader_num_workers=0,
                dataloader_pin_memory=False,
                use_cpu=True,
                seed=self.seed,
            )
            trainer = Trainer(
                model=self.model,
                args=args,
                train_dataset=dataset,
                data_collator=collator,
            )
            trainer.remove_callback(PrinterCallback)
            trainer.add_callback(StepClock())
            trainer.train()
            del trainer
        gc.collect()
        seconds, per_step = _timed(stamps)
        timed = seen[1:steps]
        return Run(
            "trainer",
            repeat,
            steps - 1,
            seconds,
            real_tokens=sum(real for real, _ in timed),
            padded_tokens=sum(padded for _, padded in timed),
            step_seconds=per_step,
        )

    def run(self, variant: str, repeat: int) -> Run:
        return self.run_trainer(repeat) if variant == "trainer" else self.run_ours(variant, repeat)


def summarise(runs: Sequence[Run], variants: Sequence[str]) -> dict[str, dict[str, float]]:
    summary: dict[str, dict[str, float]] = {}
    for variant in variants:
        mine = [r for r in runs if r.variant == variant]
        summary[variant] = {
            "steps_per_s": median(r.steps_per_s for r in mine),
            "real_tokens_per_s": median(r.real_tokens_per_s for r in mine),
            "seconds_per_step": median(r.seconds / r.timed_steps for r in mine),
            "real_tokens_per_step": median(r.real_tokens / r.timed_steps for r in mine),
            "padding_fraction": median(1 - r.real_tokens / r.padded_tokens for r in mine),
        }
    trainer = summary["trainer"]
    for variant in variants:
        if variant != "trainer":
            summary[variant]["steps_per_s_vs_trainer"] = (
                summary[variant]["steps_per_s"] / trainer["steps_per_s"]
            )
            summary[variant]["real_tokens_per_s_vs_trainer"] = (
                summary[variant]["real_tokens_per_s"] / trainer["real_tokens_per_s"]
            )
    return summary


def paired_ratios(runs: Sequence[Run], variant: str) -> list[float]:
    """Real tokens/s of ``variant`` over Trainer's within each repeat (the side-by-side pairs)."""
    by_repeat = {(r.variant, r.repeat): r for r in runs}
    repeats = sorted({r.repeat for r in runs})
    return [
        by_repeat[(variant, k)].real_tokens_per_s / by_repeat[("trainer", k)].real_tokens_per_s
        for k in repeats
        if (variant, k) in by_repeat and ("trainer", k) in by_repeat
    ]


def table(summary: dict[str, dict[str, float]], variants: Sequence[str]) -> str:
    rows = []
    for variant in variants:
        s = summary[variant]
        rows.append(
            [
                variant,
                f"{s['seconds_per_step']:.2f}",
                f"{s['steps_per_s']:.4f}",
                f"{s['real_tokens_per_s']:.1f}",
                f"{s['padding_fraction']:.0%}",
                "1.00" if variant == "trainer" else f"{s['steps_per_s_vs_trainer']:.2f}",
                "1.00" if variant == "trainer" else f"{s['real_tokens_per_s_vs_trainer']:.2f}",
            ]
        )
    headers = [
        "variant",
        "s/step",
        "steps/s",
        "real tok/s",
        "padding",
        "steps/s vs Trainer",
        "tok/s vs Trainer",
    ]
    return markdown_table(headers, rows)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = base_parser(__doc__.splitlines()[0] if __doc__ else "P3", model=True)
    parser.add_argument("--repeats", type=int, default=None, help="default 3 (1 with --smoke)")
    parser.add_argument("--timed-steps", type=int, default=None, help="default 6 (2 with --smoke)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--ablation", action="store_true", help=f"also time {ABLATION}")
    args, began = parse(parser, argv)
    repeats = args.repeats or (1 if args.smoke else 3)
    timed_steps = args.timed_steps or (2 if args.smoke else 6)
    variants = [*VARIANTS, ABLATION] if args.ablation else list(VARIANTS)

    bench = Bench(args.model, args.batch_size * (timed_steps + 1), args.batch_size, args.lr, args.seed)
    runs: list[Run] = []
    for repeat in range(repeats):
        for variant in variants:
            run = bench.run(variant, repeat)
            runs.append(run)
            print(
                f"repeat {repeat} {variant:>20}: {run.seconds / run.timed_steps:.2f} s/step, "
                f"{run.real_tokens_per_s:.1f} real tok/s",
                flush=True,
            )
    summary = summarise(runs, variants)
    markdown = (
        f"P3 local LoRA SFT throughput, {args.model} fp32 CPU, batch {args.batch_size}, "
        f"{repeats} repeats x {timed_steps} timed steps (medians)\n\n" + table(summary, variants)
    )
    print(markdown)
    results = {
        "model": args.model,
        "config": {
            "batch_size": args.batch_size,
            "lr": args.lr,
            "repeats": repeats,
            "timed_steps": timed_steps,
            "warmup_steps": 1,
            "max_length": 256,
            "lora": {"r": 8, "alpha": 16, "dropout": 0.05, "targets": LORA_TARGETS},
            "threads": args.threads,
            "variants": variants,
        },
        "summary": summary,
        "paired_real_tokens_ratio_vs_trainer": {
            v: paired_ratios(runs, v) for v in variants if v != "trainer"
        },
        "runs": [
            {
                "variant": r.variant,
                "repeat": r.repeat,
                "timed_steps": r.timed_steps,
                "seconds": r.seconds,
                "real_tokens": r.real_tokens,
                "padded_tokens": r.padded_tokens,
                "step_seconds": r.step_seconds,
            }
            for r in runs
        ],
    }
    write_results("p3", results, markdown, args, began)
    return results


if __name__ == "__main__":
    main()
