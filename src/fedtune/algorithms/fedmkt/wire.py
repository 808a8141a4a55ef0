"""How FedMKT's knowledge travels: per-sample losses and top-k logits of the public set only.

- ``fit`` (server -> client): ``{"round": t}``; reply: the fit statistics (``local.REPLY_SCALARS``),
  the client's knowledge under ``public/`` (``fed.mode: federated``) and its LoRA under ``adapter/``
  (``slm_fedavg`` only).
- ``distill`` (server -> client): the LLM's knowledge under ``llm/`` (and the clients' averaged LoRA
  under ``adapter/`` with ``slm_fedavg``); reply: ``KD_SCALARS``.
- ``evaluate_personal`` (server -> client): ``{"round": t}``; reply: the client's metrics.

Every party reads the same public examples (``public_subset``).

One flat array per field, samples concatenated in public-set order: ``loss`` [N] fp32, ``ids``
[T, k] in the narrowest unsigned integer type that holds the sender's vocabulary (3 little-endian
bytes per id, [T, k, 3] uint8, for 65,537 to 2^24 tokens: Qwen2.5, Gemma-3), ``values`` [T, k]
fp16 logits, T the total number of response tokens. No offsets travel: the receiver tokenizes the
public set with the sender's tokenizer and knows each sample's T_i. Nothing of a client's private
data (text, tokens, losses) is ever in it.

With ``compress`` the ids and values travel as ``ids.planes.z`` / ``values.planes.z`` bytes
(uint8), each filtered losslessly and then deflated (zlib level 6, strategy ``Z_FILTERED``):
- ids: byte planes (as blosc's shuffle): the first (least significant) byte of every id in [T, k]
  order, then every second byte, ...: the high bytes of a BPE vocabulary's ids, whose frequent
  tokens have low ids, are then long runs of few values;
- values: the fp16 bit patterns as uint16, each row's entries after the first replaced by their
  difference to the previous one (mod 2^16; rows are sorted, so the differences are small),
  transposed to [k, T] (the j-th differences of all tokens together), then byte planes.
Every value arrives bit-identical. On the top-k of ``bench/fedmkt_wire.py`` (SmolLM2 and Qwen2.5,
k 16 and 128) that is 0.5-0.6x the bytes of the plain arrays and 17-23% fewer than deflating them
as they are (byte planes alone: 8-13%; transposing without the differences made values larger).
The receiver inflates them no further than the size it expects, so a malformed reply cannot blow
up its memory, and checks shape, finiteness and ids.
"""

from __future__ import annotations

import itertools
import random
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from fedtune.algorithms.base import derive_seed
from fedtune.data.records import DataError, Record
from fedtune.fl.payload import Payload
from fedtune.fl.validation import ArraySpec

PUBLIC = "public/"
"""A client's knowledge of the public set (fit reply)."""
LLM = "llm/"
"""The LLM's knowledge of the public set (distill message)."""
ADAPTER = "adapter/"
"""SLM LoRA states, only with ``slm_fedavg`` (homogeneous setting)."""
KD_SCALARS = {"kd_selected": int, "kd_loss": float}
"""A client's distill reply: the public samples it kept for KD and its training loss."""

LOSS, IDS, VALUES = "loss", "ids", "values"
DEFLATED = ".planes.z"
_FP16_MAX = float(np.finfo(np.float16).max)


def public_subset(records: Sequence[Record], count: int | None, seed: int) -> list[Record]:
    """The public examples every party uses: all, or a seeded sample of ``count`` in original order."""
    if not records:
        raise DataError("fedmkt transfers knowledge on a public set, but the dataset has no 'public' split")
    if count is None or count >= len(records):
        return list(records)
    chosen = sorted(random.Random(derive_seed(seed, "fedmkt-public")).sample(range(len(records)), count))
    return [records[i] for i in chosen]


def id_bytes(vocab_size: int) -> int:
    """Bytes per id: 1, 2, 3 (Qwen2.5's 151,665 tokens need 18 bits) or 4."""
    for width in (1, 2, 3, 4):
        if vocab_size <= 1 << (8 * width):
            return width
    raise ValueError(f"vocabulary of {vocab_size} tokens does not fit 32-bit ids")


def id_layout(vocab_size: int, shape: tuple[int, int]) -> tuple[np.dtype, tuple[int, ...]]:
    """How ``shape`` ids travel: the narrowest unsigned type, or 3 little-endian bytes per id."""
    width = id_bytes(vocab_size)
    if width == 3:
        return np.dtype(np.uint8), (*shape, 3)
    return np.dtype({1: np.uint8, 2: np.uint16, 4: np.uint32}[width]), shape


def encode_ids(ids: np.ndarray, vocab_size: int) -> np.ndarray:
    dtype, shape = id_layout(vocab_size, ids.shape)
    if len(shape) == 3:
        return np.ascontiguousarray(ids.astype("<u4").view(np.uint8).reshape(*ids.shape, 4)[..., :3])
    return ids.astype(dtype)


def decode_ids(encoded: np.ndarray) -> np.ndarray:
    if encoded.ndim == 3:
        padded = np.zeros((*encoded.shape[:2], 4), dtype=np.uint8)
        padded[..., :3] = encoded
        return padded.view("<u4").reshape(encoded.shape[:2]).astype(np.int64)
    return encoded.astype(np.int64)


def byte_planes(array: np.ndarray, width: int) -> np.ndarray:
    """``array``'s elements of ``width`` little-endian bytes, laid out plane by plane: byte 0 of
    every element, then byte 1, ... (1-d uint8). The 3-byte id layout is [..., 3] uint8, width 3."""
    little = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
    return np.ascontiguousarray(little.reshape(-1).view(np.uint8).reshape(-1, width).T).reshape(-1)


def from_byte_planes(planes: np.ndarray, width: int) -> np.ndarray:
    """The inverse of ``byte_planes``: [n, width] uint8, each row one element's little-endian bytes."""
    return np.ascontiguousarray(planes.reshape(width, -1).T)


def row_deltas(bits: np.ndarray) -> np.ndarray:
    """[T, k] uint16: each row's first entry, then each entry minus the one before it (mod 2^16)."""
    deltas = bits.copy()
    deltas[:, 1:] -= bits[:, :-1]
    return deltas


def from_row_deltas(deltas: np.ndarray) -> np.ndarray:
    """The inverse of ``row_deltas``: running sums along each row, mod 2^16."""
    return np.cumsum(deltas, axis=1, dtype=np.uint16)


def _deflate(planes: np.ndarray) -> np.ndarray:
    compressor = zlib.compressobj(6, zlib.DEFLATED, 15, 8, zlib.Z_FILTERED)
    return np.frombuffer(compressor.compress(planes.tobytes()) + compressor.flush(), np.uint8)


def _filter_values(values: np.ndarray) -> np.ndarray:
    """[T, k] fp16 -> the byte planes of its transposed row differences (``values.planes.z``)."""
    return byte_planes(row_deltas(values.astype("<f2").view("<u2")).T, 2)


def _unfilter_values(planes: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    deltas = from_byte_planes(planes, 2).view("<u2").reshape(shape[::-1]).T
    return from_row_deltas(deltas.astype(np.uint16)).view(np.float16)


@dataclass(frozen=True)
class Knowledge:
    """A model's knowledge of the public set: ``losses`` [N]; per sample ``ids``/``values`` [T_i, k]."""

    losses: np.ndarray
    ids: list[np.ndarray]
    values: list[np.ndarray]

    def pack(self, prefix: str, vocab_size: int, *, compress: bool = False) -> Payload:
        ids = encode_ids(np.concatenate(self.ids), vocab_size)
        values = np.clip(np.concatenate(self.values), -_FP16_MAX, _FP16_MAX).astype(np.float16)
        payload: Payload = {prefix + LOSS: self.losses.astype(np.float32)}
        if compress:
            payload[prefix + IDS + DEFLATED] = _deflate(byte_planes(ids, id_bytes(vocab_size)))
            payload[prefix + VALUES + DEFLATED] = _deflate(_filter_values(values))
        else:
            payload[prefix + IDS], payload[prefix + VALUES] = ids, values
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
        prefix + IDS: ArraySpec(
            id_layout(vocab_size, (total, top_k))[1], str(id_layout(vocab_size, (total, top_k))[0])
        ),
        prefix + VALUES: ArraySpec((total, top_k), "float16"),
    }


def _field(
    payload: Payload,
    key: str,
    dtype: np.dtype,
    shape: tuple[int, ...],
    unfilter: Callable[[np.ndarray], np.ndarray],
) -> np.ndarray:
    """``key``'s array; when it travelled compressed, ``key + DEFLATED`` inflated (to the bytes of
    ``shape`` in ``dtype``, no further) and given as uint8 to ``unfilter``."""
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
    return unfilter(np.frombuffer(raw, np.uint8))


MAX_LOGIT = 1e4
"""A bound no real model's logit reaches (fp16 carries up to 65504): larger values are garbage."""


def check_knowledge_values(prefix: str, losses: np.ndarray, values: np.ndarray) -> None:
    """Knowledge that means what it says: each loss a cross-entropy (finite, >= 0), each row of top-k
    logits finite, within ``MAX_LOGIT`` and in descending order (a top-k is sorted)."""
    if not np.all(np.isfinite(losses)) or (losses.size and float(losses.min()) < 0):
        raise ValueError(f"'{prefix + LOSS}' holds a loss a cross-entropy cannot be (negative or not finite)")
    if not np.all(np.isfinite(values)):
        raise ValueError(f"'{prefix + VALUES}' contains NaN or Inf")
    if values.size and float(np.abs(values).max()) > MAX_LOGIT:
        raise ValueError(f"'{prefix + VALUES}' holds a logit beyond {MAX_LOGIT:g}")
    if values.shape[-1] > 1 and bool(np.any(np.diff(values, axis=-1) > 0)):
        raise ValueError(f"'{prefix + VALUES}' is not a top-k: a row's values are not in descending order")


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
    ids_dtype, ids_shape = id_layout(vocab_size, shape)
    width = id_bytes(vocab_size)
    encoded = _field(
        payload,
        prefix + IDS,
        ids_dtype,
        ids_shape,
        lambda planes: (
            from_byte_planes(planes, width)
            .view(ids_dtype.newbyteorder("<"))
            .astype(ids_dtype, copy=False)
            .reshape(ids_shape)
        ),
    )
    if encoded.shape != ids_shape or encoded.dtype != ids_dtype:
        raise ValueError(
            f"'{prefix + IDS}' is {encoded.dtype} {encoded.shape}, expected {ids_dtype} {ids_shape}"
        )
    ids = decode_ids(encoded)
    values = _field(
        payload, prefix + VALUES, np.dtype(np.float16), shape, lambda planes: _unfilter_values(planes, shape)
    ).astype(np.float32)
    if ids.shape != shape or values.shape != shape:
        raise ValueError(f"'{prefix}' top-k of shape {ids.shape} / {values.shape}, expected {shape}")
    check_knowledge_values(prefix, losses, values)
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
