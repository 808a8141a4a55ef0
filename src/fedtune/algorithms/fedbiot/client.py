"""FedBiOT's client: it holds only the emulator model it was sent and its own data.

The model is built from the architecture that came over the wire, with the weights as received; it
is kept in process memory, or also on the client's own disk (``client_cache: disk``), so a restarted
client process need not be sent again what it holds (``fl.broadcast.ClientCache``).
"""

from __future__ import annotations

import json
from typing import Any

import torch

from fedtune.algorithms.adapters import ADAPTER
from fedtune.algorithms.fedbiot.config import FedBiOTConfig
from fedtune.algorithms.fedbiot.wire import (
    EMULATOR,
    FROZEN,
    adapter_parameters,
    part_parameters,
    split_from_layout,
    with_adapter_lora,
)
from fedtune.algorithms.local import fit_reply, train_selected
from fedtune.data.tokenize import encode_records
from fedtune.fl.broadcast import ClientCache, Loader
from fedtune.fl.federation import ClientContext
from fedtune.fl.payload import Payload, arrays
from fedtune.models.loading import resolve_device
from fedtune.models.surgery import LayerSplit, load_parameters
from fedtune.resources import model_spec


def fit(ctx: ClientContext, msg: Payload) -> Payload:
    """``train.max_steps`` local steps on the adapter, with eq. (1)'s proximal term; reply with it."""
    section: FedBiOTConfig = ctx.cfg.section("fedbiot")
    split = split_from_layout(msg)
    model = client_model(ctx, msg, split)
    params = adapter_parameters(model, split, section.adapter_mode, emulator=True)
    load_parameters(params, arrays(msg, ADAPTER), "adapter from the server")
    tokenizer = ctx.resources.tokenizer(model_spec(ctx.cfg.model, ctx.cfg.seed))
    data_cfg = ctx.cfg.data
    examples = ctx.resources.get(
        f"fedbiot/examples/{ctx.client_id}",
        lambda: encode_records(ctx.data, tokenizer, data_cfg.template, data_cfg.max_length),
    )
    result = train_selected(
        ctx,
        model,
        params,
        examples,
        pad_token_id=int(tokenizer.pad_token_id or 0),
        prox_mu=section.prox_eps,
    )
    return fit_reply(ctx, params, result, ADAPTER)


def client_model(ctx: ClientContext, msg: Payload, split: LayerSplit) -> Any:
    """The client's emulator model: built from the architecture it was sent, weights as received."""
    mode = ctx.cfg.section("fedbiot").adapter_mode

    def loader(part: str) -> Loader:
        return lambda model, state, what: load_parameters(
            part_parameters(model, split, part, mode), state, what
        )

    return ClientCache.of(ctx, "fedbiot").model(
        msg,
        lambda arch: _model_from_arch(ctx, arch, split),
        {"frozen": (FROZEN, loader("frozen")), "emulator": (EMULATOR, loader("emulator"))},
        key=split,
        what="emulator model",
    )


def _model_from_arch(ctx: ClientContext, arch: str, split: LayerSplit) -> Any:
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = json.loads(arch)
    config = AutoConfig.for_model(spec.pop("model_type"), **spec)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    if ctx.cfg.section("fedbiot").adapter_mode == "lora":
        model = with_adapter_lora(model, split, ctx.cfg.lora, seed=ctx.cfg.seed, emulator=True)
    model.to(resolve_device(model_spec(ctx.cfg.model, ctx.cfg.seed).device))
    return model.eval()
