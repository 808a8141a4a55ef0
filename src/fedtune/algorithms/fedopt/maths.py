"""The adaptive server step of Reddi et al.'s Algorithm 2 (pure numpy).

Every function works entry by entry: arrays of any shape, all of one call shaped alike. Delta is the
pseudo-gradient (released mean minus the state sent), m the first moment, v the second.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

SecondMoment = Callable[[np.ndarray, np.ndarray, float], np.ndarray]
"""``(v_{t-1}, Delta_t, beta2) -> v_t``."""


def adagrad_second_moment(previous: np.ndarray, delta: np.ndarray, beta2: float) -> np.ndarray:
    """v_t = v_{t-1} + Delta_t^2 (``beta2`` unused: Adagrad does not forget)."""
    return previous + delta**2


def adam_second_moment(previous: np.ndarray, delta: np.ndarray, beta2: float) -> np.ndarray:
    """v_t = beta2 v_{t-1} + (1 - beta2) Delta_t^2."""
    return beta2 * previous + (1 - beta2) * delta**2


def yogi_second_moment(previous: np.ndarray, delta: np.ndarray, beta2: float) -> np.ndarray:
    """v_t = v_{t-1} - (1 - beta2) Delta_t^2 sign(v_{t-1} - Delta_t^2): v moves towards Delta^2 by an
    additive step, never further than Adam's multiplicative one."""
    squared = delta**2
    return previous - (1 - beta2) * squared * np.sign(previous - squared)


SECOND_MOMENTS: dict[str, SecondMoment] = {
    "adagrad": adagrad_second_moment,
    "adam": adam_second_moment,
    "yogi": yogi_second_moment,
}
"""Each optimiser's second-moment rule, by name."""


def initial_moments(
    state: Mapping[str, np.ndarray], tau: float
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """``(m_{-1}, v_{-1})``: zeros and tau^2 (Algorithm 2 asks v_{-1} >= tau^2), each shaped and typed as
    its entry of ``state``."""
    first = {key: np.zeros_like(value) for key, value in state.items()}
    second = {key: np.full_like(value, tau**2) for key, value in state.items()}
    return first, second


def adaptive_step(
    current: Mapping[str, np.ndarray],
    released: Mapping[str, np.ndarray],
    first: Mapping[str, np.ndarray],
    second: Mapping[str, np.ndarray],
    *,
    second_moment: SecondMoment,
    server_lr: float,
    tau: float,
    beta1: float,
    beta2: float,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, np.ndarray]]:
    """One server round; returns ``(x_{t+1}, m_t, v_t)``.

    Delta_t = released - current; m_t = beta1 m_{t-1} + (1 - beta1) Delta_t; v_t = second_moment(v_{t-1},
    Delta_t, beta2); x_{t+1} = x_t + server_lr m_t / (sqrt(v_t) + tau). All dicts keyed alike; float64
    maths, each result in its input's dtype.
    """
    new_state, new_first, new_second = {}, {}, {}
    for key, x in current.items():
        x64 = x.astype(np.float64)
        delta = released[key].astype(np.float64) - x64
        m = beta1 * first[key].astype(np.float64) + (1 - beta1) * delta
        v = second_moment(second[key].astype(np.float64), delta, beta2)
        new_state[key] = (x64 + server_lr * m / (np.sqrt(v) + tau)).astype(x.dtype)
        new_first[key] = m.astype(first[key].dtype)
        new_second[key] = v.astype(second[key].dtype)
    return new_state, new_first, new_second
