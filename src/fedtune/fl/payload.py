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
