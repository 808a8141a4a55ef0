"""FedAdagrad, FedAdam and FedYogi: two server rounds of each on fixed arrays, against Algorithm 2 by hand."""

from __future__ import annotations

import numpy as np
import pytest

from fedtune.algorithms.fedopt import (
    adagrad_second_moment,
    adam_second_moment,
    adaptive_step,
    initial_moments,
    yogi_second_moment,
)
from fedtune.algorithms.fedopt.maths import SecondMoment
from fedtune.config import ConfigError, validate_config

Arrays = dict[str, np.ndarray]


def two_rounds(
    rule: SecondMoment,
    released: list[list[float]],
    *,
    server_lr: float,
    tau: float,
    beta1: float,
    beta2: float,
) -> list[tuple[Arrays, Arrays, Arrays]]:
    """(x, m, v) after each round, from x_0 = [1, 2], m_{-1} = 0, v_{-1} = tau^2."""
    state: Arrays = {"w": np.array([1.0, 2.0])}
    first, second = initial_moments(state, tau)
    steps = []
    for mean in released:
        state, first, second = adaptive_step(
            state,
            {"w": np.array(mean)},
            first,
            second,
            second_moment=rule,
            server_lr=server_lr,
            tau=tau,
            beta1=beta1,
            beta2=beta2,
        )
        steps.append((state, first, second))
    return steps


def test_fedadagrad_two_rounds_by_hand() -> None:
    # Prepare: tau = 3 (v_{-1} = 9), Delta_1 = [4, -4], Delta_2 = [12, 0]
    released = [[5.0, -2.0], [13.25, 1.75]]

    # Execute
    (x1, m1, v1), (x2, m2, v2) = two_rounds(
        adagrad_second_moment, released, server_lr=1.0, tau=3.0, beta1=0.5, beta2=0.99
    )

    # Assert: m_1 = [2, -2]; v_1 = 9 + 16 = [25, 25]; x_1 = x_0 + m_1 / (5 + 3) = [1.25, 1.75]
    np.testing.assert_allclose(m1["w"], [2.0, -2.0])
    np.testing.assert_allclose(v1["w"], [25.0, 25.0])
    np.testing.assert_allclose(x1["w"], [1.25, 1.75])
    # m_2 = [1 + 6, -1 + 0] = [7, -1]; v_2 = [25 + 144, 25] = [169, 25]; x_2 = x_1 + [7 / 16, -1 / 8]
    np.testing.assert_allclose(m2["w"], [7.0, -1.0])
    np.testing.assert_allclose(v2["w"], [169.0, 25.0])
    np.testing.assert_allclose(x2["w"], [1.6875, 1.625])


def test_fedadam_two_rounds_by_hand() -> None:
    # Prepare: tau = 3 (v_{-1} = 9), eta = 2, beta2 = 0.75, Delta_1 = [3, 13], Delta_2 = [13, -7]
    released = [[4.0, 15.0], [14.5, -3.7]]

    # Execute
    (x1, m1, v1), (x2, m2, v2) = two_rounds(
        adam_second_moment, released, server_lr=2.0, tau=3.0, beta1=0.5, beta2=0.75
    )

    # Assert: m_1 = [1.5, 6.5]; v_1 = 0.75 * 9 + 0.25 * [9, 169] = [9, 49]; x_1 = x_0 + 2 [1.5 / 6, 6.5 / 10]
    np.testing.assert_allclose(m1["w"], [1.5, 6.5])
    np.testing.assert_allclose(v1["w"], [9.0, 49.0])
    np.testing.assert_allclose(x1["w"], [1.5, 3.3])
    # m_2 = [0.75 + 6.5, 3.25 - 3.5]; v_2 = [6.75 + 42.25, 36.75 + 12.25]; x_2 = x_1 + 2 [7.25, -0.25] / 10
    np.testing.assert_allclose(m2["w"], [7.25, -0.25])
    np.testing.assert_allclose(v2["w"], [49.0, 49.0])
    np.testing.assert_allclose(x2["w"], [2.95, 3.25])


def test_fedyogi_two_rounds_by_hand() -> None:
    # Prepare: tau = 1 (v_{-1} = 1), beta2 = 0.5, Delta_1 = [4, 1], Delta_2 = [2, -4]
    released = [[5.0, 3.0], [3.5, -1.75]]

    # Execute
    (x1, m1, v1), (x2, m2, v2) = two_rounds(
        yogi_second_moment, released, server_lr=1.0, tau=1.0, beta1=0.5, beta2=0.5
    )

    # Assert: v_1 = [1 + 0.5 * 16 (v < Delta^2: up), 1 (v = Delta^2: sign 0, unchanged)] = [9, 1]
    np.testing.assert_allclose(m1["w"], [2.0, 0.5])
    np.testing.assert_allclose(v1["w"], [9.0, 1.0])
    np.testing.assert_allclose(x1["w"], [1.5, 2.25])  # x_0 + [2 / (3 + 1), 0.5 / (1 + 1)]
    # v_2 = [9 - 0.5 * 4 (v > Delta^2: down by an additive step; Adam's would be 6.5), 1 + 0.5 * 16]
    np.testing.assert_allclose(m2["w"], [2.0, -1.75])
    np.testing.assert_allclose(v2["w"], [7.0, 9.0])
    np.testing.assert_allclose(x2["w"], [1.5 + 2 / (np.sqrt(7) + 1), 2.25 - 1.75 / (3 + 1)])


@pytest.mark.parametrize("rule", [adagrad_second_moment, adam_second_moment, yogi_second_moment])
def test_the_step_keeps_each_arrays_dtype_and_moments_start_at_zero_and_tau_squared(
    rule: SecondMoment,
) -> None:
    state: Arrays = {"a": np.ones((2, 3), dtype=np.float32), "b": np.zeros(4, dtype=np.float16)}
    first, second = initial_moments(state, tau=0.5)
    assert all(not value.any() for value in first.values())
    assert all(np.all(value == 0.25) for value in second.values())
    released = {key: value + 1 for key, value in state.items()}
    new, m, v = adaptive_step(
        state, released, first, second, second_moment=rule, server_lr=0.1, tau=0.5, beta1=0.9, beta2=0.99
    )
    for key, value in state.items():
        assert new[key].dtype == m[key].dtype == v[key].dtype == value.dtype, key
        assert new[key].shape == value.shape and np.all(new[key] > value), key


@pytest.mark.parametrize("name", ["fedadam", "fedyogi", "fedadagrad"])
def test_each_name_is_its_own_method_with_its_section_and_allows_dp(name: str) -> None:
    from fedtune.algorithms.registry import get_algorithm

    method = get_algorithm(name)
    cfg = validate_config({"algorithm": name, name: {"server_lr": 0.5}})
    assert method.name == name and method.Config.dp_refused is None
    assert cfg.section(name).server_lr == 0.5 and isinstance(cfg.section(name), method.Config)


def test_fedadagrad_has_no_beta2_and_a_bad_value_names_its_key() -> None:
    with pytest.raises(ConfigError, match="beta2"):
        validate_config({"algorithm": "fedadagrad", "fedadagrad": {"beta2": 0.9}})
    with pytest.raises(ConfigError, match="tau"):
        validate_config({"algorithm": "fedyogi", "fedyogi": {"tau": 0}})
