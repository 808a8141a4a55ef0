"""How FedMKT's knowledge travels: per-sample losses and top-k logits of the public set only.

One flat array per field, samples concatenated in public-set order: ``loss`` [N] fp32, ``ids``
[T, k] in the narrowest unsigned integer type that holds the sender's vocabulary, ``values`` [T, k]
fp16 logits, T the total number of response tokens. No offsets travel: the receiver tokenizes the
public set with the sender's tokenizer and knows each sample's T_i. Nothing of a client's private
data (text, tokens, losses) is ever in it.

With ``compress`` the ids and values travel deflated (zlib level 6) as ``ids.z`` / ``values.z``
bytes (uint8): about 0.6x the bytes. The receiver inflates them no further than the size it
expects, so a malformed reply cannot blow up its memory, and checks shape, finiteness and ids.
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fedtune.fl.payload import Payload
from fedtune.fl.validation import ArraySpec

LOSS, IDS, VALUES = "loss", "ids", "values"
DEFLATED = ".z"
_FP16_MAX = float(np.finfo(np.float16).max)


def id_dtype(vocab_size: int) -> np.dtype:
    """The narrowest unsigned integer type holding ids ``0 .. vocab_size - 1``."""
    for dtype in (np.uint8, np.uint16, np.uint32):
        if vocab_size - 1 <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    raise ValueError(f"vocabulary of {vocab_size} tokens does not fit 32-bit ids")


@dataclass(frozen=True)
class Knowledge:
    """A model's knowledge of the public set: ``losses`` [N]; per sample ``ids``/``values`` [T_i, k]."""

    losses: np.ndarray
    ids: list[np.ndarray]
    values: list[np.ndarray]

    def pack(self, prefix: str, vocab_size: int, *, compress: bool = False) -> Payload:
        ids = np.concatenate(self.ids).astype(id_dtype(vocab_size))
        values = np.clip(np.concatenate(self.values), -_FP16_MAX, _FP16_MAX).astype(np.float16)
        payload: Payload = {prefix + LOSS: self.losses.astype(np.float32)}
        for name, array in ((IDS, ids), (VALUES, values)):
            if compress:
                payload[prefix + name + DEFLATED] = np.frombuffer(zlib.compress(array.tobytes(), 6), np.uint8)
            else:
                payload[prefix + name] = array
        return payload


def knowledge_spec(
    prefix: str, counts: Sequence[int], top_k: int, vocab_size: int, *, compress: bool = False
) -> dict[str, ArraySpec]:
    """The arrays a sender with ``counts`` response tokens per public sample must send (compressed:
    the loss; the deflated bytes have no fixed size and are checked by ``unpack_knowledge``)."""
    total = int(sum(counts))
    if compress:
        return {prefix + LOSS: ArraySpec((len(counts),), "float32")}
    return {
        prefix + LOSS: ArraySpec((len(counts),), "float32"),
        prefix + IDS: ArraySpec((total, top_k), str(id_dtype(vocab_size))),
        prefix + VALUES: ArraySpec((total, top_k), "float16"),
    }


def _field(payload: Payload, key: str, dtype: np.dtype, shape: tuple[int, int]) -> np.ndarray:
    """``key``'s array, inflated from ``key + DEFLATED`` when it travelled compressed."""
    if key + DEFLATED not in payload:
        if key not in payload:
            raise ValueError(f"missing '{key}'")
        return np.asarray(payload[key])
    packed = payload[key + DEFLATED]
    if not isinstance(packed, np.ndarray) or packed.dtype != np.uint8 or packed.ndim != 1:
        raise ValueError(f"'{key + DEFLATED}' must be a 1-d uint8 array")
    expected = int(np.prod(shape)) * dtype.itemsize
    inflater = zlib.decompressobj()
    try:
        raw = inflater.decompress(packed.tobytes(), expected + 1)
    except zlib.error as exc:
        raise ValueError(f"'{key + DEFLATED}' is not deflated data: {exc}") from None
    if len(raw) != expected or not inflater.eof:
        raise ValueError(f"'{key + DEFLATED}' inflates to other than the {expected} bytes expected")
    return np.frombuffer(raw, dtype).reshape(shape)


def unpack_knowledge(
    payload: Payload, prefix: str, counts: Sequence[int], vocab_size: int, top_k: int
) -> Knowledge:
    """The knowledge in ``payload`` split per sample; ids outside the sender's vocabulary are an error."""
    known = {prefix + name + suffix for name in (LOSS, IDS, VALUES) for suffix in ("", DEFLATED)}
    extra = sorted(k for k in payload if k.startswith(prefix) and k not in known)
    if extra:
        raise ValueError(f"unexpected arrays: {', '.join(extra[:5])}")
    losses = np.asarray(payload[prefix + LOSS], dtype=np.float32)
    shape = (int(sum(counts)), top_k)
    ids = _field(payload, prefix + IDS, id_dtype(vocab_size), shape).astype(np.int64)
    values = _field(payload, prefix + VALUES, np.dtype(np.float16), shape).astype(np.float32)
    if ids.shape != shape or values.shape != shape:
        raise ValueError(f"'{prefix}' top-k of shape {ids.shape} / {values.shape}, expected {shape}")
    if not np.all(np.isfinite(values)):
        raise ValueError(f"'{prefix + VALUES}' contains NaN or Inf")
    if ids.size and int(ids.max()) >= vocab_size:
        raise ValueError(
            f"'{prefix + IDS}' holds token id {int(ids.max())} of a {vocab_size}-token vocabulary"
        )
    if len(losses) != len(counts) or len(ids) != sum(counts):
        raise ValueError(
            f"'{prefix}' knowledge for {len(losses)} samples / {len(ids)} tokens, expected "
            f"{len(counts)} / {sum(counts)}"
        )
    bounds = np.cumsum([0, *counts])
    return Knowledge(
        losses,
        [ids[a:b] for a, b in itertools.pairwise(bounds)],
        [values[a:b] for a, b in itertools.pairwise(bounds)],
    )
