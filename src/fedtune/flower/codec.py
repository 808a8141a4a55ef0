"""Payload <-> Flower ``RecordDict``: arrays in an ``ArrayRecord``, scalars in a ``ConfigRecord``.

The mapping is one-to-one and lossless for every payload the simulation accepts: dtypes and
shapes of arrays, and the Python type of every scalar (``bool`` stays ``bool``, ``1.0`` stays
``float``) survive the round trip, and the key order of the payload is kept. Bytes are counted
with ``payload_nbytes`` on the decoded payload, the very number the in-process backend records,
so the two backends write the same ``bytes_up`` / ``bytes_down``.

bf16 never travels: Flower serialises arrays with ``np.save``, which has no bfloat16; an array
whose dtype numpy cannot save portably (bf16 from ``ml_dtypes``, object arrays) is refused with
a ``PayloadError`` instead of being silently widened here (``tensor_to_array`` widens torch
bf16 tensors to fp32 before they ever become payload arrays).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, ConfigRecordValues, MetricRecord, RecordDict

from fedtune.fl.payload import Payload, PayloadError, check_payload

HELLO = "fedtune_hello"
"""The query a SuperNode answers with the partition it serves."""
MALFORMED = "malformed reply: "
"""Prefix of a client's error reason when its task returned something that is not a payload."""
ARRAYS = "fedtune.arrays"
SCALARS = "fedtune.scalars"
META = "fedtune.meta"
_ORDER = "fedtune.order"
_FLOATS = "fedtune.floats"
_PORTABLE_KINDS = set("biufc")


def _array(key: str, value: np.ndarray) -> Array:
    if value.dtype.kind not in _PORTABLE_KINDS or value.dtype.name.startswith(("bfloat", "float8")):
        raise PayloadError(
            f"payload key '{key}': dtype {value.dtype} cannot travel on Flower (send fp16/fp32, never bf16)"
        )
    return Array(np.ascontiguousarray(value))


def encode_payload(
    payload: Mapping[str, object], meta: Mapping[str, int | float | str] | None = None
) -> RecordDict:
    """A payload (plus protocol metadata such as the round) as a Flower ``RecordDict``."""
    checked = check_payload(dict(payload), "payload")
    arrays: dict[str, Array] = {}
    scalars: dict[str, ConfigRecordValues] = {}
    floats: list[str] = []
    for key, value in checked.items():
        if isinstance(value, np.ndarray):
            arrays[key] = _array(key, value)
        else:
            scalars[key] = value
            # An integral float (1.0) must come back as a float, not an int.
            if isinstance(value, float):
                floats.append(key)
    control = ConfigRecord({_ORDER: list(checked), _FLOATS: floats} if checked else {})
    records: dict[str, ArrayRecord | MetricRecord | ConfigRecord] = {
        ARRAYS: ArrayRecord(arrays),
        SCALARS: ConfigRecord(scalars),
        META: ConfigRecord(dict(meta or {})),
    }
    records[f"{META}.control"] = control
    return RecordDict(records)


def decode_payload(content: RecordDict) -> Payload:
    """The payload a ``RecordDict`` made by ``encode_payload`` carries."""
    arrays: Mapping[str, Array] = content.array_records.get(ARRAYS, ArrayRecord())
    scalars = content.config_records.get(SCALARS, ConfigRecord())
    control = content.config_records.get(f"{META}.control", ConfigRecord())
    floats = set(_strings(control.get(_FLOATS, [])))
    values: dict[str, object] = {key: array.numpy() for key, array in arrays.items()}
    for key, value in scalars.items():
        values[key] = float(value) if key in floats and isinstance(value, (int, float)) else value
    order = _strings(control.get(_ORDER, [])) or list(values)
    payload = {key: values[key] for key in order if key in values}
    payload.update({key: value for key, value in values.items() if key not in payload})
    return check_payload(payload, "decoded payload")


def decode_meta(content: RecordDict) -> dict[str, int | float | str]:
    meta = content.config_records.get(META, ConfigRecord())
    return {key: value for key, value in meta.items() if isinstance(value, (int, float, str))}


def _strings(value: object) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else []
