"""P11: what a FedPFT client holds, spends and sends, against FedPETuning (the full model) and FedOT
(the layer-drop emulator), on one encoder and one decoder.

Client models (``fedtune.algorithms.fedpft``'s surgery, attention LoRA r 8 on q, k, v, o + the head):
- ``fedpetuning``: the full model;
- ``fedpft``: every layer's FFN cut to its ``--keep-ratio`` most salient neurons, the first and last
  layer whole (`select_neurons` + `build_submodel`);
- ``fedot``: the first and last layer plus half of the middle ones (`kept_layers(n, 1, 0.5)` +
  `truncate_layers`); LoRA trains on the adapter only, the first and last layer (`adapter_layers`).
Per variant: the parameters the client holds (all, FFN, trained), the peak RSS of a fresh process
that receives only that client model (rebuilt from its config and FFN widths, weights read one tensor
at a time, as a FedPFT client does) and runs ``--probe-steps`` local steps, the median time of one
local step (``train_local``: forward, backward, clipping, AdamW on LoRA + head; batch 16 of
wordnet-lexclass padded to 64 tokens; the variants alternate step by step on the same batches), and
the bytes of a round (fp32). The expected step-time ratio is the share of the layers' matmul
multiply-adds per token that the client model keeps (every layer Linear once, plus attention's
2 x seq_len x hidden); the rest of a step (norms, activations, softmax, embeddings, optimizer) does not
shrink with the FFN, so the measured ratio should sit a little above it. Server side: the wall time
of the layer-level distillation (eq. 13; ``--distill-steps`` on ``--public-examples`` public examples)
and of one neuron-level distillation (eq. 14; ``--neuron-steps``, half of each compressed layer's
neurons frozen by the sub-model's APoZ on 64 client examples), both through `distill_ffns`.

The probes are forked from a ``multiprocessing`` forkserver that has imported torch, transformers and
peft and holds no model: each starts at that baseline RSS (reported) instead of paying ~8 s of imports,
and none inherits the models of this process.

    python bench/fedpft_client.py            # all-MiniLM-L6-v2 and SmolLM2-135M-Instruct, 1 thread
    python bench/fedpft_client.py --smoke    # tiny BERT and Llama, seconds
"""

from __future__ import annotations

import importlib
import json
import multiprocessing
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import Start, base_parser, command_line, markdown_table, median, setup_torch, write_results

MODELS = ("all-minilm-l6-v2", "smollm2-135m-instruct")
SMOKE_MODELS = ("tiny-bert-L4-H32", "tiny-llama-L4-H32")
VARIANTS = ("fedpetuning", "fedpft", "fedot")
DATASET = "wordnet-lexclass"
LORA_R, LORA_ALPHA, LORA_DROPOUT = 8, 48, 0.1  # configs/paper/fedpft-minilm.yaml
LR, DISTILL_LR, CLIP_NORM = 8e-4, 1e-4, 1.0
BYTES_FP32 = 4
MB = 2**20
PRELOAD = ["torch", "transformers", "peft", "fedtune.models.ffn", "fedtune.algorithms.fedpft.wire"]


# ------------------------------------------------------------------ data
def encoded(records: list[Any], tokenizer: Any, seq_len: int) -> list[Any]:
    from fedtune.data.classify import class_names, encode_classification

    return encode_classification(records, tokenizer, class_names(DATASET, records), seq_len)


def padded(batch: dict[str, Any], length: int, pad_token_id: int) -> dict[str, Any]:
    """``batch`` right-padded to ``length`` tokens, so every step computes the same sequence length."""
    import torch.nn.functional as F

    extra = length - batch["input_ids"].shape[1]
    out = {
        **batch,
        "input_ids": F.pad(batch["input_ids"], (0, extra), value=pad_token_id),
        "attention_mask": F.pad(batch["attention_mask"], (0, extra), value=0),
    }
    if "token_type_ids" in batch:  # an encoder's segment ids (0 on padding)
        out["token_type_ids"] = F.pad(batch["token_type_ids"], (0, extra), value=0)
    return out


def train_batches(tokenizer: Any, count: int, batch_size: int, seq_len: int, seed: int) -> list[Any]:
    from fedtune.data.builtin import load_builtin
    from fedtune.data.classify import classification_batches

    records = load_builtin(DATASET, "train")[: count * batch_size]
    pad = int(tokenizer.pad_token_id or 0)
    batches = classification_batches(encoded(records, tokenizer, seq_len), batch_size, pad, seed=seed)
    return [padded(b, seq_len, pad) for b in batches]


def public_batches(tokenizer: Any, examples: int, batch_size: int, seq_len: int, seed: int) -> list[Any]:
    """The server's public set as FedPFT builds it: a seeded sample, class ids unused, dynamic padding."""
    import numpy as np

    from fedtune.data.builtin import load_builtin
    from fedtune.data.classify import ClassExample, classification_batches

    records = load_builtin(DATASET, "public")
    chosen = sorted(np.random.default_rng([seed, 0xFF]).choice(len(records), examples, replace=False))
    ids = [
        tokenizer(records[i].instruction, truncation=True, max_length=seq_len)["input_ids"] for i in chosen
    ]
    rows = [ClassExample(list(row), 0) for row in ids]
    return classification_batches(rows, batch_size, int(tokenizer.pad_token_id or 0), seed=seed)


# ---------------------------------------------------------------- models
def client_models(base: Any, keep_ratio: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """The three client models (no LoRA yet; ``fedpetuning`` is ``base`` itself), and which layers' LoRA
    each trains: every layer's (layout ``None``), except FedOT's (its adapter)."""
    from fedtune.algorithms.fedpft.maths import adapter_layers
    from fedtune.algorithms.fedpft.wire import Layout, kept_layers
    from fedtune.models.ffn import build_submodel, ffn_widths, select_neurons
    from fedtune.models.layers import truncate_layers
    from fedtune.models.surgery import num_decoder_layers

    n, widths = num_decoder_layers(base), ffn_widths(base)
    layers = kept_layers(n, edge=1, drop=0.5)
    models = {
        "fedpetuning": base,
        "fedpft": build_submodel(base, select_neurons(base, keep_ratio, [0, -1])),
        "fedot": truncate_layers(base, list(layers)),
    }
    fedot = Layout(n, layers, tuple(widths[i] for i in layers), tuned=adapter_layers(n, edge=1))
    return models, {"fedpetuning": None, "fedpft": None, "fedot": fedot}


def token_macs(model: Any, seq_len: int) -> dict[str, int]:
    """Multiply-adds per token of the layers' matmuls: ``ffn`` (the FFN projections) and ``all`` (every
    Linear inside a layer, plus attention's scores and weighted sum, 2 x seq_len x hidden per layer)."""
    from torch import nn

    from fedtune.models.ffn import ffn_layers
    from fedtune.models.surgery import layer_pattern, num_decoder_layers, unwrap

    base = unwrap(model)
    pattern = layer_pattern(base)
    linear = sum(
        m.weight.numel()
        for name, m in base.named_modules()
        if type(m) is nn.Linear and "lora_" not in name and pattern.search(f"{name}.weight")
    )
    ffn = sum(p.weight.numel() for f in ffn_layers(base) for p in (*f.inputs, f.output))
    attention = 2 * seq_len * base.config.hidden_size * num_decoder_layers(base)
    return {"ffn": ffn, "all": linear + attention}


def sizes(model: Any, layout: Any) -> dict[str, int]:
    """Parameters the client holds, and the fp32 bytes of what it sends and receives."""
    from fedtune.algorithms.fedpft.wire import count, ffn_parameters, model_params, tuned_parameters

    trained = tuned_parameters(model, layout)
    tuned, ffn = count(trained), count(ffn_parameters(model))
    return {
        "params": model_params(model),
        "ffn_params": ffn,
        "trained_params": tuned,
        "lora_params": count({k: p for k, p in trained.items() if "lora_" in k}),
        "bytes_up_per_round": tuned * BYTES_FP32,
        "bytes_down_per_round": tuned * BYTES_FP32,
        "bytes_down_once": (model_params(model) - tuned) * BYTES_FP32,  # all but LoRA + head
    }


def train_only_tuned(model: Any, layout: Any) -> Any:
    """AdamW over LoRA (of ``layout.tuned``'s layers when set) + head, everything else frozen."""
    from fedtune.algorithms.fedpft.wire import tuned_parameters
    from fedtune.train.optim import build_optimizer

    tuned = tuned_parameters(model, layout)
    for p in model.parameters():
        p.requires_grad_(False)
    for p in tuned.values():
        p.requires_grad_(True)
    return build_optimizer(tuned.values(), "adamw", lr=LR)


def one_step(model: Any, optimizer: Any, batch: Any) -> float:
    from fedtune.data.classify import classification_loss
    from fedtune.train.loop import train_local

    start = time.perf_counter()
    train_local(model, [batch], optimizer, None, steps=1, clip_norm=CLIP_NORM, loss_fn=classification_loss)
    return time.perf_counter() - start


# ---------------------------------------------------------------- probes
def save_client(model: Any, layout: Any, directory: Path, batches: list[Any]) -> None:
    """What a client receives: the architecture, the FFN widths, the layout (FedOT's) and the weights
    (one .npy per tensor)."""
    import dataclasses

    import numpy as np
    import torch

    from fedtune.models.ffn import ffn_widths

    directory.mkdir(parents=True)
    (directory / "layout.json").write_text(json.dumps(layout and dataclasses.asdict(layout)))
    (directory / "arch.json").write_text(model.config.to_json_string(use_diff=False))
    (directory / "widths.json").write_text(json.dumps(ffn_widths(model)))
    names = list(model.state_dict())
    (directory / "names.json").write_text(json.dumps(names))
    for index, tensor in enumerate(model.state_dict().values()):
        np.save(directory / f"{index}.npy", tensor.detach().cpu().numpy())
    torch.save(batches, directory / "batches.pt")


def rebuilt_client(directory: Path) -> tuple[Any, Any]:
    import numpy as np
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification

    from fedtune.algorithms.fedpft.wire import Layout, with_lora
    from fedtune.config import LoraConfig
    from fedtune.models.ffn import resize_ffn

    spec = json.loads((directory / "arch.json").read_text())
    config = AutoConfig.for_model(spec.pop("model_type"), **spec)
    model = AutoModelForSequenceClassification.from_config(config)
    resize_ffn(model, {int(k): v for k, v in json.loads((directory / "widths.json").read_text()).items()})
    state = model.state_dict()
    with torch.no_grad():
        for index, name in enumerate(json.loads((directory / "names.json").read_text())):
            state[name].copy_(torch.from_numpy(np.load(directory / f"{index}.npy")))
    spec = json.loads((directory / "layout.json").read_text())
    layout = None
    if spec is not None:
        tuned = None if spec["tuned"] is None else tuple(spec["tuned"])
        layout = Layout(spec["num_layers"], tuple(spec["layers"]), tuple(spec["widths"]), (), tuned)
    return with_lora(model, LoraConfig(r=LORA_R, alpha=LORA_ALPHA, dropout=LORA_DROPOUT), 0), layout


def client_probe(directory: str, steps: int, threads: int) -> None:
    """In a fresh process: receive the client model in ``directory``, train ``steps`` steps, write RSS."""
    import torch

    torch.set_num_threads(threads)
    folder = Path(directory)
    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    model, layout = rebuilt_client(folder)
    loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    optimizer = train_only_tuned(model, layout)
    batches = torch.load(folder / "batches.pt")
    for step in range(steps):
        one_step(model, optimizer, batches[step % len(batches)])
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result = {"baseline_rss_mb": baseline, "loaded_peak_rss_mb": loaded, "peak_rss_mb": peak}
    (folder / "rss.json").write_text(json.dumps(result))


def probe_rss(context: Any, directory: Path, steps: int, threads: int) -> dict[str, float]:
    # The forkserver's children import their target by module name, which ``__main__`` is not; the
    # package name is, with the checkout on sys.path (above), which the forkserver inherits.
    target = importlib.import_module("bench.fedpft_client").client_probe
    process = context.Process(target=target, args=(str(directory), steps, threads))
    process.start()
    process.join()
    if process.exitcode != 0:
        raise RuntimeError(f"client probe of {directory.name} exited with {process.exitcode}")
    result: dict[str, float] = json.loads((directory / "rss.json").read_text())
    return result


# ---------------------------------------------------------------- server
def timed_distillation(
    full: Any, sub: Any, public: list[Any], steps: int, cap: int | None, **kw: Any
) -> tuple[Any, float]:
    """``distill_ffns`` for ``steps`` steps, or only ``cap`` of them with the time scaled up to ``steps``."""
    from fedtune.train.ffn_distill import distill_ffns

    run = min(steps, cap) if cap else steps
    stats = distill_ffns(full, sub, public, steps=run, lr=DISTILL_LR, mu=0.0, **kw)
    return stats, stats.seconds * steps / run


def distillation_times(
    full: Any, sub: Any, public: list[Any], client_batches: list[Any], args: Any
) -> dict[str, Any]:
    """Seconds of the layer-level distillation and of one neuron-level distillation of ``sub``."""
    import numpy as np

    from fedtune.models.ffn import ffn_layers
    from fedtune.train.ffn_distill import aggregate_apoz, apoz_counts, ffn_grad_masks, neurons_to_freeze

    full.eval()
    sub.eval()
    cap = args.max_server_steps
    initial, initial_s = timed_distillation(full, sub, public, args.distill_steps, cap)
    # APoZ of the round's client data picks the neurons to freeze (eq. 14); 64 examples, as the config.
    frozen = neurons_to_freeze(aggregate_apoz([apoz_counts(sub, client_batches[:4])]), 0.5)
    full_widths = [f.width for f in ffn_layers(full)]
    masked = {
        pos: frozen[pos] if f.width < full_widths[pos] else np.arange(f.width)
        for pos, f in enumerate(ffn_layers(sub))
    }
    neuron, neuron_s = timed_distillation(
        full, sub, public, args.neuron_steps, cap, grad_masks=ffn_grad_masks(sub, masked)
    )
    return {
        "layer_distill_s": initial_s,
        "layer_distill_steps": args.distill_steps,
        "layer_distill_steps_run": initial.steps,
        "layer_distill_loss_first": initial.first_loss,
        "layer_distill_loss_last": initial.last_loss,
        "neuron_distill_s": neuron_s,
        "neuron_distill_steps": args.neuron_steps,
        "neuron_distill_steps_run": neuron.steps,
        "extrapolated": initial.steps < args.distill_steps or neuron.steps < args.neuron_steps,
    }


# ------------------------------------------------------------------ main
def measure_model(name: str, args: Any, context: Any, workdir: Path) -> dict[str, Any]:
    from fedtune.algorithms.fedpft.wire import count, ffn_parameters, with_lora
    from fedtune.config import LoraConfig
    from fedtune.data.builtin import load_builtin
    from fedtune.data.classify import class_names
    from fedtune.models.ffn import ffn_widths
    from fedtune.models.loading import load_encoder_classifier

    names = class_names(DATASET, load_builtin(DATASET, "test")[:1])
    base, tokenizer = load_encoder_classifier(name, len(names), dtype="fp32", device="cpu", seed=args.seed)
    batches = train_batches(
        tokenizer, args.warmup_steps + args.timed_steps, args.batch_size, args.seq_len, args.seed
    )
    plain, layouts = client_models(base, args.keep_ratio)
    macs = {variant: token_macs(model, args.seq_len) for variant, model in plain.items()}
    for variant, model in plain.items():
        save_client(model, layouts[variant], workdir / name / variant, batches[: args.probe_steps])
    models = {
        v: with_lora(m, LoraConfig(r=LORA_R, alpha=LORA_ALPHA, dropout=LORA_DROPOUT), args.seed)
        for v, m in plain.items()
    }
    optimizers = {v: train_only_tuned(m, layouts[v]) for v, m in models.items()}
    step_seconds: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for index, batch in enumerate(batches):
        for variant in VARIANTS:
            seconds = one_step(models[variant], optimizers[variant], batch)
            if index >= args.warmup_steps:
                step_seconds[variant].append(seconds)
    rss = {v: probe_rss(context, workdir / name / v, args.probe_steps, args.threads) for v in VARIANTS}
    full_macs, full_step = macs["fedpetuning"]["all"], median(step_seconds["fedpetuning"])
    variants: dict[str, Any] = {}
    for variant in VARIANTS:
        step = median(step_seconds[variant])
        variants[variant] = {
            **sizes(models[variant], layouts[variant]),
            **rss[variant],
            "step_s": step,
            "step_ratio": step / full_step,
            "expected_step_ratio": macs[variant]["all"] / full_macs,
            "ffn_macs_per_token": macs[variant]["ffn"],
            "macs_per_token": macs[variant]["all"],
            "step_seconds": step_seconds[variant],
        }
    # Re-sent after a neuron-level distillation: the compressed layers' FFNs only.
    full_widths = ffn_widths(plain["fedpetuning"])
    compressed = [pos for pos, width in ffn_widths(plain["fedpft"]).items() if width < full_widths[pos]]
    sub_ffn = count(ffn_parameters(models["fedpft"], positions=compressed))
    variants["fedpft"]["bytes_ffn_resend"] = sub_ffn * BYTES_FP32
    full_ffn = macs["fedpetuning"]["ffn"]
    server = distillation_times(
        models["fedpetuning"],
        models["fedpft"],
        public_batches(tokenizer, args.public_examples, args.batch_size, args.seq_len, args.seed),
        batches,
        args,
    )
    return {
        "model": name,
        "num_layers": int(base.config.num_hidden_layers),
        "ffn_share": full_ffn / full_macs,
        "ffn_removed_fraction": 1 - macs["fedpft"]["ffn"] / full_ffn,
        "variants": variants,
        "server": server,
    }


def model_table(entry: dict[str, Any]) -> str:
    full_params = entry["variants"]["fedpetuning"]["params"]
    rows = []
    for variant, v in entry["variants"].items():
        resend = v.get("bytes_ffn_resend")
        rows.append(
            [
                variant,
                f"{v['params'] / 1e6:.2f} ({v['params'] / full_params:.2f}x)",
                f"{v['ffn_params'] / 1e6:.2f}",
                f"{v['trained_params'] / 1e3:.1f}",
                f"{v['peak_rss_mb']:.0f} (+{v['peak_rss_mb'] - v['baseline_rss_mb']:.0f})",
                f"{v['step_s'] * 1e3:.1f}",
                f"{v['step_ratio']:.2f}x",
                f"{v['expected_step_ratio']:.2f}x",
                f"{v['bytes_up_per_round'] / MB:.3f}",
                f"{v['bytes_down_once'] / MB:.1f}",
                "-" if resend is None else f"{resend / MB:.1f}",
            ]
        )
    headers = [
        "client",
        "params M (vs full)",
        "FFN M",
        "trained K",
        "peak RSS MB (+model)",
        "step ms",
        "step vs full",
        "expected",
        "up = down/round MB",
        "down once MB",
        "FFN re-send MB",
    ]
    server = entry["server"]
    scaled = (
        f" (timed over {server['layer_distill_steps_run']} and {server['neuron_distill_steps_run']} steps, "
        "scaled up)"
        if server["extrapolated"]
        else ""
    )
    return "\n".join(
        [
            f"## {entry['model']} ({entry['num_layers']} layers; FFN = {entry['ffn_share']:.0%} of the "
            f"layers' multiply-adds, FedPFT removes {entry['ffn_removed_fraction']:.0%} of it)",
            "",
            markdown_table(headers, rows),
            "",
            f"Server: layer-level distillation {server['layer_distill_steps']} steps "
            f"{server['layer_distill_s']:.1f} s (loss {server['layer_distill_loss_first']:.3g} -> "
            f"{server['layer_distill_loss_last']:.3g}); one neuron-level distillation "
            f"{server['neuron_distill_steps']} steps {server['neuron_distill_s']:.1f} s{scaled}.",
        ]
    )


def main(argv: list[str] | None = None) -> None:
    parser = base_parser(__doc__.splitlines()[0])
    parser.set_defaults(threads=1)
    parser.add_argument("--models", nargs="+", default=None, help=f"default {' '.join(MODELS)}")
    parser.add_argument("--keep-ratio", type=float, default=0.25)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--warmup-steps", type=int, default=3)
    parser.add_argument("--timed-steps", type=int, default=20)
    parser.add_argument("--probe-steps", type=int, default=3)
    parser.add_argument("--distill-steps", type=int, default=200)
    parser.add_argument("--neuron-steps", type=int, default=50)
    parser.add_argument("--public-examples", type=int, default=512)
    parser.add_argument(
        "--max-server-steps",
        type=int,
        default=None,
        help="run at most this many steps of each distillation and scale its time up",
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.warmup_steps, args.timed_steps, args.probe_steps = 1, 2, 1
        args.distill_steps, args.neuron_steps, args.public_examples = 2, 2, 32
    setup_torch(args.threads)
    began = Start()
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    models = args.models or (SMOKE_MODELS if args.smoke else MODELS)
    with tempfile.TemporaryDirectory(prefix="p11-") as workdir:
        entries = [measure_model(name, args, context, Path(workdir)) for name in models]
    settings = {
        k: getattr(args, k)
        for k in ("keep_ratio", "batch_size", "seq_len", "warmup_steps", "timed_steps", "probe_steps")
    }
    settings.update(
        distill_steps=args.distill_steps,
        neuron_steps=args.neuron_steps,
        public_examples=args.public_examples,
        max_server_steps=args.max_server_steps,
        lora={"r": LORA_R, "alpha": LORA_ALPHA, "dropout": LORA_DROPOUT},
        lr=LR,
        threads=args.threads,
    )
    command = command_line(__file__, argv)
    markdown = "\n\n".join(
        [
            f"# P11: FedPFT client vs FedPETuning (full model) and FedOT (layer drop) on {DATASET}",
            f"Batch {args.batch_size} x {args.seq_len} tokens, LoRA r {LORA_R} on q, k, v, o + head, "
            f"AdamW; median of {args.timed_steps} steps after {args.warmup_steps} warm-up, the variants "
            f"alternating; {args.threads} thread(s), fp32, CPU. Peak RSS: a fresh process holding only "
            f"the client model after {args.probe_steps} local steps (in brackets: above the process's "
            "baseline with torch/transformers/peft imported). Expected step ratio: the share of the "
            "layers' matmul multiply-adds the client keeps. Bytes fp32.",
            *[model_table(entry) for entry in entries],
            f"`{command}`",
        ]
    )
    results = {"settings": settings, "models": entries}
    write_results("p11", results, markdown, args, began)
    print(markdown)


if __name__ == "__main__":
    main()
