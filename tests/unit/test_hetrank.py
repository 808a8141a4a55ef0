"""The heterogeneous-rank maths (HetLoRA, FlexLoRA and what they share) on fixed arrays."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedtune.algorithms.flexlora.config import FlexLoRAConfig
from fedtune.algorithms.flexlora.maths import product_mean, svd_factors
from fedtune.algorithms.hetlora.config import HetLoRAConfig
from fedtune.algorithms.hetlora.maths import (
    prunes,
    sparsity_weighted_mean,
    sparsity_weights,
    tail_norm,
    tail_penalty,
    tail_start,
)
from fedtune.algorithms.hetrank.config import ranks_problem
from fedtune.algorithms.hetrank.maths import (
    adapter_rank,
    assign_ranks,
    lora_pairs,
    rank_masks,
    truncate,
    zero_pad,
)
from fedtune.algorithms.hetrank.server import rank_spec
from fedtune.algorithms.local import REPLY_SCALARS
from fedtune.fl.validation import ReplyRejected, validate_reply

A, B = "m.q.lora_A.weight", "m.q.lora_B.weight"


def lora(a: list[list[float]], b: list[list[float]]) -> dict[str, np.ndarray]:
    return {A: np.array(a, dtype=np.float32), B: np.array(b, dtype=np.float32)}


def random_lora(rng: np.random.Generator, rank: int, d_out: int = 5, d_in: int = 6) -> dict[str, np.ndarray]:
    return {A: rng.normal(size=(rank, d_in)), B: rng.normal(size=(d_out, rank))}


# ----- shared: truncation, padding, masks, assignment -----------------------------------------------
def test_truncate_keeps_the_first_ranks_and_zero_pad_appends_zero_ones() -> None:
    adapter = lora([[1, 2], [3, 4], [5, 6]], [[1, 0, 2], [0, 1, 3]])  # A (3, 2), B (2, 3): rank 3
    cut = truncate(adapter, 2)
    np.testing.assert_array_equal(cut[A], [[1, 2], [3, 4]])
    np.testing.assert_array_equal(cut[B], [[1, 0], [0, 1]])
    padded = zero_pad(cut, 4)
    np.testing.assert_array_equal(padded[A], [[1, 2], [3, 4], [0, 0], [0, 0]])
    np.testing.assert_array_equal(padded[B], [[1, 0, 0, 0], [0, 1, 0, 0]])
    # Padding leaves the product alone: B A of the cut equals that of the padded one.
    np.testing.assert_array_equal(padded[B] @ padded[A], cut[B] @ cut[A])
    assert adapter_rank(adapter) == 3 and adapter_rank(padded) == 4


def test_rank_masks_cover_exactly_the_first_ranks() -> None:
    masks = rank_masks({A: (3, 2), B: (2, 3)}, 1)
    np.testing.assert_array_equal(masks[A], [[True, True], [False, False], [False, False]])
    np.testing.assert_array_equal(masks[B], [[True, False, False], [True, False, False]])


def test_ranks_are_assigned_round_robin_in_client_order() -> None:
    assert assign_ranks(["c0", "c1", "c2", "c3", "c4"], [2, 4, 8]) == {
        "c0": 2,
        "c1": 4,
        "c2": 8,
        "c3": 2,
        "c4": 4,
    }


def test_a_lone_lora_matrix_is_an_error() -> None:
    with pytest.raises(KeyError, match="lora_B partner"):
        lora_pairs([A])


def test_ranks_are_checked_against_lora_r() -> None:
    assert ranks_problem("flexlora", [2, 4], 4) is None
    problem = ranks_problem("hetlora", [2, 8], 4)
    assert problem is not None and "hetlora.ranks" in problem and "lora.r = 4" in problem
    with pytest.raises(ValueError, match=r"flexlora\.ranks must be a non-empty list"):
        FlexLoRAConfig(ranks=[])
    with pytest.raises(ValueError, match=r"hetlora\.ranks must be a non-empty list"):
        HetLoRAConfig(ranks=[2, 0])


def test_a_reply_at_a_rank_the_client_was_not_given_is_rejected_naming_the_key() -> None:
    sent = truncate(lora([[1, 2], [3, 4]], [[1, 0], [0, 1]]), 1)
    spec = rank_spec({"adapter/" + k: v for k, v in sent.items()}, REPLY_SCALARS, None, {"c1": 10})
    stats = {"num_examples": 10, "trained_examples": 4, "train_loss": 1.0, "tokens": 40}
    at_rank_2 = {"adapter/" + k: v for k, v in zero_pad(sent, 2).items()}
    with pytest.raises(
        ReplyRejected, match=r"'adapter/m\.q\.lora_A\.weight' has shape \(2, 2\), expected \(1, 2\)"
    ):
        validate_reply({**at_rank_2, **stats}, spec, "c1")
    at_rank_1 = {"adapter/" + k: v for k, v in sent.items()}
    assert validate_reply({**at_rank_1, **stats}, spec, "c1")


# ----- FlexLoRA: product mean and SVD redistribution ------------------------------------------------
def test_product_mean_is_the_data_weighted_mean_of_the_dense_products() -> None:
    rng = np.random.default_rng(0)
    adapters = [random_lora(rng, 2), random_lora(rng, 4), random_lora(rng, 3)]
    weights = [10, 30, 60]
    dense = sum(w / 100 * (ad[B] @ ad[A]) for w, ad in zip(weights, adapters, strict=True))
    np.testing.assert_allclose(product_mean(adapters, weights)["m.q"], dense, rtol=1e-12)


def test_svd_factors_at_rank_r_are_the_best_rank_r_approximation() -> None:
    rng = np.random.default_rng(1)
    adapters = [random_lora(rng, 2), random_lora(rng, 4)]
    mean = product_mean(adapters, [1, 3])
    dense = mean["m.q"]
    singular = np.linalg.svd(dense, compute_uv=False)
    for rank in (1, 2, 3):
        factors = svd_factors(mean, [A, B], rank, np.dtype(np.float64))
        assert factors[A].shape == (rank, 6) and factors[B].shape == (5, rank)
        # Eckart-Young: the error of the best rank-r approximation is the norm of the dropped singular values.
        error = np.linalg.norm(dense - factors[B] @ factors[A])
        assert error == pytest.approx(np.sqrt(np.sum(singular[rank:] ** 2)), rel=1e-10)
        # One SVD serves every rank: the first r' ranks of the rank-r factors are the rank-r' factors.
        np.testing.assert_allclose(
            truncate(factors, 1)[B], svd_factors(mean, [A, B], 1, np.dtype(np.float64))[B]
        )


def test_svd_factors_at_full_rank_recover_the_mean_exactly_and_pad_beyond_it() -> None:
    rng = np.random.default_rng(2)
    adapters = [random_lora(rng, 1), random_lora(rng, 2)]  # the mean has rank 3
    mean = product_mean(adapters, [2, 1])
    factors = svd_factors(mean, [A, B], 5, np.dtype(np.float64))
    np.testing.assert_allclose(factors[B] @ factors[A], mean["m.q"], atol=1e-12)
    np.testing.assert_allclose(factors[B][:, 3:], 0.0, atol=1e-12)  # the mean's rank is 3: B's rest is zero
    np.testing.assert_array_equal(factors[A][5:], 0.0)  # beyond min(d_out, d_in) = 5 both factors are zero
    assert svd_factors(mean, [A, B], 2)[A].dtype == np.float32


# ----- HetLoRA: tail, pruning rule, sparsity weights ------------------------------------------------
def test_tail_start_keeps_floor_gamma_r_and_never_below_min_rank() -> None:
    assert tail_start(4, 0.75, 1) == 3
    assert tail_start(2, 0.75, 1) == 1
    assert tail_start(8, 0.5, 1) == 4
    assert tail_start(1, 0.75, 1) == 1  # rank 1 at min_rank 1: no tail
    assert tail_start(4, 0.25, 2) == 2


def test_tail_norm_by_hand_and_its_torch_penalty_agree() -> None:
    adapter = lora([[1, 0], [0, 2], [3, 0]], [[1, 0, 1], [0, 1, 0]])
    # tail ranks 1..2: B[:, 1:] A[1:] = [[0, 1], [1, 0]] @ [[0, 2], [3, 0]] = [[3, 0], [0, 2]]: norm sqrt(13)
    assert tail_norm(adapter, 1, 3) == pytest.approx(np.sqrt(13))
    assert tail_norm(adapter, 3, 3) == 0.0
    pairs = [(torch.tensor(adapter[A], requires_grad=True), torch.tensor(adapter[B], requires_grad=True))]
    penalty = tail_penalty(pairs, 1, 3)
    assert float(penalty.detach()) == pytest.approx(np.sqrt(13))
    penalty.backward()
    assert torch.all(pairs[0][0].grad[0] == 0)  # rank 0 is not in the tail: no gradient


def test_the_tail_penalty_has_a_zero_gradient_at_a_zero_tail() -> None:
    a = torch.ones(2, 3, requires_grad=True)
    b = torch.zeros(4, 2, requires_grad=True)  # LoRA's initial B
    tail_penalty([(a, b)], 1, 2).backward()
    assert torch.all(torch.isfinite(b.grad)) and float(b.grad.abs().sum()) == 0.0  # type: ignore[union-attr]


def test_pruning_needs_a_previous_round_and_a_smaller_tail() -> None:
    assert not prunes(None, 0.1)
    assert prunes(0.5, 0.4)
    assert not prunes(0.5, 0.5)
    assert not prunes(0.5, 0.6)


def test_sparsity_weights_by_hand() -> None:
    # Products: client 0 B A = [[3, 0], [0, 4]] (norm 5); client 1 at rank 2 [[1, 0], [0, 0]] + 0 (norm 1).
    first = lora([[3, 0], [0, 4]], [[1, 0], [0, 1]])
    second = lora([[1, 0], [0, 0]], [[1, 0], [0, 0]])
    weights = sparsity_weights([first, second])
    np.testing.assert_allclose(weights["m.q"], [5 / 6, 1 / 6])
    zero = lora([[1, 0]], [[0], [0]])
    np.testing.assert_allclose(sparsity_weights([zero, zero])["m.q"], [0.5, 0.5])  # nothing to tell apart


def test_sparsity_weighted_mean_zero_pads_then_weighs_by_hand() -> None:
    low = lora([[2, 0]], [[1], [0]])  # rank 1, product [[2, 0], [0, 0]]: norm 2
    high = lora([[0, 1], [1, 0]], [[0, 0], [0, 2]])  # rank 2, product [[0, 0], [2, 0]]: norm 2
    mean = sparsity_weighted_mean([low, high], 2)  # p = [1/2, 1/2]
    np.testing.assert_allclose(mean[A], [[1, 0.5], [0.5, 0]])
    np.testing.assert_allclose(mean[B], [[0.5, 0], [0, 1]])
    assert mean[A].dtype == np.float32
