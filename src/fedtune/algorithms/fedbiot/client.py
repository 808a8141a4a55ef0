"""FedBiOT's client: it holds only the emulator model it was sent and its own data.

The model is built from the architecture that came over the wire, with the weights as received; it
is kept in process memory, or also on the client's own disk (``client_cache: disk``), so a restarted
client process need not be sent again what it holds.
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
from fedtune.fl.broadcast import ClientCacheMiss, client_cache_mode, receive_part
from fedtune.fl.federation import ClientContext
from fedtune.fl.payload import Payload, arrays
from fedtune.models.loading import resolve_device
from fedtune.models.surgery import LayerSplit, load_parameters
from fedtune.resources import model_spec

CACHE_DIR = "fedbiot-cache"


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
    holder: dict[str, Any] = ctx.resources.get("fedbiot/client", dict)
    disk = _cache_mode(ctx) == "disk"
    arch_file = ctx.workdir / CACHE_DIR / "arch.json"
    arch = msg.get("arch")
    if arch is not None and disk:
        arch_file.parent.mkdir(parents=True, exist_ok=True)
        arch_file.write_text(str(arch))
    if arch is None and "model" not in holder and disk and arch_file.is_file():
        arch = arch_file.read_text()  # a restarted client process: the architecture from its disk
    if arch is not None and holder.get("arch") != arch:
        model = _model_from_arch(ctx, str(arch), split)
        holder.clear()
        holder.update(arch=arch, model=model, versions={})
    if "model" not in holder:
        raise ClientCacheMiss(f"client {ctx.client_id} holds no emulator model and was not sent one")
    model = holder["model"]
    for part in ("frozen", "emulator"):
        _receive(ctx, msg, model, split, holder["versions"], part)
    return model


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


def _receive(
    ctx: ClientContext, msg: Payload, model: Any, split: LayerSplit, held: dict[str, int], part: str
) -> None:
    mode = ctx.cfg.section("fedbiot").adapter_mode
    receive_part(
        msg,
        part,
        FROZEN if part == "frozen" else EMULATOR,
        held,
        lambda state, what: load_parameters(part_parameters(model, split, part, mode), state, what),
        cache_file=ctx.workdir / CACHE_DIR / f"{part}.npz" if _cache_mode(ctx) == "disk" else None,
        client=ctx.client_id,
    )


def _cache_mode(ctx: ClientContext) -> str:
    section: FedBiOTConfig = ctx.cfg.section("fedbiot")
    return client_cache_mode(str(section.client_cache), getattr(ctx.cfg.fed, "backend", "simulation"))
