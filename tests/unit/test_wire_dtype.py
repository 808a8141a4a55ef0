"""fed.wire_dtype fp16: large float arrays travel at half the bytes and arrive widened."""

from __future__ import annotations

import numpy as np
import pytest

from fedtune.fl.payload import WIRE_FP16, PayloadError, from_wire, payload_nbytes, to_wire


def payload() -> dict[str, object]:
    rng = np.random.default_rng(0)
    return {
        "big": rng.normal(size=(64, 32)).astype(np.float32),
        "small": np.ones(4, np.float32),
        "ids": np.arange(5000, dtype=np.int32),
        "n": 3,
    }


def test_fp16_halves_large_float_arrays_only() -> None:
    sent = payload()
    wire = to_wire(sent, "fp16")  # type: ignore[arg-type]
    assert wire["big"].dtype == np.float16 and wire["small"].dtype == np.float32  # type: ignore[union-attr]
    assert wire["ids"].dtype == np.int32 and wire[WIRE_FP16] == "big"  # type: ignore[union-attr]
    saved = payload_nbytes(sent) - payload_nbytes(wire)  # type: ignore[arg-type]
    assert saved == 64 * 32 * 2 - len(WIRE_FP16) - len("big")
    back = from_wire(wire)
    assert set(back) == set(sent) and back["big"].dtype == np.float32  # type: ignore[union-attr]
    np.testing.assert_allclose(back["big"], sent["big"], rtol=1e-3)  # type: ignore[arg-type]
    assert to_wire(sent, "fp32") is sent  # type: ignore[arg-type]


def test_out_of_range_values_and_bad_markers_are_errors() -> None:
    with pytest.raises(PayloadError, match="'big' holds 1e\\+05, beyond fp16's range"):
        to_wire({"big": np.full(2048, 1e5, np.float32)}, "fp16")
    with pytest.raises(PayloadError, match="not an fp16 array"):
        from_wire({"x": np.zeros(3, np.float32), WIRE_FP16: "x"})
    with pytest.raises(PayloadError, match="absent"):
        from_wire({WIRE_FP16: "ghost"})
