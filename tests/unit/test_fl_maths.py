from __future__ import annotations

import numpy as np
import pytest
import torch

from fedtune.fl.aggregate import server_step, weighted_average
from fedtune.fl.federation import seeded_sample
from fedtune.fl.payload import PayloadError, check_payload, payload_nbytes, payload_to_state, state_to_payload
from fedtune.fl.validation import ArraySpec, ReplyRejected, ReplySpec, validate_reply


def test_weighted_average_by_example_count() -> None:
    states = [{"w": np.array([0.0, 2.0], dtype=np.float32)}, {"w": np.array([4.0, 6.0], dtype=np.float32)}]
    result = weighted_average(states, [1, 3])
    np.testing.assert_allclose(result["w"], [3.0, 5.0])
    assert result["w"].dtype == np.float32


def test_weighted_average_rejects_zero_weights() -> None:
    with pytest.raises(ValueError, match="zero"):
        weighted_average([{"w": np.zeros(2)}], [0])


def test_server_step_interpolates() -> None:
    current = {"w": np.array([0.0, 0.0])}
    average = {"w": np.array([2.0, 4.0])}
    np.testing.assert_allclose(server_step(current, average, 0.5)["w"], [1.0, 2.0])
    np.testing.assert_allclose(server_step(current, average, 1.0)["w"], [2.0, 4.0])


def test_payload_round_trip_widens_bf16() -> None:
    state = {"a": torch.ones(2, 3, dtype=torch.bfloat16), "b": torch.arange(4, dtype=torch.float32)}
    payload = state_to_payload(state, prefix="adapter/")
    assert payload["adapter/a"].dtype == np.float32
    back = payload_to_state(payload, prefix="adapter/")
    assert torch.equal(back["b"], state["b"])


def test_payload_nbytes_counts_arrays_strings_scalars_keys() -> None:
    payload = {"x": np.zeros(10, dtype=np.float32), "s": "abc", "n": 3}
    assert payload_nbytes(payload) == 40 + 3 + 8 + 3


def test_check_payload_rejects_nested_values() -> None:
    with pytest.raises(PayloadError, match="'bad'"):
        check_payload({"bad": [1, 2]}, "reply")


def spec() -> ReplySpec:
    template = {"w": np.zeros((2, 2), dtype=np.float32)}
    return ReplySpec.like(template, scalars={"num_examples": int}, norm_bound=1.0)


def good_reply() -> dict[str, object]:
    return {"w": np.full((2, 2), 0.1, dtype=np.float32), "num_examples": 5}


def test_valid_reply_passes() -> None:
    assert validate_reply(good_reply(), spec())["num_examples"] == 5


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"w": np.zeros((2, 3), dtype=np.float32)}, "shape"),
        ({"w": np.zeros((2, 2), dtype=np.float64)}, "dtype"),
        ({"w": np.array([[np.nan, 0], [0, 0]], dtype=np.float32)}, "NaN"),
        ({"w": np.full((2, 2), 10.0, dtype=np.float32)}, "norm"),
        ({"num_examples": "five"}, "num_examples"),
        ({"extra": np.zeros(1, dtype=np.float32)}, "unexpected"),
    ],
)
def test_bad_replies_are_rejected_with_a_reason(change: dict[str, object], reason: str) -> None:
    reply = good_reply()
    reply.update(change)
    with pytest.raises(ReplyRejected, match=reason):
        validate_reply(reply, spec())


def test_missing_array_and_scalar() -> None:
    with pytest.raises(ReplyRejected, match="missing arrays"):
        validate_reply({"num_examples": 1}, spec())
    with pytest.raises(ReplyRejected, match="missing scalar"):
        validate_reply({"w": np.zeros((2, 2), dtype=np.float32)}, spec())


def test_seeded_sample_is_deterministic_and_varies_by_round() -> None:
    ids = [f"c{i:02d}" for i in range(20)]
    first = seeded_sample(ids, 5, seed=1, rnd=3)
    assert first == seeded_sample(ids, 5, seed=1, rnd=3)
    assert len(set(first)) == 5
    assert any(seeded_sample(ids, 5, seed=1, rnd=r) != first for r in range(4, 10))
    assert seeded_sample(ids, 30, seed=1, rnd=1) == ids


@pytest.mark.parametrize(
    ("count", "reason"), [(10**9, "exceeds the 40 examples"), (0, "positive"), (-5, "positive")]
)
def test_an_implausible_aggregation_weight_is_rejected(count: int, reason: str) -> None:
    spec = ReplySpec.like({}, scalars={"num_examples": int}, example_limits={"c0": 40})

    with pytest.raises(ReplyRejected, match=reason):
        validate_reply({"num_examples": count}, spec, "c0")


def test_a_plausible_weight_passes_and_unknown_clients_need_only_be_positive() -> None:
    spec = ReplySpec.like({}, scalars={"num_examples": int}, example_limits={"c0": 40})

    assert validate_reply({"num_examples": 40}, spec, "c0") == {"num_examples": 40}
    assert validate_reply({"num_examples": 10**6}, spec, "other") == {"num_examples": 10**6}


@pytest.mark.parametrize(
    ("key", "value"), [("train_loss", -1e9), ("tokens", -1_000_000_000), ("trained_examples", -3)]
)
def test_a_reported_statistic_outside_what_it_can_be_is_rejected(key: str, value: float) -> None:
    scalars = {"num_examples": int, "train_loss": float, "tokens": int, "trained_examples": int}
    reply = {**good_reply(), "train_loss": 1.5, "tokens": 100, "trained_examples": 8}
    checked = ReplySpec({"w": ArraySpec((2, 2), "float32")}, scalars)
    assert validate_reply(reply, checked)["train_loss"] == 1.5

    reply[key] = value

    with pytest.raises(ReplyRejected, match=f"'{key}' = .* is outside what it can be"):
        validate_reply(reply, checked)


def test_an_undeclared_non_finite_number_and_an_empty_evaluation_are_rejected() -> None:
    evaluation = ReplySpec(scalars={"num_eval_examples": int, "round": int})
    honest = {"metric/perplexity": 12.5, "num_eval_examples": 8, "round": 1}
    assert validate_reply(honest, evaluation)["metric/perplexity"] == 12.5

    with pytest.raises(ReplyRejected, match="'metric/perplexity' is not finite"):
        validate_reply({**honest, "metric/perplexity": float("nan")}, evaluation)
    with pytest.raises(ReplyRejected, match="'num_eval_examples' = -3"):
        validate_reply({**honest, "num_eval_examples": -3}, evaluation)
