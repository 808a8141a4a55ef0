"""Payload <-> Flower RecordDict and the worker's framing: lossless, byte-exact, no bf16."""

from __future__ import annotations

import socket
import threading

import numpy as np
import pytest
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects
from flwr.supercore.inflatable.inflatable_utils import inflate_object_from_contents

from fedtune.fl.payload import Payload, PayloadError, payload_nbytes, tensor_to_array
from fedtune.flower.codec import decode_meta, decode_payload, encode_payload
from fedtune.flower.worker import pack_arrays, recv_frame, send_frame, unpack_arrays


def sample_payload() -> Payload:
    return {
        "adapter/b": np.arange(6, dtype=np.float32).reshape(2, 3),
        "adapter/a": np.zeros((0, 4), dtype=np.float16),
        "ids": np.array([[1, 2]], dtype=np.int32),
        "mask": np.array([True, False]),
        "num_examples": 3,
        "train_loss": 1.0,
        "name": "c00",
        "kept": True,
    }


def assert_same(actual: Payload, expected: Payload) -> None:
    assert list(actual) == list(expected)
    for key, value in expected.items():
        got = actual[key]
        assert type(got) is type(value), key
        if isinstance(value, np.ndarray):
            assert isinstance(got, np.ndarray)
            assert got.dtype == value.dtype and got.shape == value.shape, key
            np.testing.assert_array_equal(got, value)
        else:
            assert got == value, key


def test_record_dict_round_trip_through_flower_serialisation() -> None:
    # Prepare
    payload = sample_payload()
    content = encode_payload(payload, {"round": 2, "task": "fit"})
    # Execute: deflate every object as Flower does on the wire, inflate them back
    objects = get_all_nested_objects(content)
    restored = inflate_object_from_contents(
        content.object_id, {oid: obj.deflate() for oid, obj in objects.items()}
    )
    # Assert
    assert_same(decode_payload(restored), payload)
    assert decode_meta(restored) == {"round": 2, "task": "fit"}
    assert payload_nbytes(decode_payload(restored)) == payload_nbytes(payload)


def test_empty_payload_round_trips() -> None:
    assert decode_payload(encode_payload({})) == {}


def test_bf16_never_travels() -> None:
    import torch

    # Tensors are widened before they become payload arrays ...
    widened = tensor_to_array(torch.ones(3, dtype=torch.bfloat16))
    assert widened.dtype == np.float32
    assert decode_payload(encode_payload({"w": widened}))["w"].dtype == np.float32
    # ... and an opaque 2-byte dtype (what bf16 is to plain numpy) is refused, not sent.
    with pytest.raises(PayloadError, match="never bf16"):
        encode_payload({"w": np.zeros(2, dtype=[("raw", "V2")])})


def test_worker_frames_round_trip() -> None:
    # Prepare
    payload = sample_payload()
    description, blobs = pack_arrays(payload)
    left, right = socket.socketpair()
    # Execute
    sender = threading.Thread(target=send_frame, args=(left, {"payload": description, "round": 1}, blobs))
    sender.start()
    header, received = recv_frame(right)
    sender.join()
    left.close()
    right.close()
    # Assert
    assert header["round"] == 1
    assert_same(unpack_arrays(header["payload"], received), payload)
