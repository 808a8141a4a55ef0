"""FedPFT's distillations' inputs on the server: the public batches they run on and the gradient
masks that say which FFN weights train (eq. 13; eq. 14's frozen neurons).

Shapes: ``B`` batch, ``T`` tokens, ``H`` hidden size, ``I`` an FFN's width (its neurons) in the
client model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from fedtune.algorithms.fedpft.maths import sample_indices
from fedtune.data.classify import classification_batches, encode_example
from fedtune.data.records import Record
from fedtune.models.ffn import ffn_parameters as ffn_module_parameters
from fedtune.models.surgery import unwrap
from fedtune.train.ffn_distill import ffn_grad_masks


def distill_masks(
    client: nn.Module, widths: Sequence[int], compressed: Sequence[int], frozen: Mapping[int, np.ndarray]
) -> dict[str, torch.Tensor]:
    """FFN parameter name -> 0/1 gradient mask of a distillation (eq. 13; eq. 14 with ``frozen``).

    The compressed layers' FFNs train except their ``frozen`` neurons (position -> neuron indices;
    input weights [I, H] get a mask [I, 1], the output weight [H, I] a mask [1, I]); a layer kept
    whole (its position not in ``compressed``; ``widths``: one per position) trains nothing, not even
    its output bias [H] (shared by every neuron): all its masks are zero.
    """
    masks = ffn_grad_masks(client, {pos: np.asarray(frozen.get(pos, []), np.int64) for pos in compressed})
    whole = [pos for pos in range(len(widths)) if pos not in compressed]
    untouched = set(ffn_module_parameters(unwrap(client), whole))
    return {name: torch.zeros_like(m) if name in untouched else m for name, m in masks.items()}


def public_batches(
    records: Sequence[Record],
    tokenizer: Any,
    *,
    max_length: int,
    batch_size: int,
    count: int | None,
    seed: int,
) -> list[dict[str, torch.Tensor]]:
    """``count`` of ``records`` (a seeded sample; all when fewer), their texts tokenized (no class:
    distillation reads only the texts) and batched: ``input_ids``/``attention_mask`` [B, T] per batch,
    and ``token_type_ids`` [B, T] for a tokenizer with segment ids (pair records are two segments)."""
    chosen = sample_indices(len(records), count, [seed, 0xFF])
    if chosen is not None:
        records = [records[i] for i in chosen]
    examples = [encode_example(r, tokenizer, 0, max_length) for r in records]
    return classification_batches(examples, batch_size, int(tokenizer.pad_token_id or 0), seed=seed)
