"""What a FedPT client runs: FedIT's local SFT of the small LM, and nothing else.

A client holds its own records and the small LM with the LoRA state it was sent; it never sees the
large LM, the public set or the server's distillation.
"""

from __future__ import annotations

from fedtune.algorithms.adapters import ADAPTER, fit_adapter
from fedtune.fl.federation import ClientContext
from fedtune.fl.payload import Payload, arrays


def fit(ctx: ClientContext, msg: Payload) -> Payload:
    """Load the global LoRA state ``adapter/*`` of ``msg``, train it on local data (response-only SFT,
    no proximal term) and reply with the new state and the fit statistics."""
    return fit_adapter(ctx, arrays(msg, ADAPTER), prox_mu=0.0)
