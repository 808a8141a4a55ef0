"""What a PerFIT client runs and holds: its mask and its masked LoRA values (``ctx.state``), never
another client's. The tasks: ``search`` (Alg. 1, once), ``fit`` (Alg. 2's local training), ``update``
(its entries of Alg. 3's masked mean) and ``evaluate_personal`` (its own model on its own held-out data).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from fedtune.algorithms.adapters import client_examples
from fedtune.algorithms.base import derive_seed, evaluate_model
from fedtune.algorithms.local import fit_scalars, train_selected
from fedtune.algorithms.perfit.config import PerFITConfig
from fedtune.algorithms.perfit.maths import expanded_rank, kept_count, symmetric_init
from fedtune.algorithms.perfit.search import search_masks
from fedtune.algorithms.perfit.wire import AFTER_FIT, VALUES, mask_payload, values_payload
from fedtune.algorithms.personal import personal_reply
from fedtune.config import ExperimentConfig
from fedtune.data.tokenize import make_batches
from fedtune.eval.evaluate import result_payload
from fedtune.fl.aggregate import gather_masked, pack_mask, scatter_masked, unpack_mask
from fedtune.fl.federation import ClientContext
from fedtune.fl.payload import Payload, arrays
from fedtune.models.lora import adapter_arrays, adapter_parameters, build_lora, load_adapter
from fedtune.resources import Resources, model_spec


def search_rank(cfg: ExperimentConfig) -> int:
    """The expanded rank r_e every client's LoRA has: ``perfit.expanded_rank`` or r / (1 - s)."""
    section: PerFITConfig = cfg.section("perfit")
    return section.expanded_rank or expanded_rank(cfg.lora.r, section.sparsity)


def lora_alpha(cfg: ExperimentConfig) -> int:
    """LoRA alpha of the expanded module (``perfit.alpha``): r_e (scaling 1), ``lora.alpha`` or a number."""
    alpha = cfg.section("perfit").alpha
    if alpha == "rank":
        return search_rank(cfg)
    return cfg.lora.alpha if alpha == "lora" else int(alpha)


def lora_model(cfg: ExperimentConfig, resources: Resources) -> tuple[Any, Any]:
    """The base LM with one rank-r_e LoRA (``lora:`` otherwise), shared by the clients of a process:
    each task loads its own client's values into it."""

    def build() -> tuple[Any, Any]:
        model, tokenizer = resources.model(model_spec(cfg.model, cfg.seed))
        return build_lora(model, cfg.lora, seed=0, rank=search_rank(cfg), alpha=lora_alpha(cfg)), tokenizer

    pair: tuple[Any, Any] = resources.get("perfit/lora", build)
    return pair


def module_shapes(cfg: ExperimentConfig, resources: Resources) -> dict[str, tuple[int, ...]]:
    """The expanded LoRA's adapter keys and shapes (what masks and values are laid out by)."""
    model, _ = lora_model(cfg, resources)
    return {key: tuple(p.shape) for key, p in adapter_parameters(model).items()}


def _batches(ctx: ClientContext, seed: int) -> list[dict[str, torch.Tensor]]:
    _, tokenizer = lora_model(ctx.cfg, ctx.resources)
    examples = client_examples(ctx)
    return make_batches(examples, ctx.cfg.train.batch_size, int(tokenizer.pad_token_id or 0), seed=seed)


def _own_masks(ctx: ClientContext) -> dict[str, np.ndarray]:
    if "mask" not in ctx.state:
        raise ValueError(f"client {ctx.client_id} has no PerFIT mask: it must search first")
    shapes = module_shapes(ctx.cfg, ctx.resources)
    return {key: unpack_mask(bits, shapes[key]) for key, bits in ctx.state["mask"].items()}


def search(ctx: ClientContext, msg: Payload) -> Payload:
    """Alg. 1 on this client's data for the budget (a rank) in ``msg``: its mask, sent as packed bits
    and kept with its initial masked values."""
    cfg, section = ctx.cfg, ctx.cfg.section("perfit")
    model, _ = lora_model(cfg, ctx.resources)
    shapes = module_shapes(cfg, ctx.resources)
    # One initial expanded LoRA for everyone (Alg. 2's input Delta theta_0), pruned per client: the
    # entries several clients keep start equal, so their parameter-wise mean is meaningful.
    weights = symmetric_init(shapes, derive_seed(cfg.seed, "perfit-init"))
    batches = _batches(ctx, derive_seed(cfg.seed, "perfit-search", ctx.client_id))
    masks = search_masks(
        model,
        weights,
        batches,
        kept_count(shapes, int(msg["budget"])),
        steps=section.search_steps,
        per_step=section.search_batches or len(batches),
        importance=section.importance,
    )
    ctx.state["mask"] = {key: pack_mask(mask) for key, mask in masks.items()}
    if section.start == "own":  # with the global module the server holds the values
        ctx.state["values"] = gather_masked(weights, masks)
    reply = mask_payload(masks)
    reply["num_examples"] = len(ctx.data)
    return reply


def _masked_values(msg: Payload, masks: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The ``values/<key>`` of ``msg``: exactly one value per entry of this client's mask."""
    values = arrays(msg, VALUES)
    for key, mask in masks.items():
        if key not in values or values[key].shape != (int(mask.sum()),):
            got = values[key].shape[0] if key in values else 0
            raise ValueError(f"values of {key}: {got} values for {int(mask.sum())} entries")
    return {key: np.asarray(values[key], dtype=np.float32) for key in masks}


def fit(ctx: ClientContext, msg: Payload) -> Payload:
    """Alg. 2's local step: train the masked LoRA from G at the client's mask (``perfit.start: global``)
    or from its own values (``own``), upload the masked values."""
    model, tokenizer = lora_model(ctx.cfg, ctx.resources)
    masks = _own_masks(ctx)
    start_global = ctx.cfg.section("perfit").start == "global"
    start = _masked_values(msg, masks) if start_global else ctx.state["values"]
    load_adapter(model, scatter_masked(start, masks))
    params = adapter_parameters(model)
    grad_masks = {key: torch.from_numpy(mask) for key, mask in masks.items()}
    result = train_selected(
        ctx,
        model,
        params,
        client_examples(ctx),
        pad_token_id=int(tokenizer.pad_token_id or 0),
        grad_masks=grad_masks,
    )
    values = gather_masked(adapter_arrays(model), masks)
    if start_global:  # kept for the score right after local training (evaluate_personal)
        ctx.state["trained"] = {"round": int(msg["round"]), "values": values}
    else:
        ctx.state["values"] = values
    reply = values_payload(values)
    reply.update(fit_scalars(ctx, result))
    return reply


def update(ctx: ClientContext, msg: Payload) -> Payload:
    """The personalised aggregate (Alg. 3): this client's masked entries of the masked mean."""
    ctx.state["values"] = _masked_values(msg, _own_masks(ctx))
    return {"received": len(ctx.state["values"])}


def evaluate_personal(ctx: ClientContext, msg: Payload) -> Payload:
    """This client's model on its own held-out records: G at its mask (``perfit.start: global``, sent
    along) or its own values (``own``); the base model before it has a mask. A client that trained this
    round also reports its freshly trained values' scores under ``after_fit/``."""
    model, tokenizer = lora_model(ctx.cfg, ctx.resources)
    shapes = module_shapes(ctx.cfg, ctx.resources)
    if not ctx.eval_data:
        raise ValueError(f"client {ctx.client_id} has no held-out records (data.holdout)")
    rnd = int(msg["round"])
    adapter = {key: np.zeros(shape, dtype=np.float32) for key, shape in shapes.items()}
    start_global = ctx.cfg.section("perfit").start == "global"
    if "mask" in ctx.state and (not start_global or arrays(msg, VALUES)):
        values = _masked_values(msg, _own_masks(ctx)) if start_global else ctx.state["values"]
        adapter = scatter_masked(values, _own_masks(ctx))
    load_adapter(model, adapter)
    reply = personal_reply(
        evaluate_model(ctx.cfg, model, tokenizer, ctx.eval_data, rnd), len(ctx.eval_data), rnd
    )
    trained = ctx.state.get("trained")
    if start_global and trained is not None and int(trained["round"]) == rnd:
        load_adapter(model, scatter_masked(trained["values"], _own_masks(ctx)))
        after = evaluate_model(ctx.cfg, model, tokenizer, ctx.eval_data, rnd)
        reply.update({AFTER_FIT + key: value for key, value in result_payload(after).items()})
    return reply
