"""FedAvgM's server step on fixed arrays."""

from __future__ import annotations

import numpy as np

from fedtune.algorithms.fedavgm import momentum_step


def test_momentum_step_on_fixed_arrays() -> None:
    current = {"w": np.array([1.0, 2.0], dtype=np.float32)}
    average = {"w": np.array([0.0, 4.0], dtype=np.float32)}
    velocity = {"w": np.array([0.5, -1.0], dtype=np.float32)}
    new, v = momentum_step(current, average, velocity, lr=0.5, momentum=0.9)
    # g = x - avg = [1, -2]; v = 0.9 * [0.5, -1] + g = [1.45, -2.9]; x - 0.5 v = [0.275, 3.45]
    np.testing.assert_allclose(v["w"], [1.45, -2.9], rtol=1e-6)
    np.testing.assert_allclose(new["w"], [0.275, 3.45], rtol=1e-6)
    assert new["w"].dtype == np.float32 and v["w"].dtype == np.float32


def test_no_momentum_and_unit_lr_is_fedavg() -> None:
    current = {"w": np.array([1.0, 2.0])}
    average = {"w": np.array([3.0, -1.0])}
    new, _ = momentum_step(current, average, {"w": np.zeros(2)}, lr=1.0, momentum=0.0)
    np.testing.assert_allclose(new["w"], average["w"])
