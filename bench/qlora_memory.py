"""memory-qlora: what a LoRA client's base model costs at fp32, bf16, 8-bit and 4-bit (``model.dtype``,
``model.quantization``), with and without ``train.gradient_checkpointing``, and whether a short FedIT
run keeps its quality on the quantised base.

Steps: every (model, setting, checkpointing) is its own fresh process, so its peak RSS is its own. It
loads the model as a FedIT client does (``load_causal_lm``, LoRA r 8 on q and v), builds fixed batches
of wordnet-instruct (``--batch-size`` x ``--seq-len`` tokens, right-padded, responses labelled), resets
Linux's peak-RSS mark (``/proc/self/clear_refs``) once the model is loaded, and runs ``--warmup`` +
``--steps`` local steps through ``train_local``. Reported: the peak RSS of loading, the peak RSS of the
steps, the RSS after them split into the process's own (anonymous) memory and mapped-file pages (an
unquantised checkpoint's weights are memory-mapped), the median step time and the first step's loss
(the same data: quantisation error only). fp32 without checkpointing is the yardstick.

Quality: ``configs/demo/fedit-smollm2.yaml`` cut short (``QUALITY_RUN``: 2 rounds, 2 clients, a few
steps, 16 test examples), once per setting as its own ``python -m fedtune run`` process; the test
perplexity and Rouge-L of the base model (round 0) and of the final adapter.

    python bench/qlora_memory.py                       # SmolLM2-135M: steps, then quality
    python bench/qlora_memory.py --part steps --models smollm2-135m-instruct qwen2.5-coder-0.5b-instruct
    python bench/qlora_memory.py --part quality --settings fp32 bf16     # in pieces: entries are kept
    python bench/qlora_memory.py --smoke               # a tiny model, seconds
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ROOT, Start, base_parser, markdown_table, median, setup_torch, write_results

NAME = "memory-qlora"
MODELS = ("smollm2-135m-instruct",)
SMOKE_MODEL = "tiny-llama-L2-H64"
SETTINGS: dict[str, dict[str, Any]] = {
    "fp32": {"dtype": "fp32", "quantization": None},
    "bf16": {"dtype": "bf16", "quantization": None},
    "8-bit": {"dtype": "fp32", "quantization": 8},
    "4-bit": {"dtype": "fp32", "quantization": 4},
}
"""Each setting's ``model.dtype`` and ``model.quantization`` (4-bit computes in fp32, CPU's dtype)."""
LORA = {"r": 8, "alpha": 16, "dropout": 0.05, "target_modules": ["q_proj", "v_proj"]}
QUALITY_CONFIG = ROOT / "configs" / "demo" / "fedit-smollm2.yaml"
QUALITY_RUN = [
    "fed.rounds=2",
    "data.partition.num_clients=2",
    "train.max_steps=6",
    "eval.every=1",
    "eval.max_examples=16",
    "eval.max_new_tokens=24",
    "progress=false",
]
SMOKE_QUALITY_CONFIG = ROOT / "configs" / "test" / "fedit-tiny.yaml"
SMOKE_QUALITY_RUN = ["fed.rounds=1", "progress=false", f"model.name={SMOKE_MODEL}"]


# ------------------------------------------------------------------ one probe, in its own process
def _status_mb(field: str = "VmRSS") -> float:
    """A memory line of ``/proc/self/status`` in MiB: VmRSS, or its parts RssAnon (the process's own
    memory) and RssFile (pages of mapped files, e.g. a memory-mapped checkpoint: the kernel can drop and
    re-read them)."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0
    raise OSError(f"no {field} in /proc/self/status")


def _reset_peak_rss() -> bool:
    """Linux: restart the peak-RSS mark (VmHWM) from the current RSS; False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def _batches(tokenizer: Any, batch_size: int, seq_len: int, count: int) -> list[dict[str, Any]]:
    import torch.nn.functional as F

    from fedtune.data.builtin import load_builtin
    from fedtune.data.tokenize import collate, encode_records

    records = load_builtin("wordnet-instruct", "train")[: batch_size * count]
    pad = int(tokenizer.pad_token_id or 0)
    batches = []
    for start in range(0, len(records), batch_size):
        batch = collate(
            encode_records(records[start : start + batch_size], tokenizer, "alpaca", seq_len), pad
        )
        extra = seq_len - batch["input_ids"].shape[1]
        batches.append(
            {
                "input_ids": F.pad(batch["input_ids"], (0, extra), value=pad),
                "attention_mask": F.pad(batch["attention_mask"], (0, extra), value=0),
                "labels": F.pad(batch["labels"], (0, extra), value=-100),
            }
        )
    return batches


def probe(spec: dict[str, Any]) -> dict[str, Any]:
    """Load, attach LoRA, reset the peak, train; what ``measure`` reports for one setting (only the
    loading's numbers when ``spec`` asks for no steps)."""
    import torch

    from fedtune.models.loading import load_causal_lm
    from fedtune.models.lora import attach_lora
    from fedtune.train.loop import peak_rss_mb, train_local
    from fedtune.train.optim import build_optimizer

    torch.set_num_threads(spec["threads"])
    start = time.perf_counter()
    model, tokenizer = load_causal_lm(
        spec["model"], dtype=spec["dtype"], device="cpu", quantization=spec["quantization"]
    )
    load_s = time.perf_counter() - start
    # Loading reads the whole full-precision checkpoint, also for a model it quantises.
    loading = {"load_s": load_s, "load_peak_rss_mb": peak_rss_mb(), "loaded_rss_mb": _status_mb()}
    if spec["warmup"] + spec["steps"] == 0:
        return loading
    lora = attach_lora(model, seed=0, **LORA)
    weights_mb = sum(p.numel() * p.element_size() for p in lora.parameters()) / 2**20
    batches = _batches(tokenizer, spec["batch_size"], spec["seq_len"], spec["warmup"] + spec["steps"])
    optimizer = build_optimizer([p for p in lora.parameters() if p.requires_grad], "adamw", lr=1e-3)
    reset = _reset_peak_rss()
    times, losses = [], []
    for batch in batches:
        result = train_local(
            lora, [batch], optimizer, None, steps=1, gradient_checkpointing=spec["checkpointing"]
        )
        times.append(result.seconds)
        losses.append(result.loss)
    return {
        **loading,
        "weights_mb": weights_mb,
        "peak_rss_mb": peak_rss_mb(),
        "anon_rss_after_mb": _status_mb("RssAnon"),
        "file_rss_after_mb": _status_mb("RssFile"),
        "peak_is_training_only": reset,
        "step_s": median(times[spec["warmup"] :]),
        "step_times_s": times,
        "first_loss": losses[0],
    }


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    """``probe`` in a fresh interpreter (its own peak RSS), with ``--threads`` OpenMP threads."""
    env = {**os.environ, "OMP_NUM_THREADS": str(spec["threads"]), "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, str(Path(__file__).resolve()), "--probe", json.dumps(spec)]
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    _check(done, command)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _check(done: subprocess.CompletedProcess[str], command: list[str]) -> None:
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited with {done.returncode}:\n{done.stderr[-3000:]}")


# ------------------------------------------------------------------ quality: short FedIT runs
def quality_run(config: Path, overrides: list[str], setting: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    from fedtune.report.io import read_metrics

    quantization = "null" if setting["quantization"] is None else str(setting["quantization"])
    command = [sys.executable, "-m", "fedtune", "run", str(config), *overrides]
    command += [f"model.dtype={setting['dtype']}", f"model.quantization={quantization}", "-o", str(run_dir)]
    print(" ".join(command), file=sys.stderr, flush=True)
    start = time.perf_counter()
    _check(subprocess.run(command, capture_output=True, text=True), command)
    seconds = time.perf_counter() - start
    rows = read_metrics(run_dir)
    evaluated = [row for row in rows if "eval" in row]
    base, final = evaluated[0], evaluated[-1]
    return {
        "seconds": seconds,
        "base": {k: base["eval"][k] for k in ("perplexity", "rougeL") if k in base["eval"]},
        "final": {k: final["eval"][k] for k in ("perplexity", "rougeL") if k in final["eval"]},
        "train_loss": [row["train_loss"] for row in rows if row.get("train_loss") is not None],
        "client_peak_mem_mb": max(float(row.get("client_peak_mem_mb", 0.0)) for row in rows),
    }


# ------------------------------------------------------------------ tables
def steps_table(steps: dict[str, dict[str, dict[str, Any]]], loading: dict[str, dict[str, Any]]) -> str:
    """One row per model and setting; the loading peak from the step probe, else from ``--part loading``."""
    rows = []
    for model, by_setting in steps.items():
        yardstick = by_setting.get("fp32, no checkpointing")
        for label, r in by_setting.items():
            load_peak = r.get("load_peak_rss_mb") or loading.get(model, {}).get(label.split(",")[0], {}).get(
                "load_peak_rss_mb"
            )
            after = (
                f"{r['anon_rss_after_mb']:.0f} / {r['file_rss_after_mb']:.0f}"
                if "anon_rss_after_mb" in r
                else "-"
            )
            rows.append(
                [
                    model,
                    label,
                    f"{r['weights_mb']:.0f}",
                    f"{load_peak:.0f}" if load_peak else "-",
                    f"{r['peak_rss_mb']:.0f}",
                    f"{r['peak_rss_mb'] / yardstick['peak_rss_mb']:.2f}x" if yardstick else "-",
                    after,
                    f"{r['step_s']:.2f}",
                    f"{r['step_s'] / yardstick['step_s']:.2f}x" if yardstick else "-",
                    f"{r['first_loss']:.3f}",
                ]
            )
    headers = ["model", "setting", "weights (MB)", "peak RSS loading (MB)", "peak RSS training (MB)"]
    headers += ["vs fp32", "RSS after: anon / file (MB)", "step (s)", "vs fp32", "loss, step 1"]
    return markdown_table(headers, rows)


def quality_table(quality: dict[str, dict[str, Any]]) -> str:
    def cell(values: dict[str, float], key: str, fmt: str) -> str:
        return format(values[key], fmt) if key in values else "-"

    rows = [
        [
            label,
            cell(r["base"], "perplexity", ".2f"),
            cell(r["final"], "perplexity", ".2f"),
            cell(r["base"], "rougeL", ".3f"),
            cell(r["final"], "rougeL", ".3f"),
            f"{r['train_loss'][-1]:.3f}" if r["train_loss"] else "-",
            f"{r['seconds']:.0f}",
        ]
        for label, r in quality.items()
    ]
    headers = ["setting", "ppl base", "ppl final", "Rouge-L base", "Rouge-L final", "train loss, last round"]
    headers += ["run (s)"]
    return markdown_table(headers, rows)


def main(argv: list[str] | None = None) -> None:
    parser = base_parser(__doc__.splitlines()[0])
    parser.set_defaults(threads=1)
    parser.add_argument("--part", choices=("steps", "loading", "quality", "all"), default="all")
    parser.add_argument("--models", nargs="+", default=None, help=f"default {' '.join(MODELS)}")
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--probe", help=argparse.SUPPRESS)  # one setting's spec (JSON), in a fresh process
    args = parser.parse_args(argv)
    if args.probe:
        print(json.dumps(probe(json.loads(args.probe))))
        return
    setup_torch(args.threads)
    start = Start()
    models = args.models or ([SMOKE_MODEL] if args.smoke else list(MODELS))
    if args.smoke:
        args.warmup, args.steps = 0, 1
    previous = _previous(args)
    results: dict[str, Any] = {
        "settings": SETTINGS,
        "steps_setup": {
            "batch_size": args.batch_size,
            "seq_len": args.seq_len,
            "warmup": args.warmup,
            "steps": args.steps,
            "threads": args.threads,
            "lora": LORA,
        },
        "steps": previous.get("steps", {}),
        "loading": previous.get("loading", {}),
        "quality_setup": {"config": "", "overrides": []},
        "quality": previous.get("quality", {}),
    }
    if args.part in ("steps", "all"):
        for model in models:
            by_setting = results["steps"].setdefault(model, {})
            for label in args.settings:
                for checkpointing in (False, True):
                    spec = {
                        "model": model,
                        **SETTINGS[label],
                        "checkpointing": checkpointing,
                        "batch_size": args.batch_size,
                        "seq_len": args.seq_len,
                        "warmup": args.warmup,
                        "steps": args.steps,
                        "threads": args.threads,
                    }
                    key = f"{label}, {'checkpointing' if checkpointing else 'no checkpointing'}"
                    print(f"{model} {key}", file=sys.stderr, flush=True)
                    by_setting[key] = measure(spec)
    if args.part == "loading":  # the loading peak alone (one process per model and setting)
        for model in models:
            for label in args.settings:
                spec = {"model": model, **SETTINGS[label], "warmup": 0, "steps": 0, "threads": args.threads}
                print(f"{model} {label}: loading", file=sys.stderr, flush=True)
                results["loading"].setdefault(model, {})[label] = measure(spec)
    config = SMOKE_QUALITY_CONFIG if args.smoke else QUALITY_CONFIG
    overrides = SMOKE_QUALITY_RUN if args.smoke else QUALITY_RUN
    results["quality_setup"] = {"config": str(config.relative_to(ROOT)), "overrides": overrides}
    if args.part in ("quality", "all"):
        with tempfile.TemporaryDirectory(prefix="qlora-quality-") as tmp:
            for label in args.settings:
                run_dir = Path(tmp) / label
                results["quality"][label] = quality_run(config, overrides, SETTINGS[label], run_dir)
    write_results(NAME, results, _markdown(results, args), args, start)


def _previous(args: Any) -> dict[str, Any]:
    """What an earlier run wrote into the same file, when this one measures a part (``--part``): its
    entries stay unless measured again (a long benchmark can run in pieces: ``--settings``)."""
    if args.part == "all":
        return {}
    from bench.common import results_name

    path = Path(args.results_dir) / f"{results_name(NAME, args.smoke)}.json"
    if not path.is_file():
        return {}
    record = json.loads(path.read_text())
    return {part: record.get(part, {}) for part in ("steps", "loading", "quality")}


def _markdown(results: dict[str, Any], args: Any) -> str:
    setup = results["steps_setup"]
    quality = results["quality_setup"]
    lines = [
        "memory-qlora: a LoRA client's base model at fp32, bf16, 8-bit and 4-bit, with and without "
        "gradient checkpointing (CPU)",
        "",
        f"Steps: batch {setup['batch_size']} x {setup['seq_len']} tokens (wordnet-instruct, right-padded), "
        f"LoRA r {LORA['r']} on q and v, AdamW, {setup['threads']} thread(s); each setting in its own "
        f"process. Peak RSS loading: the process's peak once the model is loaded (quantising reads the "
        f"whole fp32 checkpoint); peak RSS training: the peak of {setup['warmup']} warm-up + "
        f"{setup['steps']} timed steps, counted from the RSS after loading; RSS after: the process's own "
        "(anonymous) memory and the pages of memory-mapped files (the checkpoint's weights that are not "
        "copied: the kernel can drop and re-read them); step time: the median of the timed steps.",
        "",
        steps_table(results["steps"], results.get("loading", {}))
        if results["steps"]
        else "(steps not measured)",
        "",
        f"Quality: `{quality['config']}` with {' '.join(quality['overrides'])}; test perplexity and "
        "Rouge-L of the base model (round 0) and the final adapter, each setting its own run.",
        "",
        quality_table(results["quality"]) if results["quality"] else "(quality not measured)",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
