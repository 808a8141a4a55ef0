"""FedPFT's maths as pure functions: FedOT's layers, the distillations' gradient masks and public
batches, parameter counts. (Saliency, sub-model surgery, eq. 13's loss and the APoZ counts
themselves are ``fedtune.models.ffn`` and ``fedtune.train.ffn_distill``.)

Shapes: ``B`` batch, ``T`` tokens, ``H`` hidden size, ``I`` an FFN's width (its neurons) in the
client model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from fedtune.data.classify import classification_batches, encode_example
from fedtune.data.records import Record
from fedtune.models.ffn import ffn_parameters as ffn_module_parameters
from fedtune.models.surgery import uniform_drop, unwrap
from fedtune.train.ffn_distill import ffn_grad_masks


def adapter_layers(num_layers: int, edge: int) -> tuple[int, ...]:
    """FedOT's adapter: the first and last ``edge`` layers."""
    return tuple(sorted(set(range(edge)) | set(range(num_layers - edge, num_layers))))


def kept_layers(num_layers: int, edge: int, drop: float) -> tuple[int, ...]:
    """FedOT's emulator layers: the first and last ``edge`` layers whole, a uniform share of the rest."""
    middle = list(range(edge, num_layers - edge))
    return tuple(sorted(set(adapter_layers(num_layers, edge)) | set(uniform_drop(middle, drop))))


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


def sample_indices(count: int, limit: int | None, seed: int | list[int]) -> list[int] | None:
    """A seeded sample of ``limit`` of ``count`` indices, sorted; None when all ``count`` fit."""
    if limit is None or count <= limit:
        return None
    rng = np.random.default_rng(seed)
    return [int(i) for i in sorted(rng.choice(count, limit, replace=False))]


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


def count(params: Mapping[str, nn.Parameter] | Sequence[nn.Parameter]) -> int:
    """The number of entries of ``params``."""
    values = params.values() if isinstance(params, Mapping) else params
    return int(sum(p.numel() for p in values))


def model_params(model: nn.Module) -> int:
    """``model``'s parameter count (peft wrapper removed, tied parameters once)."""
    return count(list({id(p): p for p in unwrap(model).parameters()}.values()))
