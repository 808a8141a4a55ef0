"""What PerFIT puts on the wire: a client's mask once, as packed bits, then only masked values.

- ``search`` (server -> client): ``{"budget": rank}``; reply ``mask/<key>`` (uint8, ``ceil(n / 8)``
  for a module key of n entries) and ``num_examples``.
- ``fit`` (server -> client): ``{"round": t}``, plus ``values/<key>`` (G at the client's entries) with
  ``perfit.start: global``; reply ``values/<key>`` (float32, one per entry the
  client's mask holds, C order) and the fit statistics (``local.REPLY_SCALARS``).
- ``update`` (server -> client, Alg. 3, ``perfit.start: own`` only): ``values/<key>``, the masked mean at
  the client's own entries.
- ``evaluate_personal`` (server -> client): ``{"round": t}``, plus ``values/<key>`` (G at the client's
  entries) with ``perfit.start: global``; reply: the metrics, and ``after_fit/`` metrics from a client
  that trained in round t.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from fedtune.algorithms.local import REPLY_SCALARS
from fedtune.fl.aggregate import pack_mask
from fedtune.fl.payload import Payload
from fedtune.fl.validation import ArraySpec, ReplySpec

MASK = "mask/"
VALUES = "values/"
AFTER_FIT = "after_fit/"
"""Prefix of a sampled client's ``evaluate_personal`` metrics on the values it trained this round."""


def mask_payload(masks: Mapping[str, np.ndarray]) -> Payload:
    """Boolean masks as ``mask/<key>`` packed bits."""
    return {MASK + key: pack_mask(mask) for key, mask in masks.items()}


def values_payload(values: Mapping[str, np.ndarray]) -> Payload:
    """Masked values (one flat array per key) as ``values/<key>``."""
    return {VALUES + key: value for key, value in values.items()}


def search_spec(shapes: Mapping[str, tuple[int, ...]], example_limits: Mapping[str, int]) -> ReplySpec:
    """A valid ``search`` reply: every module's packed mask and the example count."""
    return ReplySpec(
        {MASK + k: ArraySpec(((int(np.prod(shape)) + 7) // 8,), "uint8") for k, shape in shapes.items()},
        {"num_examples": int},
        example_limits=example_limits,
    )


def fit_spec(
    masks: Mapping[str, np.ndarray],
    norm_bound: float | None,
    example_limits: Mapping[str, int],
    sent: Mapping[str, np.ndarray] | None = None,
) -> ReplySpec:
    """A valid ``fit`` reply from the client holding ``masks``: exactly its masked values; with ``sent``
    (the values the client started from, G at its mask) the update norm is measured against them."""
    arrays_spec = {VALUES + k: ArraySpec((int(m.sum()),), "float32") for k, m in masks.items()}
    reference = None if sent is None else {VALUES + k: v for k, v in sent.items()}
    return ReplySpec(
        arrays_spec, REPLY_SCALARS, norm_bound=norm_bound, reference=reference, example_limits=example_limits
    )
