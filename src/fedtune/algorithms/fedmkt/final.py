"""FedMKT's final models: the server's LLM with its final LoRA (the default), and with
``--option client=ID`` client ``ID``'s own SLM with its own LoRA.

An SLM's LoRA never leaves its client, so only a run that keeps every client's state beside the
server's has one to give: an in-process or Ray run checkpoints each client's state with the round
(``checkpoints/round_NNNN``). On Flower each SLM stays on its SuperNode, and the option says so.
"""

from __future__ import annotations

from fedtune.algorithms.base import derive_seed
from fedtune.algorithms.fedmkt.client import slm_spec
from fedtune.algorithms.final import CausalLMModel, FinalModelError, FinalRun, load_base_model
from fedtune.fl.checkpoint import intact_checkpoint, load_checkpoint
from fedtune.models.lora import build_lora, load_adapter

CLIENT_OPTION = "client"


def slm_model(run: FinalRun) -> CausalLMModel:
    """Client ``run.options['client']``'s SLM with the LoRA it holds after the run's last round."""
    cfg, client = run.cfg, run.options[CLIENT_OPTION]
    where = f"{run.run_dir}: --option client={client!r} (a client's own SLM)"
    path, _ = intact_checkpoint(run.run_dir)
    if path is None:
        raise FinalModelError(f"{where}: the run has no intact checkpoint to read the SLM's LoRA from")
    clients = load_checkpoint(path).get("federation", {}).get("clients", {})
    held = sorted(cid for cid, state in clients.items() if "adapter" in state)
    if client not in held:
        if not held:
            raise FinalModelError(
                f"{where}: this run holds no client's SLM: an SLM's LoRA never leaves its client, and only "
                "in-process and Ray runs keep the clients' state beside the server's (on Flower it stays "
                "on each SuperNode); every SLM's score on its own held-out data is in metrics.jsonl "
                "(personal/*)"
            )
        raise FinalModelError(
            f"{where}: not a client with a trained SLM (clients with one: {', '.join(held)})"
        )
    # The SLM's own config: its model in ``model:``, so an export and its card name the SLM as the base.
    own = cfg.model_copy(deep=True)
    own.model.name = slm_spec(cfg, client).name
    base, tokenizer = load_base_model(own)
    model = build_lora(base, cfg.lora, seed=derive_seed(cfg.seed, "fedmkt-lora", own.model.name))
    load_adapter(model, clients[client]["adapter"])
    return CausalLMModel(own, model.eval(), tokenizer)
