"""FedMKT's config section (``fedmkt:``)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field

from fedtune.config import AlgorithmConfig, TrainConfig


def paper_llm_training() -> TrainConfig:
    """The paper's LLM settings: AdamW (0.9, 0.95), lr 3e-5, wd 0.1, warmup 0.008, clip 1, batch 4."""
    return TrainConfig(
        optimizer="adamw", lr=3e-5, weight_decay=0.1, betas=(0.9, 0.95), batch_size=4, warmup_ratio=0.008
    )


def client_index(client: str) -> int:
    """The number a client id ends with (``c03`` -> 3): which of ``fedmkt.clients`` it holds."""
    found = re.search(r"(\d+)$", client)
    if found is None:
        raise ValueError(
            f"client id {client!r} does not end with its index; fedmkt.clients is assigned by it"
        )
    return int(found.group(1))


class FedMKTConfig(AlgorithmConfig):
    """The server's LLM is the run's ``model:``; ``clients`` names the clients' SLMs (client ``cNN``
    holds ``clients[NN % len]``; empty: every client holds ``model:``). ``train:`` is the clients'
    training (local SFT and their distillation on the public set), ``llm_train`` the LLM's (defaults:
    the paper's).

    ``fed.mode: centralized`` is the paper's Centralized baseline: one party tunes ``model:`` (the LLM;
    ``model.name=<SLM>`` for an SLM's row) with ``train:`` on the union of the clients' private data
    and the public set (``public_examples`` of it); nothing is transferred. ``lam: 1`` with
    ``slm_learns: false`` is the "LLM on the public set only" row: the LLM's loss is the public set's
    CE alone, so the SLMs' knowledge does not reach it."""

    modes = ("federated", "standalone", "centralized")
    personal_eval = True
    dp_refused = (
        "its clients upload per-token losses and top-k logits on the public set (knowledge the LLM is "
        "distilled from), not a mean of client tensors whose sensitivity clipping bounds: neither the "
        "clipped, noised sum nor a secure sum covers what the clients send"
    )

    clients: list[str] = Field(default_factory=list)
    """The clients' SLMs; client `cNN` holds `clients[NN % len]`; empty: every client holds `model:`."""
    lam: float = Field(0.9, ge=0, le=1)
    """lam CE + (1 - lam) KD."""
    top_k: int = Field(16, ge=1)
    """Logits per response token that travel."""
    compress: bool = True
    """Top-k ids and values travel deflated (``wire``); bytes are counted as sent."""
    public_examples: int | None = Field(None, ge=1)
    """Public examples used (default: all of the public split)."""
    llm_learns: bool = True
    """`false`: the LLM2SLM baseline (the LLM only teaches)."""
    slm_learns: bool = True
    """`false`: the SLMs only teach."""
    slm_fedavg: bool = False
    """Homogeneous setting: FedAvg of the SLMs' LoRA after local training."""
    llm_train: TrainConfig = Field(default_factory=paper_llm_training)
    """The LLM's own training settings (keys of `train:`)."""
    slm_eval: Literal["heldout", "test"] = "heldout"
    """What each client evaluates its SLM on (``eval.personal``): its held-out split, or the run's test
    set (the paper's protocol: every model on the task's test set, comparable with centralized SLMs)."""

    def client_model(self, client: str) -> str:
        """The SLM client ``client`` holds (``clients`` must not be empty)."""
        return self.clients[client_index(client) % len(self.clients)]
