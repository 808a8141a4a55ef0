"""FedPFT's client: it holds only the client model it was sent (the sub-model, FedOT's emulator or,
for FedPETuning, the full model) and its own data. Its tasks: ``fit`` (LoRA + head on its data) and
``apoz`` (its per-neuron activation statistics for the neuron-level distillation).

The model is built from the architecture and FFN widths that came over the wire, with the weights as
received; it is kept in process memory, or also on the client's own disk (``client_cache: disk``),
so a restarted client process need not be sent again what it holds (``fl.broadcast.ClientCache``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from fedtune.algorithms.base import derive_seed
from fedtune.algorithms.fedpft.config import FedPFTConfig
from fedtune.algorithms.fedpft.maths import sample_indices
from fedtune.algorithms.fedpft.wire import (
    APOZ,
    FFN,
    FROZEN,
    TUNED,
    Layout,
    distilled_parameters,
    frozen_parameters,
    layout_from,
    tuned_parameters,
    with_lora,
)
from fedtune.algorithms.local import fit_reply, train_selected
from fedtune.data.classify import (
    ClassExample,
    class_names,
    classification_batches,
    classification_loss,
    encode_classification,
)
from fedtune.fl.broadcast import ClientCache, Loader
from fedtune.fl.federation import ClientContext
from fedtune.fl.payload import Payload, arrays
from fedtune.models.ffn import resize_ffn
from fedtune.models.loading import resolve_device
from fedtune.models.surgery import load_parameters
from fedtune.resources import model_spec
from fedtune.train.ffn_distill import apoz_counts
from fedtune.train.sft import epochs_started


def fit(ctx: ClientContext, msg: Payload) -> Payload:
    """Local training of LoRA + head with cross-entropy; reply with them."""
    model, _, params = _ready_model(ctx, msg)
    examples, pad = _examples(ctx)
    train = ctx.cfg.train
    batches = classification_batches(
        examples,
        train.batch_size,
        pad,
        seed=derive_seed(ctx.cfg.seed, ctx.rnd, ctx.client_id),
        epochs=epochs_started(train.local_epochs),
    )
    result = train_selected(
        ctx, model, params, [], pad_token_id=pad, batches=batches, loss_fn=classification_loss
    )
    return fit_reply(ctx, params, result, TUNED)


def apoz(ctx: ClientContext, msg: Payload) -> Payload:
    """Per-neuron APoZ counts on (a seeded sample of) the client's own data."""
    model, _, _ = _ready_model(ctx, msg)
    examples, pad = _examples(ctx)
    limit = ctx.cfg.section("fedpft").apoz_examples
    chosen = sample_indices(len(examples), limit, derive_seed(ctx.cfg.seed, ctx.rnd, ctx.client_id, "apoz"))
    if chosen is not None:
        examples = [examples[i] for i in chosen]
    batches = classification_batches(examples, ctx.cfg.train.batch_size, pad, seed=None)
    counts = apoz_counts(model, batches)
    reply: Payload = {f"{APOZ}{pos}": zeros.astype(np.float32) for pos, (zeros, _) in counts.items()}
    reply["positions"] = int(next(iter(counts.values()))[1])
    return reply


def _ready_model(ctx: ClientContext, msg: Payload) -> tuple[Any, Layout, dict[str, torch.nn.Parameter]]:
    """The client model with the global LoRA + head from ``msg`` loaded, and those parameters."""
    layout = layout_from(msg)
    model = client_model(ctx, msg, layout)
    params = tuned_parameters(model, layout)
    load_parameters(params, arrays(msg, TUNED), "tuned state from the server")
    return model, layout, params


def client_model(ctx: ClientContext, msg: Payload, layout: Layout) -> Any:
    """The client's model: built from the architecture and FFN widths it was sent, weights as received."""

    def loader(select: Callable[[Any, Layout], dict[str, torch.nn.Parameter]]) -> Loader:
        return lambda model, state, what: load_parameters(select(model, layout), state, what)

    return ClientCache.of(ctx, "fedpft").model(
        msg,
        lambda arch: _model_from_arch(ctx, arch, layout),
        {"frozen": (FROZEN, loader(frozen_parameters)), "ffn": (FFN, loader(distilled_parameters))},
        key=layout,
        what="sub-model",
    )


def _model_from_arch(ctx: ClientContext, arch: str, layout: Layout) -> Any:
    from transformers import AutoConfig, AutoModelForSequenceClassification

    spec = json.loads(arch)
    config = AutoConfig.for_model(spec.pop("model_type"), **spec)
    # Built at the narrowest width, then each FFN resized to its own: a client never allocates
    # (let alone receives) a compressed layer's full FFN.
    config.intermediate_size = min(layout.widths)
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(config)
    resize_ffn(model, dict(enumerate(layout.widths)))
    model = with_lora(model, ctx.cfg.lora, ctx.cfg.seed)
    model.to(resolve_device(model_spec(ctx.cfg.model, ctx.cfg.seed).device))
    return model.eval()


def _examples(ctx: ClientContext) -> tuple[list[ClassExample], int]:
    """The client's data encoded for classification (once per process), and the pad token id."""
    tokenizer = ctx.resources.tokenizer(model_spec(ctx.cfg.model, ctx.cfg.seed))
    section: FedPFTConfig = ctx.cfg.section("fedpft")
    names = class_names(ctx.cfg.data.dataset, list(ctx.data), section.labels)
    examples = ctx.resources.get(
        f"fedpft/examples/{ctx.client_id}",
        lambda: encode_classification(ctx.data, tokenizer, names, ctx.cfg.data.max_length),
    )
    return examples, int(tokenizer.pad_token_id or 0)
