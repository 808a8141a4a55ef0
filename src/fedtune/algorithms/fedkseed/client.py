"""FedKSeed's client task: catch up with the history, take zeroth-order steps, reply with K scalars.

What a client holds: its data, the process's ``SeedReplica`` of the global model, the round's seeds.
What it sends: the K per-seed sums of its scalar gradient estimates (and its statistics); never a weight.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from fedtune.algorithms.adapters import client_examples
from fedtune.algorithms.base import derive_seed
from fedtune.algorithms.fedkseed.maths import accumulate_per_seed, add_direction, projected_gradient
from fedtune.algorithms.fedkseed.replica import SeedReplica
from fedtune.data.tokenize import make_batches
from fedtune.fl.federation import ClientContext, StepReporter
from fedtune.fl.payload import Payload, arrays
from fedtune.models.loading import resolve_device, resolve_dtype
from fedtune.resources import Resources
from fedtune.train.loop import Batch, peak_rss_mb, sft_loss, steps_for

MODEL = "model/"
"""Prefix of the model's arrays in a round message that sends the model instead of the history."""


def tuned_lm(resources: Resources) -> tuple[Any, Any]:
    """The model FedKSeed tunes, and its tokenizer: the run's ``model:``, in fp32 where ``model.dtype`` is
    auto. (auto means bf16 on a GPU, whose 8-bit mantissa rounds away FedKSeed's steps: at lr 3e-7 a
    step moves a weight by far less than half its bf16 spacing, and the eps-probes' round trip leaves
    rounding drift larger than the step. On the CPU auto is fp32 already.) A dtype set explicitly is
    kept."""
    spec = resources.base_spec
    if spec.dtype == "auto" and resolve_dtype("auto", resolve_device(spec.device)) != torch.float32:
        spec = replace(spec, dtype="fp32")
    return resources.model(spec)


def process_replica(resources: Resources, seeds: np.ndarray, lr: float) -> SeedReplica:
    """This process's replica of the global model (the run's ``model:``, loaded once, all parameters)."""

    def build() -> SeedReplica:
        model, _ = tuned_lm(resources)
        return SeedReplica(dict(model.named_parameters()), seeds, lr)

    replica = resources.get("fedkseed/replica", build)
    if not np.array_equal(replica.seeds, seeds):
        raise ValueError("fedkseed: the round's seeds are not the candidate seeds this process replays with")
    return replica


def bring_up_to_date(replica: SeedReplica, msg: Payload) -> None:
    """Move ``replica`` to the message's version: load the model it sends, else replay its history."""
    sent = arrays(msg, MODEL)
    if sent:
        replica.load(sent, int(msg["history_from"]))
    history = np.asarray(msg["history"], dtype=np.float64)
    replica.catch_up(int(msg["history_from"]), history)


@dataclass
class ZerothOrderResult:
    scalars: np.ndarray
    """``[K]``: the sums of the step's scalar estimates per seed index."""
    loss: float
    examples: int
    tokens: int


def batch_loss(model: torch.nn.Module, batch: Batch) -> float:
    """The mean response-token NLL of ``batch`` under the model's current weights (no graph)."""
    with torch.no_grad():
        total, targets = sft_loss(model, batch)
    return float(total) / max(1, targets)


def zeroth_order_steps(
    model: torch.nn.Module,
    params: Sequence[torch.Tensor],
    batches: Sequence[Batch],
    picks: np.ndarray,
    seeds: np.ndarray,
    *,
    eps: float,
    lr: float,
    report: StepReporter,
    taken: list[tuple[int, float]],
) -> ZerothOrderResult:
    """One step per entry of ``picks`` (seed indices) on ``batches`` in turn: perturb by +eps z, -2 eps z,
    put back +eps z, then w <- w - lr g z (appended to ``taken`` as ``(seed, -lr g)``); z regenerated
    from the seed each time, never stored."""
    device = params[0].device
    gradients, losses, examples, tokens = [], [], 0, 0
    for step, index in enumerate(picks.tolist()):
        batch = {k: v.to(device) for k, v in batches[step % len(batches)].items()}
        seed = int(seeds[index])
        add_direction(params, seed, eps)
        loss_plus = batch_loss(model, batch)
        add_direction(params, seed, -2.0 * eps)
        loss_minus = batch_loss(model, batch)
        add_direction(params, seed, eps)
        gradient = projected_gradient(loss_plus, loss_minus, eps)
        add_direction(params, seed, -lr * gradient)
        taken.append((seed, -lr * gradient))
        gradients.append(gradient)
        losses.append(0.5 * (loss_plus + loss_minus))
        examples += int(batch["input_ids"].shape[0])
        tokens += int(batch["attention_mask"].sum())
        report(step + 1, len(picks), losses[-1])
    scalars = accumulate_per_seed(picks.tolist(), gradients, len(seeds))
    return ZerothOrderResult(scalars, float(np.mean(losses)), examples, tokens)


def round_batches(ctx: ClientContext) -> tuple[list[Batch], int]:
    """This round's batches of the client's data (seeded by run, round and client) and its step count."""
    _, tokenizer = tuned_lm(ctx.resources)
    train = ctx.cfg.train
    batches = make_batches(
        client_examples(ctx),
        train.batch_size,
        int(tokenizer.pad_token_id or 0),
        seed=derive_seed(ctx.cfg.seed, ctx.rnd, ctx.client_id),
        bucketing=ctx.cfg.data.length_bucketing,
    )
    return batches, steps_for(len(batches), train.local_epochs, 1, train.max_steps)


def fit(ctx: ClientContext, msg: Payload) -> Payload:
    """Catch up with the message's history, take the round's zeroth-order steps, reply with the K
    per-seed scalar sums under ``scalars`` and the round's seeds under ``seeds``."""
    if not ctx.data:
        raise ValueError("fedkseed: this client has no training examples")
    section = ctx.cfg.section("fedkseed")
    seeds = np.asarray(msg["seeds"], dtype=np.int64)
    replica = process_replica(ctx.resources, seeds, section.lr)
    bring_up_to_date(replica, msg)
    model, _ = tuned_lm(ctx.resources)
    model.eval()  # no dropout: both forward passes of a step must see the same function
    batches, steps = round_batches(ctx)
    probabilities = np.asarray(msg["probs"], dtype=np.float64) if "probs" in msg else None
    rng = np.random.default_rng(derive_seed(ctx.cfg.seed, ctx.rnd, ctx.client_id, "fedkseed"))
    picks = rng.choice(len(seeds), size=steps, p=probabilities)
    device = next(model.parameters()).device
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    with replica.local_steps(section.restore) as taken:
        result = zeroth_order_steps(
            model,
            replica.tensors,
            batches,
            picks,
            seeds,
            eps=section.eps,
            lr=section.lr,
            report=ctx.report,
            taken=taken,
        )
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else peak_rss_mb()
    return {
        "seeds": seeds,
        "scalars": result.scalars,
        "num_examples": len(ctx.data),
        "trained_examples": result.examples,
        "train_loss": result.loss,
        "tokens": result.tokens,
        "peak_mem_mb": float(peak),
    }
