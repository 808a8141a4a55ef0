"""P12: multiple-choice scoring with each question's prompt read once vs every (prompt, choice) whole.

Both sides score the same questions with the same model, alternating within every repeat:
- ``whole``: every (prompt, choice) sequence through the model, in batches (the lm-eval way);
- ``shared``: each prompt's key/values computed once, every choice continuing from a copy
  (``fedtune.eval.scoring.shared_prompt_log_likelihoods``, the default of every evaluation).
Reported per model and task: median seconds of each side, the speed-up, the largest score
difference (float rounding only) and how many questions get the same ``acc`` and ``acc_norm``
prediction. Tasks are the built-in multiple-choice sets (alpaca template, max_length 128).

    python bench/choice_scoring.py                  # SmolLM2-135M, Gemma-3-270M, Qwen2.5-0.5B
    python bench/choice_scoring.py --smoke          # tiny random model, seconds
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import base_parser, markdown_table, median, parse, write_results

MODELS = ["smollm2-135m-instruct", "gemma-3-270m", "qwen2.5-coder-0.5b-instruct"]
TASKS = {"wordnet-wic": 48, "wordnet-hypernym-yn": 48, "wordnet-defchoice": 24}


def _questions(task: str, count: int, tokenizer: Any) -> tuple[list[str], list[Any], list[int]]:
    from fedtune.data.builtin import load_builtin
    from fedtune.data.templates import build_prompt

    records = load_builtin(task, "test")[:count]
    return (
        [build_prompt(r, "alpaca", tokenizer) for r in records],
        [r.choices for r in records],
        [r.label for r in records],
    )


def measure(model: Any, tokenizer: Any, task: str, count: int, repeats: int) -> dict[str, Any]:
    from fedtune.eval.metrics import choice_predictions
    from fedtune.eval.scoring import choice_log_likelihoods

    prompts, choices, _ = _questions(task, count, tokenizer)
    seconds: dict[str, list[float]] = {"whole": [], "shared": []}
    scores: dict[str, list[list[float]]] = {}
    for _ in range(repeats):
        for side in seconds:
            start = time.perf_counter()
            scores[side] = choice_log_likelihoods(
                model,
                tokenizer,
                prompts,
                choices,
                batch_size=8,
                max_length=128,
                share_prompts=side == "shared",
            )
            seconds[side].append(time.perf_counter() - start)
    diff = max(
        abs(a - b)
        for whole, shared in zip(scores["whole"], scores["shared"], strict=True)
        for a, b in zip(whole, shared, strict=True)
    )
    same = {}
    for metric, normalize in (("acc", False), ("acc_norm", True)):
        whole = choice_predictions(scores["whole"], choices, normalize=normalize)
        shared = choice_predictions(scores["shared"], choices, normalize=normalize)
        same[metric] = sum(a == b for a, b in zip(whole, shared, strict=True))
    whole_s, shared_s = median(seconds["whole"]), median(seconds["shared"])
    return {
        "questions": len(prompts),
        "choices": sum(len(c) for c in choices),
        "seconds": seconds,
        "whole_s": whole_s,
        "shared_s": shared_s,
        "speedup": whole_s / shared_s,
        "max_abs_diff": diff,
        "same_acc": same["acc"],
        "same_acc_norm": same["acc_norm"],
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = base_parser(__doc__.splitlines()[0] if __doc__ else "P12")
    parser.add_argument("--models", nargs="+", default=None, help=f"default {' '.join(MODELS)}")
    parser.add_argument("--repeats", type=int, default=None, help="default 3 (1 with --smoke)")
    args, began = parse(parser, argv)
    from fedtune.models.loading import load_causal_lm

    models = args.models or (["tiny-llama"] if args.smoke else MODELS)
    tasks = {task: 4 for task in TASKS} if args.smoke else TASKS
    repeats = args.repeats or (1 if args.smoke else 3)
    results: dict[str, Any] = {}
    rows = []
    for name in models:
        model, tokenizer = load_causal_lm(name, dtype="fp32", device="cpu", seed=args.seed)
        for task, count in tasks.items():
            result = measure(model, tokenizer, task, count, repeats)
            results[f"{name}/{task}"] = result
            rows.append(
                [
                    name,
                    task,
                    f"{result['questions']} / {result['choices']}",
                    f"{result['whole_s']:.2f}",
                    f"{result['shared_s']:.2f}",
                    f"{result['speedup']:.2f}x",
                    f"{result['max_abs_diff']:.1e}",
                    f"{result['same_acc']} / {result['same_acc_norm']}",
                ]
            )
            print(" | ".join(map(str, rows[-1])), flush=True)
    headers = ["model", "task", "questions / choices", "whole s", "shared s", "speed-up", "max |diff|"]
    headers.append("same acc / acc_norm prediction")
    markdown = "\n".join(
        [
            "# P12: choice scoring, each prompt read once vs every (prompt, choice) whole",
            "",
            f"fp32, CPU, {args.threads} thread(s), batch 8, alpaca template, max_length 128; median of "
            f"{repeats} repeat(s), the sides alternating.",
            "",
            markdown_table(headers, rows),
        ]
    )
    print(markdown)
    record = {"threads": args.threads, "repeats": repeats, "results": results}
    write_results("p12", record, markdown, args, began)
    return record


if __name__ == "__main__":
    main()
