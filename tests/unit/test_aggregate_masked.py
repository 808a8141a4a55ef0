"""Aggregation helpers for masked, ragged and per-key-subset replies, on fixed arrays."""

from __future__ import annotations

import numpy as np
import pytest

from fedtune.fl.aggregate import (
    apply_mask,
    gather_masked,
    masked_average,
    pack_mask,
    scatter_masked,
    subset_average,
)
from fedtune.fl.validation import ReplyRejected, ReplySpec, check_reply


def test_masked_average_entry_held_by_one_by_two_and_by_none() -> None:
    # Entry 0: both clients; entry 1: only client a; entry 2: only b; entry 3: nobody.
    states = [{"w": np.array([1.0, 2.0, 9.0, 9.0], dtype=np.float32)}, {"w": np.array([4.0, 9.0, 6.0, 9.0])}]
    masks = [{"w": np.array([1, 1, 0, 0], dtype=bool)}, {"w": np.array([1, 0, 1, 0], dtype=bool)}]
    mean, held = masked_average(states, masks, [1, 2])
    np.testing.assert_allclose(mean["w"], [(1 * 1 + 2 * 4) / 3, 2.0, 6.0, 0.0], rtol=1e-6)
    np.testing.assert_array_equal(held["w"], [2, 1, 1, 0])
    assert mean["w"].dtype == np.float32
    # What each receiver keeps: the aggregate times its own mask.
    np.testing.assert_allclose(apply_mask(mean, masks[0])["w"], [3.0, 2.0, 0.0, 0.0], rtol=1e-6)
    np.testing.assert_allclose(apply_mask(mean, masks[1])["w"], [3.0, 0.0, 6.0, 0.0], rtol=1e-6)


def test_masked_average_with_full_masks_is_the_weighted_average() -> None:
    rng = np.random.default_rng(0)
    states = [{"a": rng.normal(size=(3, 4)), "b": rng.normal(size=5)} for _ in range(3)]
    masks = [{"a": np.ones((3, 4), bool), "b": np.ones(5, bool)} for _ in range(3)]
    mean, _ = masked_average(states, masks, [1, 2, 5])
    for key in ("a", "b"):
        expected = sum(w * s[key] for s, w in zip(states, [1, 2, 5], strict=True)) / 8
        np.testing.assert_allclose(mean[key], expected)


def test_masked_average_rejects_a_mask_of_another_shape() -> None:
    with pytest.raises(ValueError, match="mask of 'w'"):
        masked_average([{"w": np.zeros(3)}], [{"w": np.ones(2, bool)}], [1])


def test_subset_average_renormalises_over_each_keys_senders() -> None:
    states = [{"x": np.array([0.0]), "y": np.array([10.0])}, {"x": np.array([3.0])}]
    result = subset_average(states, [1, 2])
    np.testing.assert_allclose(result["x"], [2.0])
    np.testing.assert_allclose(result["y"], [10.0])


def test_subset_average_rejects_disagreeing_shapes() -> None:
    with pytest.raises(ValueError, match="different shapes"):
        subset_average([{"x": np.zeros(2)}, {"x": np.zeros(3)}], [1, 1])


def test_packed_mask_round_trip_and_size() -> None:
    from fedtune.fl.aggregate import unpack_mask

    mask = np.random.default_rng(1).random((5, 7)) > 0.5
    bits = pack_mask(mask)
    assert bits.dtype == np.uint8 and bits.size == 5  # ceil(35 / 8)
    np.testing.assert_array_equal(unpack_mask(bits, (5, 7)), mask)
    with pytest.raises(ValueError, match="does not fit"):
        unpack_mask(bits, (6, 7))


def test_gather_scatter_round_trip_and_length_check() -> None:
    state = {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}
    mask = {"w": np.array([[1, 0, 1], [0, 0, 1]], dtype=bool)}
    values = gather_masked(state, mask)
    np.testing.assert_array_equal(values["w"], [0.0, 2.0, 5.0])
    np.testing.assert_array_equal(scatter_masked(values, mask)["w"], [[0, 0, 2], [0, 0, 5]])
    with pytest.raises(ValueError, match="2 values for a mask holding 3"):
        scatter_masked({"w": np.zeros(2, np.float32)}, mask)


def test_per_client_reply_specs() -> None:
    expect = {
        "c0": ReplySpec.like({"v": np.zeros(2, np.float32)}),
        "c1": ReplySpec.like({"v": np.zeros(3, np.float32)}),
    }
    assert check_reply({"v": np.ones(2, np.float32)}, expect, "c0")
    assert check_reply({"v": np.ones(3, np.float32)}, expect, "c1")
    with pytest.raises(ReplyRejected, match=r"shape \(2,\), expected \(3,\)"):
        check_reply({"v": np.ones(2, np.float32)}, expect, "c1")
    with pytest.raises(ReplyRejected, match="no reply spec for client c2"):
        check_reply({"v": np.ones(2, np.float32)}, expect, "c2")
    assert check_reply({"anything": 1}, None, "c2") == {"anything": 1}


def test_coordinate_median_and_trimmed_mean_ignore_one_liar() -> None:
    from fedtune.fl.aggregate import coordinate_median, robust_aggregate, trimmed_mean

    honest = [{"w": np.array([1.0, 2.0], dtype=np.float32)}, {"w": np.array([3.0, 4.0], dtype=np.float32)}]
    states = [
        *honest,
        {"w": np.array([2.0, 3.0], dtype=np.float32)},
        {"w": np.array([1e6, -1e6], np.float32)},
    ]

    median = coordinate_median(states)
    trimmed = trimmed_mean(states, 0.25)  # drops the lowest and the highest of 4 at every coordinate

    np.testing.assert_allclose(median["w"], [2.5, 2.5])
    np.testing.assert_allclose(trimmed["w"], [2.5, 2.5])
    assert median["w"].dtype == np.float32
    np.testing.assert_allclose(
        robust_aggregate(states, [1, 1, 1, 1], "mean", 0.0)["w"], [250001.5, -249997.75]
    )


def test_masked_median_is_each_entrys_median_over_its_holders() -> None:
    from fedtune.fl.aggregate import masked_median

    states = [
        {"w": np.array([1.0, 5.0, 0.0])},
        {"w": np.array([3.0, 0.0, 0.0])},
        {"w": np.array([9.0, 7.0, 0.0])},
    ]
    masks = [
        {"w": np.array([1, 1, 0], bool)},
        {"w": np.array([1, 0, 0], bool)},
        {"w": np.array([1, 1, 0], bool)},
    ]

    median, held = masked_median(states, masks)

    np.testing.assert_allclose(median["w"], [3.0, 6.0, 0.0])
    np.testing.assert_array_equal(held["w"], [3, 2, 0])
