"""PerFIT's final models: one per client, personal. Client ``c``'s model is the base LM with the
expanded LoRA at the server's final G on ``c``'s mask (zeros elsewhere), what ``evaluate_personal``
scores; it is rebuilt from the run's last checkpoint (G and the masks), so ``fedtune eval``,
``generate`` and ``export`` take ``--option client=ID``."""

from __future__ import annotations

import numpy as np

from fedtune.algorithms.final import CausalLMModel, FinalModelError, FinalRun, load_base_model
from fedtune.algorithms.perfit.client import lora_alpha, search_rank
from fedtune.fl.aggregate import unpack_mask
from fedtune.fl.checkpoint import intact_checkpoint, load_checkpoint
from fedtune.models.lora import adapter_parameters, build_lora, load_adapter

CLIENT_OPTION = "client"


def personal_model(run: FinalRun) -> CausalLMModel:
    """Client ``run.options['client']``'s personalised model (``perfit.start: global`` only: with
    ``own`` each client's values never leave it, so the server has no model to give)."""
    cfg = run.cfg
    where = (
        f"{run.run_dir} is a PerFIT run: its models are personal (each client's mask over the server's "
        "expanded module), so there is no single final model"
    )
    if cfg.section("perfit").start != "global":
        raise FinalModelError(
            f"{where}, and with perfit.start: own each client's values never leave it, so the server holds "
            "none of them; every client's score on its own held-out data is in metrics.jsonl (personal/*)"
        )
    path, _ = intact_checkpoint(run.run_dir)
    if path is None:
        raise FinalModelError(f"{where}; and it has no intact checkpoint to rebuild a client's model from")
    state = load_checkpoint(path)["algorithm"]
    masks = state["masks"]
    client = run.options.get(CLIENT_OPTION)
    if client not in masks:
        given = f"--option client={client!r} is not one of them" if client else "name one"
        raise FinalModelError(
            f"{where}: {given} with --option client=ID (clients with a model: {', '.join(sorted(masks))}); "
            "every client's score on its own held-out data is in metrics.jsonl (personal/*)"
        )
    base, tokenizer = load_base_model(cfg)
    model = build_lora(base, cfg.lora, seed=0, rank=search_rank(cfg), alpha=lora_alpha(cfg))
    shapes = {key: tuple(param.shape) for key, param in adapter_parameters(model).items()}
    module = state["global_module"]
    values = {
        key: np.asarray(module[key], dtype=np.float32) * unpack_mask(np.asarray(masks[client][key]), shape)
        for key, shape in shapes.items()
    }
    load_adapter(model, values)
    return CausalLMModel(cfg, model.eval(), tokenizer)
