"""Rank arithmetic of LoRA adapters shared by the heterogeneous-rank methods (pure numpy).

A LoRA module holds ``A`` (r, d_in) under a key with ``lora_A`` and ``B`` (d_out, r) under the same key
with ``lora_B``; its product is ``B @ A`` (d_out, d_in). Rank i of the adapter is row i of ``A`` and
column i of ``B``: truncating to rank r keeps the first r, zero-padding appends zero ones.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

A_PART, B_PART = "lora_A", "lora_B"


def lora_pairs(keys: Sequence[str]) -> dict[str, tuple[str, str]]:
    """Module name -> (A key, B key) for every LoRA module among ``keys``; a lone A or B is an error."""
    keys = list(keys)
    pairs: dict[str, tuple[str, str]] = {}
    for key in keys:
        if A_PART in key:
            partner = key.replace(A_PART, B_PART)
            if partner not in keys:
                raise KeyError(f"LoRA key {key} has no {B_PART} partner ({partner})")
            pairs[key.split("." + A_PART)[0]] = (key, partner)
    paired = {k for pair in pairs.values() for k in pair}
    lone = sorted(k for k in keys if B_PART in k and k not in paired)
    if lone:
        raise KeyError(f"LoRA key {lone[0]} has no {A_PART} partner")
    return pairs


def is_a(key: str) -> bool:
    return A_PART in key


def is_b(key: str) -> bool:
    return B_PART in key


def adapter_rank(adapter: Mapping[str, np.ndarray]) -> int:
    """The common rank of ``adapter``'s modules (rows of every A, columns of every B)."""
    ranks = {
        key: value.shape[0] if is_a(key) else value.shape[1]
        for key, value in adapter.items()
        if is_a(key) or is_b(key)
    }
    if not ranks:
        raise ValueError("the adapter holds no LoRA A or B matrix")
    if len(set(ranks.values())) > 1:
        first, *_ = sorted(ranks.items(), key=lambda item: item[1])
        raise ValueError(
            f"the adapter's modules differ in rank ({sorted(set(ranks.values()))}, e.g. {first[0]})"
        )
    return next(iter(ranks.values()))


def truncate(adapter: Mapping[str, np.ndarray], rank: int) -> dict[str, np.ndarray]:
    """The first ``rank`` ranks of every module: A (r, d_in) -> A[:rank], B (d_out, r) -> B[:, :rank]."""
    out: dict[str, np.ndarray] = {}
    for key, value in adapter.items():
        if is_a(key):
            out[key] = np.array(value[:rank], copy=True)
        elif is_b(key):
            out[key] = np.array(value[:, :rank], copy=True)
        else:
            out[key] = np.array(value, copy=True)
    return out


def zero_pad(adapter: Mapping[str, np.ndarray], rank: int) -> dict[str, np.ndarray]:
    """Every module padded with zero ranks up to ``rank``; the product ``B @ A`` is unchanged."""
    out: dict[str, np.ndarray] = {}
    for key, value in adapter.items():
        if is_a(key):
            out[key] = np.pad(value, ((0, rank - value.shape[0]), (0, 0)))
        elif is_b(key):
            out[key] = np.pad(value, ((0, 0), (0, rank - value.shape[1])))
        else:
            out[key] = np.array(value, copy=True)
    return out


def rank_masks(shapes: Mapping[str, tuple[int, ...]], rank: int) -> dict[str, np.ndarray]:
    """Boolean masks of the entries of the first ``rank`` ranks, for A (r_max, d_in) and B (d_out, r_max)."""
    masks: dict[str, np.ndarray] = {}
    for key, shape in shapes.items():
        mask = np.zeros(shape, dtype=bool)
        if is_a(key):
            mask[:rank] = True
        elif is_b(key):
            mask[:, :rank] = True
        else:
            mask[...] = True
        masks[key] = mask
    return masks


def products(adapter: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Module name -> ``B @ A`` (d_out, d_in) in float64."""
    return {
        module: adapter[b_key].astype(np.float64) @ adapter[a_key].astype(np.float64)
        for module, (a_key, b_key) in lora_pairs(list(adapter)).items()
    }


def assign_ranks(clients: Sequence[str], ranks: Sequence[int]) -> dict[str, int]:
    """Client -> rank: ``ranks`` repeated in the clients' order (client i gets ``ranks[i % len(ranks)]``)."""
    return {client: int(ranks[index % len(ranks)]) for index, client in enumerate(clients)}
