"""Payloads: what travels between server and clients.

A payload is a flat ``dict[str, np.ndarray | int | float | str | bool]``; tensors go as numpy,
never as bf16 (Flower arrays cannot hold it), so bf16 tensors are widened to fp32 on the way out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    # Imported lazily: a Flower ClientApp relay encodes payloads without paying for torch.
    import torch

Scalar = int | float | str | bool
Value = np.ndarray | Scalar
Payload = dict[str, Value]

_SCALAR_BYTES = 8


class PayloadError(ValueError):
    """A payload that is not a flat dict of arrays and scalars."""


def tensor_to_array(tensor: torch.Tensor) -> np.ndarray:
    import torch

    tensor = tensor.detach().cpu()
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.float()
    return tensor.contiguous().numpy()


def state_to_payload(state: Mapping[str, torch.Tensor], prefix: str = "") -> Payload:
    """A state dict as a payload, optionally with every key prefixed (``prefix + key``)."""
    return {prefix + key: tensor_to_array(value) for key, value in state.items()}


def payload_to_state(payload: Mapping[str, Value], prefix: str = "") -> dict[str, torch.Tensor]:
    """The arrays of a payload whose keys start with ``prefix``, as tensors, prefix removed."""
    import torch

    return {
        key[len(prefix) :]: torch.from_numpy(np.array(value, copy=True))
        for key, value in payload.items()
        if key.startswith(prefix) and isinstance(value, np.ndarray)
    }


def arrays(payload: Mapping[str, Value], prefix: str = "") -> dict[str, np.ndarray]:
    return {
        key[len(prefix) :]: value
        for key, value in payload.items()
        if key.startswith(prefix) and isinstance(value, np.ndarray)
    }


def check_payload(payload: object, where: str) -> Payload:
    """Raise PayloadError unless ``payload`` is a flat dict of str -> array/scalar."""
    if not isinstance(payload, dict):
        raise PayloadError(f"{where}: payload must be a dict, got {type(payload).__name__}")
    for key, value in payload.items():
        if not isinstance(key, str):
            raise PayloadError(f"{where}: payload key {key!r} is not a string")
        if isinstance(value, np.ndarray):
            if value.dtype == object:
                raise PayloadError(f"{where}: payload key '{key}' holds an object array")
        elif not isinstance(value, (int, float, str, bool)):
            raise PayloadError(f"{where}: payload key '{key}' has unsupported type {type(value).__name__}")
    return payload


def payload_nbytes(payload: Mapping[str, Value]) -> int:
    """Bytes the payload occupies on the wire: array buffers, UTF-8 strings, 8 bytes per scalar, keys."""
    total = 0
    for key, value in payload.items():
        total += len(key.encode())
        if isinstance(value, np.ndarray):
            total += int(value.nbytes)
        elif isinstance(value, str):
            total += len(value.encode())
        else:
            total += _SCALAR_BYTES
    return total


REPLY_TO = "reply_to"
"""The entry that ties a message and its reply together: the server puts ``<task>@<round>#<nonce>`` (a
fresh nonce per message) in every message, the client's runtime returns it with the task's reply, and the
server rejects a reply that does not carry the tag it sent that client in that call."""

WIRE_FP16 = "wire/fp16"
"""The payload entry that lists (comma-separated) the arrays sent as fp16 instead of fp32."""
WIRE_FP16_MIN_SIZE = 1024
"""float32 arrays with at least this many entries travel as fp16 under ``fed.wire_dtype: fp16``
(small arrays -- norms, biases, statistics -- are not worth the rounding)."""
_FP16_MAX = float(np.finfo(np.float16).max)


def to_wire(payload: Payload, wire_dtype: str) -> Payload:
    """``payload`` as it travels: with ``fp16``, large float32 arrays become float16 and are listed
    under ``WIRE_FP16`` so the receiver widens them back (``from_wire``); ``fp32`` sends it unchanged.

    A value beyond fp16's range is an error naming the key (it would arrive as inf).
    """
    if wire_dtype == "fp32":
        return payload
    if wire_dtype != "fp16":
        raise ValueError(f"fed.wire_dtype must be fp32 or fp16, got {wire_dtype!r}")
    narrowed: list[str] = []
    wire: Payload = {}
    for key, value in payload.items():
        if isinstance(value, np.ndarray) and value.dtype == np.float32 and value.size >= WIRE_FP16_MIN_SIZE:
            peak = float(np.max(np.abs(value))) if value.size else 0.0
            if peak > _FP16_MAX:
                raise PayloadError(f"'{key}' holds {peak:.4g}, beyond fp16's range: use fed.wire_dtype fp32")
            wire[key] = value.astype(np.float16)
            narrowed.append(key)
        else:
            wire[key] = value
    if narrowed:
        wire[WIRE_FP16] = ",".join(narrowed)
    return wire


def from_wire(payload: Payload) -> Payload:
    """The inverse of ``to_wire``: the listed arrays widened to float32 (their fp16 rounding stays)."""
    listed = payload.get(WIRE_FP16)
    if listed is None:
        return payload
    if not isinstance(listed, str):
        raise PayloadError(f"'{WIRE_FP16}' must be a string of keys")
    keys = set(listed.split(","))
    restored: Payload = {}
    for key, value in payload.items():
        if key == WIRE_FP16:
            continue
        if key in keys:
            if not (isinstance(value, np.ndarray) and value.dtype == np.float16):
                raise PayloadError(f"'{key}' is listed in '{WIRE_FP16}' but is not an fp16 array")
            restored[key] = value.astype(np.float32)
        else:
            restored[key] = value
    missing = keys - set(payload)
    if missing:
        raise PayloadError(f"'{WIRE_FP16}' lists keys that are absent: {sorted(missing)[:3]}")
    return restored
