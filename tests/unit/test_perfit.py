"""PerFIT's maths on fixed arrays: ranks, schedule, importance, global top-k, symmetric init."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from fedtune.algorithms.perfit import (
    expanded_rank,
    importance_scores,
    keep_schedule,
    kept_count,
    symmetric_init,
    top_entries,
)
from fedtune.algorithms.perfit.maths import thinly_held_share, update_global


def test_expanded_rank_as_in_the_paper() -> None:
    assert expanded_rank(8, 0.33) == 12 and expanded_rank(8, 0.5) == 16 and expanded_rank(4, 0.5) == 8


def test_schedule_ends_exactly_at_the_rank_r_count_and_decreases() -> None:
    total, final = 1200, 800  # r_e = 12, r = 8
    kept = [keep_schedule(total, final, t, 5) for t in range(6)]
    assert kept[0] == total and kept[-1] == final
    assert all(a > b for a, b in itertools.pairwise(kept))
    # The pruned fraction after step t is 1 - (1 - s)^(t / T_p) with 1 - s = 800 / 1200.
    assert kept[2] == round(1200 * (2 / 3) ** (2 / 5))


def test_kept_count_is_a_rank_r_lora() -> None:
    from fedtune.models.lora import adapter_parameters, attach_lora
    from fedtune.models.tiny import tiny_model

    model, _ = tiny_model("llama", seed=0)
    expanded = attach_lora(model, r=8, alpha=8, dropout=0.0, target_modules=["q_proj", "k_proj", "v_proj"])
    shapes = {k: tuple(p.shape) for k, p in adapter_parameters(expanded).items()}
    small, _ = tiny_model("llama", seed=0)
    rank4 = attach_lora(small, r=4, alpha=4, dropout=0.0, target_modules=["q_proj", "k_proj", "v_proj"])
    assert kept_count(shapes, 4) == sum(p.numel() for p in adapter_parameters(rank4).values())
    assert kept_count(shapes, 8) == sum(int(np.prod(s)) for s in shapes.values())


def test_importance_formulas() -> None:
    w, g, h = np.array([2.0, -1.0, 0.0]), np.array([0.5, 3.0, 9.0]), np.array([4.0, 1.0, 1.0])
    np.testing.assert_allclose(importance_scores(w, g, h, "first"), [1.0, 3.0, 0.0])
    np.testing.assert_allclose(importance_scores(w, g, h, "second"), [16.0, 1.0, 0.0])
    np.testing.assert_allclose(importance_scores(w, g, h, "mixed"), [abs(1.0 - 8.0), abs(-3.0 - 0.5), 0.0])


def test_top_entries_ranks_all_modules_together_keeps_pruned_pruned_and_breaks_ties_by_position() -> None:
    scores = {"a": np.array([[5.0, 1.0], [1.0, 0.5]]), "b": np.array([9.0, 1.0, 7.0])}
    current = {"a": np.array([[True, True], [True, True]]), "b": np.array([False, True, True])}
    masks = top_entries(scores, current, 4)
    # 9.0 is pruned already; then 7, 5, and the first two of the three 1.0s in order (a[0,1], a[1,0]).
    np.testing.assert_array_equal(masks["a"], [[True, True], [True, False]])
    np.testing.assert_array_equal(masks["b"], [False, False, True])
    with pytest.raises(ValueError, match="only 6 are left"):
        top_entries(scores, current, 7)


def test_symmetric_init_is_n_0_1_over_d_for_a_and_b() -> None:
    shapes = {"x.lora_A.weight": (64, 256), "x.lora_B.weight": (128, 64)}
    init = symmetric_init(shapes, seed=0)
    assert init["x.lora_A.weight"].std() == pytest.approx(1 / 16, rel=0.05)
    assert init["x.lora_B.weight"].std() == pytest.approx(1 / 16, rel=0.05)  # d = the layer's input width
    assert np.array_equal(symmetric_init(shapes, seed=0)["x.lora_B.weight"], init["x.lora_B.weight"])


def test_the_global_module_takes_the_weighted_mean_where_held_and_keeps_the_rest() -> None:
    # Prepare: G of 4 entries; client a holds entries 0 and 1, client b entries 1 and 2, entry 3 no one.
    module = {"m": np.array([10.0, 20.0, 30.0, 40.0], dtype=np.float32)}
    states = [{"m": np.array([1.0, 2.0, 0.0, 0.0], dtype=np.float32)}, {"m": np.array([0.0, 6.0, 3.0, 0.0])}]
    masks = [{"m": np.array([1, 1, 0, 0], dtype=bool)}, {"m": np.array([0, 1, 1, 0], dtype=bool)}]

    # Execute: weights 1 and 3
    updated = update_global(module, states, masks, [1, 3])

    # Assert
    np.testing.assert_allclose(updated["m"], [1.0, (2.0 + 3 * 6.0) / 4, 3.0, 40.0])
    assert updated["m"].dtype == np.float32
    np.testing.assert_array_equal(module["m"], [10.0, 20.0, 30.0, 40.0])  # the input is left as it was


def test_the_share_of_entries_a_median_cannot_protect() -> None:
    # Four entries: held by 4, 3, 2 and 1 of four clients; one entry nobody holds.
    masks = [{"w": np.array([1, 1, 1, 1, 0], dtype=bool)}, {"w": np.array([1, 1, 1, 0, 0], dtype=bool)}]
    masks += [{"w": np.array([1, 1, 0, 0, 0], dtype=bool)}, {"w": np.array([1, 0, 0, 0, 0], dtype=bool)}]
    assert thinly_held_share(masks) == 0.5  # the entries held by 2 and by 1, of the 4 held
    assert thinly_held_share(masks[:1]) == 1.0 and thinly_held_share([]) == 0.0
