"""The adaptive optimisers' client task: FedIT's local LoRA fine-tuning, unchanged."""

from __future__ import annotations

from fedtune.algorithms.adapters import ADAPTER, fit_adapter
from fedtune.fl.federation import ClientContext
from fedtune.fl.payload import Payload, arrays


def fit(ctx: ClientContext, msg: Payload) -> Payload:
    """Train the adapter ``adapter/*`` of ``msg`` on the client's data (no proximal term); reply with it."""
    return fit_adapter(ctx, arrays(msg, ADAPTER), prox_mu=0.0)
