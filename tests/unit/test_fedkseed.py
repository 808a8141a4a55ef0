"""FedKSeed's maths and replica on fixed arrays and tiny torch modules."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedtune.algorithms.fedkseed.maths import (
    accumulate_per_seed,
    add_direction,
    candidate_seeds,
    foreign_seed,
    history_is_cheaper,
    projected_gradient,
    replay,
    replay_round,
    seed_probabilities,
)
from fedtune.algorithms.fedkseed.replica import ReplicaGap, SeedReplica
from fedtune.algorithms.fedkseed.server import reply_spec
from fedtune.fl.validation import ReplyRejected, validate_reply

SEEDS = np.array([11, 23, 37, 41], dtype=np.int64)
HISTORY = np.array([[0.5, 0.0, -1.25, 2.0], [0.0, 3.0, 0.75, -0.5], [1.5, -2.0, 0.0, 0.25]])
LR = 1e-2


def tiny_module(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(5, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))


def replica_of(module: torch.nn.Module) -> SeedReplica:
    return SeedReplica(dict(module.named_parameters()), SEEDS, LR)


def same_bits(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))


def direction(shape: tuple[int, ...], seed: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    z = torch.zeros(shape, dtype=dtype)
    add_direction([z], seed, 1.0)
    return z


def test_the_direction_is_regenerated_from_its_seed_alone() -> None:
    assert torch.equal(direction((3, 4), 7), direction((3, 4), 7))
    assert not torch.equal(direction((3, 4), 7), direction((3, 4), 8))


def test_replaying_the_history_reproduces_the_servers_model_bitwise() -> None:
    # Prepare: the server's model moved round by round
    server = tiny_module()
    for row in HISTORY:
        replay_round(list(server.parameters()), SEEDS, row, LR)

    # Execute: a fresh copy of the initial weights replays the whole history at once
    fresh = tiny_module()
    replay(list(fresh.parameters()), SEEDS, HISTORY, LR)

    # Assert
    assert same_bits(fresh, server) and not same_bits(fresh, tiny_module())


def test_a_late_joining_client_catches_up_to_the_same_weights() -> None:
    # Prepare: one process followed every round; another joins after three
    early, late = tiny_module(), tiny_module()
    early_replica, late_replica = replica_of(early), replica_of(late)
    for version, row in enumerate(HISTORY):
        early_replica.catch_up(version, row[None, :])

    # Execute
    late_replica.catch_up(0, HISTORY)

    # Assert: the same bits and version; a history that starts past the held version is refused
    assert same_bits(early, late) and late_replica.version == early_replica.version == 3
    with pytest.raises(ReplicaGap, match="version 0"):
        replica_of(tiny_module()).catch_up(2, HISTORY[2:])


def test_history_rows_the_replica_already_holds_are_not_applied_twice() -> None:
    once, twice = tiny_module(), tiny_module()
    replica_of(once).catch_up(0, HISTORY)
    replica = replica_of(twice)
    replica.catch_up(0, HISTORY[:2])
    replica.catch_up(0, HISTORY)
    assert same_bits(once, twice)


def local_round(replica: SeedReplica, restore: str) -> None:
    with replica.local_steps(restore) as taken:
        for seed in SEEDS.tolist():
            add_direction(replica.tensors, seed, 0.3)
            taken.append((seed, 0.3))


def test_local_steps_put_the_versions_weights_back_bitwise_from_the_copy() -> None:
    module, reference = tiny_module(), tiny_module()
    local_round(replica_of(module), "copy")
    assert same_bits(module, reference)


def test_undoing_the_local_steps_puts_the_weights_back_up_to_rounding() -> None:
    module, reference = tiny_module(), tiny_module()
    local_round(replica_of(module), "undo")
    for x, y in zip(module.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(x, y, rtol=0, atol=1e-6)
    assert not same_bits(module, reference)  # why ``copy`` is the default


def test_the_scalar_estimate_on_a_quadratic_is_the_directional_derivative() -> None:
    # Prepare: L(w) = 1/2 w^T A w + b^T w, whose central difference is exact: z^T (A w + b)
    rng = np.random.default_rng(0)
    a_half = torch.tensor(rng.normal(size=(6, 6)))
    a = a_half @ a_half.T
    b = torch.tensor(rng.normal(size=6))
    w = torch.tensor(rng.normal(size=6))

    def loss() -> float:
        return float(0.5 * w @ a @ w + b @ w)

    # Execute: perturb in place by +eps z, -2 eps z, then back
    eps, seed = 1e-3, 5
    add_direction([w], seed, eps)
    plus = loss()
    add_direction([w], seed, -2 * eps)
    minus = loss()
    add_direction([w], seed, eps)
    estimate = projected_gradient(plus, minus, eps)

    # Assert
    z = direction((6,), seed)
    assert estimate == pytest.approx(float(z @ (a @ w + b)), rel=1e-7)


def test_per_seed_sums_and_one_clients_trajectory_is_its_replay() -> None:
    # Per-seed sums: a seed drawn twice sums, one never drawn is 0
    sums = accumulate_per_seed([2, 0, 2], [1.0, -0.5, 0.25], 4)
    np.testing.assert_array_equal(sums, [-0.5, 0.0, 1.25, 0.0])

    # The steps are additive in z: a client's local trajectory equals the replay of its sums (up to
    # rounding, the order of additions differs)
    stepped, replayed = tiny_module(), tiny_module()
    for index, scalar in [(2, 1.0), (0, -0.5), (2, 0.25)]:
        add_direction(list(stepped.parameters()), int(SEEDS[index]), -LR * scalar)
    replay_round(list(replayed.parameters()), SEEDS, sums, LR)
    for x, y in zip(stepped.parameters(), replayed.parameters(), strict=True):
        torch.testing.assert_close(x, y, rtol=0, atol=1e-6)


def test_candidate_seeds_are_distinct_and_pinned() -> None:
    seeds = candidate_seeds(0, 8)
    assert seeds.dtype == np.int64 and len(set(seeds.tolist())) == 8 and np.all(seeds >= 1)
    assert seeds.tolist() == [
        23017092,
        79358712,
        1195884381,
        1200317496,
        1219830272,
        1456163038,
        1557060588,
        1741175772,
    ]
    assert not np.array_equal(seeds, candidate_seeds(1, 8))


def test_golden_seed_replay_on_a_fixed_vector() -> None:
    # Pinned: z(seed) is torch's CPU normal stream; a change of generator or order moves these bits
    w = torch.zeros(4, dtype=torch.float64)
    replay([w], SEEDS, HISTORY, LR)
    expected = [-0.02255137059898707, -0.027101948586870633, 0.020407946333337795, 0.024541578521714496]
    np.testing.assert_array_equal(w.numpy(), expected)


def test_seed_probabilities_follow_the_importance() -> None:
    np.testing.assert_array_equal(seed_probabilities(np.zeros((0, 4)), 1.0), np.full(4, 0.25))
    np.testing.assert_array_equal(seed_probabilities(np.ones((2, 4)), 1.0), np.full(4, 0.25))
    probabilities = seed_probabilities(HISTORY, 2.0)
    importance = np.abs(HISTORY).mean(axis=0)
    assert probabilities.sum() == pytest.approx(1.0)
    assert np.argmax(probabilities) == np.argmax(importance)
    assert np.argmin(probabilities) == np.argmin(importance)
    # softmax of alpha times the importance normalised to [0, 1]: the extremes differ by e^alpha
    assert probabilities.max() / probabilities.min() == pytest.approx(np.exp(2.0))


def test_history_is_sent_while_it_costs_no_more_than_the_model() -> None:
    assert history_is_cheaper(rows=2, k=8, model_bytes=128)
    assert not history_is_cheaper(rows=3, k=8, model_bytes=128)


def good_reply() -> dict[str, object]:
    return {
        "seeds": SEEDS.copy(),
        "scalars": np.array([0.5, -1.0, 0.0, 2.0]),
        "num_examples": 10,
        "trained_examples": 12,
        "train_loss": 2.5,
        "tokens": 100,
    }


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"scalars": np.array([0.5, -1.0, 0.0])}, "'scalars' has shape (3,), expected (4,)"),
        ({"scalars": np.array([0.5, np.nan, 0.0, 1.0])}, "'scalars' contains NaN or Inf"),
        ({"scalars": np.array([0.5, np.inf, 0.0, 1.0])}, "'scalars' contains NaN or Inf"),
        ({"scalars": np.array([1, 2, 3, 4], dtype=np.int64)}, "'scalars' has dtype int64"),
        ({"seeds": np.array([11, 23, 37], dtype=np.int64)}, "'seeds' has shape (3,)"),
    ],
)
def test_a_reply_that_is_not_k_finite_scalars_is_rejected_naming_it(
    change: dict[str, object], reason: str
) -> None:
    spec = reply_spec(SEEDS, None, {})
    assert validate_reply(good_reply(), spec)["num_examples"] == 10
    with pytest.raises(ReplyRejected) as caught:
        validate_reply({**good_reply(), **change}, spec)
    assert reason in str(caught.value)


def test_a_seed_not_of_this_round_is_named() -> None:
    assert foreign_seed(SEEDS.copy(), SEEDS) is None
    assert foreign_seed(np.array([11, 23, 99, 41]), SEEDS) == (
        "seed 99 at position 2 is not a seed of this round (expected 37)"
    )
    assert foreign_seed(np.array([23, 11, 37, 41]), SEEDS) == (
        "seed 23 at position 0 is out of place (expected 11)"
    )


def test_a_scalar_vector_beyond_the_norm_bound_is_rejected() -> None:
    with pytest.raises(ReplyRejected, match=r"update norm 2\.291 exceeds fed\.norm_bound = 1"):
        validate_reply(good_reply(), reply_spec(SEEDS, 1.0, {}))


def test_the_seeds_are_ids_not_part_of_the_update_norm() -> None:
    spec = reply_spec(SEEDS, 2.5, {})
    foreign = {**good_reply(), "seeds": np.array([11, 23, 10**9, 41], dtype=np.int64)}
    assert validate_reply(foreign, spec)["seeds"][2] == 10**9  # left to foreign_seed, which names it


def test_a_replica_loaded_with_the_sent_model_goes_on_replaying_to_the_same_bits() -> None:
    # Prepare: the server's replica at version 2 (what it sends when the model is cheaper)
    server, client = tiny_module(), tiny_module(seed=1)
    server_replica = replica_of(server)
    server_replica.catch_up(0, HISTORY[:2])

    # Execute: another process takes the model of version 2, then replays round 3
    client_replica = replica_of(client)
    client_replica.load(server_replica.arrays(), version=2)
    client_replica.catch_up(2, HISTORY[2:])
    server_replica.catch_up(2, HISTORY[2:])

    # Assert
    assert same_bits(client, server) and client_replica.version == 3


def test_a_bf16_replica_sends_its_model_as_float32_arrays() -> None:
    # On a GPU, model.dtype auto loads the model in bf16, which numpy has no type for
    module = tiny_module().to(torch.bfloat16)
    arrays = replica_of(module).arrays()
    for (name, param), array in zip(module.named_parameters(), arrays.values(), strict=True):
        assert array.dtype == np.float32, name
        assert np.array_equal(array, param.detach().float().numpy()), name
    # and a replica of the same model takes them back bit for bit
    other = tiny_module(seed=1).to(torch.bfloat16)
    replica_of(other).load(arrays, version=3)
    assert same_bits(module, other)
