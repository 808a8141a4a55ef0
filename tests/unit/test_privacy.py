"""Client-level DP: clipping, noise, secret sampling, the accountant against published figures, config."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedtune.config import ConfigError, ExperimentConfig, apply_overrides, validate_config
from fedtune.fl.clipping import clip_l2, update_delta
from fedtune.fl.privacy import (
    ClientLevelDP,
    PrivacyError,
    PrivacyLedger,
    RoundMechanism,
    calibrate_noise,
    composed,
    epsilon_after,
    poisson_sample,
    population_warnings,
    private_mean_step,
)

DP = ("dp.enabled=true", "dp.noise_multiplier=1.0", "dp.clip_norm=0.5")


def dp_config(*overrides: str) -> ExperimentConfig:
    """The default config with DP on, plus ``key=value`` overrides."""
    return validate_config(apply_overrides({}, [*DP, *overrides]))


# ----- clipping and noise ---------------------------------------------------------------------------
def test_clipping_scales_a_long_update_to_the_bound_over_all_keys_and_keeps_a_short_one() -> None:
    reference = {"a": np.ones((2, 2), np.float32), "b": np.zeros(3, np.float32)}
    # Delta = (3, 0, 0, 0 | 4, 0, 0): flat norm 5 across both keys.
    state = {"a": np.array([[4, 1], [1, 1]], np.float32), "b": np.array([4, 0, 0], np.float32)}
    clipped, norm = clip_l2(update_delta(state, reference), bound=1.0)
    assert norm == pytest.approx(5.0)
    np.testing.assert_allclose(clipped["a"], [[0.6, 0], [0, 0]])
    np.testing.assert_allclose(clipped["b"], [0.8, 0, 0])
    small, norm = clip_l2(update_delta(state, reference), bound=10.0)
    assert norm == pytest.approx(5.0)
    np.testing.assert_allclose(small["a"], [[3, 0], [0, 0]])
    with pytest.raises(PrivacyError, match="lacks b"):
        private_mean_step(
            reference,
            [{"a": state["a"]}],
            clip_norm=1.0,
            noise_multiplier=1.0,
            expected_count=1.0,
            rng=np.random.default_rng(0),
        )


def test_the_noise_on_the_sum_has_standard_deviation_z_times_c() -> None:
    # Prepare: no client (the sum is 0), so the step is exactly noise / expected_count.
    reference = {"w": np.zeros(200_000, np.float64)}
    z, clip, count = 1.3, 0.4, 5.0
    draws = []
    for seed in range(5):
        moved, _ = private_mean_step(
            reference,
            [],
            clip_norm=clip,
            noise_multiplier=z,
            expected_count=count,
            rng=np.random.default_rng(seed),
        )
        draws.append(moved["w"] * count)
    noise = np.concatenate(draws)
    # 1e6 draws: the sample std is within 0.5% of z C, the mean within 5 standard errors of 0.
    assert noise.std() == pytest.approx(z * clip, rel=5e-3)
    assert abs(noise.mean()) < 5 * z * clip / math.sqrt(noise.size)


def test_the_step_is_the_clipped_sum_over_the_expected_count_on_average() -> None:
    reference = {"w": np.full(4, 1.0, np.float32)}
    states = [
        {"w": np.array([1, 1, 1, 11], np.float32)},  # Delta norm 10: clipped to (0, 0, 0, 2)
        {"w": np.array([2, 1, 1, 1], np.float32)},  # Delta norm 1: kept
        {"w": np.array([1, 1, 1, 1], np.float32)},  # no update
    ]
    steps = []
    for seed in range(2000):
        moved, norms = private_mean_step(
            reference,
            states,
            clip_norm=2.0,
            noise_multiplier=0.5,
            expected_count=4.0,
            rng=np.random.default_rng(seed),
        )
        steps.append(moved["w"].astype(np.float64) - 1.0)
        assert moved["w"].dtype == np.float32
    assert norms == pytest.approx([10.0, 1.0, 0.0])
    # (0 + 1 + 0, 0, 0, 2 + 0 + 0) / 4, up to the noise's standard error 0.5 * 2 / 4 / sqrt(2000).
    np.testing.assert_allclose(np.mean(steps, axis=0), [0.25, 0, 0, 0.5], atol=5 * 0.25 / math.sqrt(2000))


def test_poisson_sampling_includes_each_client_with_probability_q() -> None:
    clients = [f"c{i:02d}" for i in range(50)]
    counts = [len(poisson_sample(clients, 0.2, np.random.default_rng(r))) for r in range(400)]
    # 20000 Bernoulli(0.2) draws: mean count 10, within 4 standard errors.
    assert np.mean(counts) == pytest.approx(10.0, abs=4 * math.sqrt(50 * 0.2 * 0.8 / 400))
    assert min(counts) < 10 < max(counts), "the sample size varies from round to round"


def test_the_secret_decides_the_sample_and_the_noise_and_survives_a_checkpoint() -> None:
    cfg = dp_config("fed.fraction=0.5", "data.partition.num_clients=20")
    clients = [f"c{i:02d}" for i in range(20)]
    first = ClientLevelDP(cfg.dp, cfg.fed)
    first.start(clients, 10)
    restored = ClientLevelDP(cfg.dp, cfg.fed)
    restored.load_state_dict(first.state_dict())
    restored.start(clients, 10)
    other = ClientLevelDP(cfg.dp, cfg.fed)
    other.start(clients, 10)
    samples = [[dp.sample(clients, rnd) for rnd in range(1, 6)] for dp in (first, restored, other)]
    assert samples[0] == samples[1]
    assert samples[0] != samples[2], "a fresh secret samples differently (2^-100 odds of a tie)"
    reference = {"w": np.zeros(8, np.float32)}
    released = []
    for dp in (first, restored):
        dp.sample(clients, 3)
        released.append(dp.aggregate(reference, []))
    np.testing.assert_array_equal(released[0]["w"], released[1]["w"])
    assert np.any(released[0]["w"] != 0)


def test_aggregating_without_a_secret_sample_is_refused() -> None:
    cfg = dp_config()
    dp = ClientLevelDP(cfg.dp, cfg.fed)
    dp.start(["a", "b"], 2)
    with pytest.raises(PrivacyError, match="sample_clients"):
        dp.aggregate({"w": np.zeros(2, np.float32)}, [])


# ----- accounting -----------------------------------------------------------------------------------
def classical_epsilon(orders: np.ndarray, rdp: np.ndarray, delta: float) -> float:
    """Mironov (2017), Prop. 3: epsilon = min over orders of rdp - log(delta) / (order - 1)."""
    return float(np.min(rdp - math.log(delta) / (orders - 1)))


@pytest.mark.parametrize(("noise", "epochs", "published"), [(1.12, 60, 2.92), (1.2, 10, 1.20)])
def test_the_accountant_reproduces_the_tensorflow_privacy_table(
    noise: float, epochs: int, published: float
) -> None:
    # TensorFlow Privacy, tutorials/README.md, "Select Parameters": DP-SGD on MNIST (60000 examples,
    # batches of 256 sampled with q = 256 / 60000, steps = epochs * 60000 // 256), delta = 1e-5; its RDP
    # accountant converted RDP to (epsilon, delta) with Mironov's Prop. 3 and reported these epsilons.
    release = RoundMechanism("poisson", 60_000, 256 / 60_000, 0, noise)
    accountant = composed([(release, epochs * 60_000 // 256)], "rdp")
    assert classical_epsilon(accountant.orders, accountant.rdp, 1e-5) == pytest.approx(published, abs=0.005)
    # What the run reports uses dp-accounting's tighter conversion (Canonne, Kamath, Steinke 2020).
    reported = epsilon_after([(release, epochs * 60_000 // 256)], 1e-5, "rdp")
    assert 0.75 * published < reported < published
    # The privacy-loss-distribution accountant bounds the same mechanism tighter still.
    assert epsilon_after([(release, epochs * 60_000 // 256)], 1e-5, "pld") < reported


def test_fixed_size_sampling_is_accounted_with_twice_the_sensitivity() -> None:
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

    fixed = RoundMechanism("fixed", 100, 0.1, 10, 2.0)
    direct = RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    direct.compose(
        dp_accounting.SampledWithoutReplacementDpEvent(100, 10, dp_accounting.GaussianDpEvent(1.0)), 20
    )
    assert epsilon_after([(fixed, 20)], 1e-5, "rdp") == pytest.approx(direct.get_epsilon(1e-5))
    poisson = RoundMechanism("poisson", 100, 0.1, 0, 2.0)
    assert epsilon_after([(fixed, 20)], 1e-5, "rdp") > epsilon_after([(poisson, 20)], 1e-5, "rdp")


@pytest.mark.parametrize("kind", ["pld", "rdp"])
def test_calibration_reaches_the_target_epsilon_from_below(kind: str) -> None:
    release = RoundMechanism("poisson", 1000, 0.05, 0, 0.0)
    noise = calibrate_noise(release, rounds=50, target_epsilon=4.0, delta=1e-5, kind=kind)
    reached = epsilon_after([(release.with_noise(noise), 50)], 1e-5, kind)
    assert 3.95 < reached <= 4.0


def test_pld_is_dp_accountings_own_and_tighter_than_rdp() -> None:
    # Prepare: q = 0.1, z = 1, 50 rounds, delta 1e-5; dp-accounting's PLD accountant at its default grid
    import dp_accounting
    from dp_accounting.pld import PLDAccountant

    release = RoundMechanism("poisson", 1000, 0.1, 0, 1.0)
    reference = PLDAccountant(neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
    reference.compose(release.event(), 50)

    # Execute
    pld, rdp = (epsilon_after([(release, 50)], 1e-5, kind) for kind in ("pld", "rdp"))

    # Assert: the coarser grid changes the fourth digit at most; PLD is 12% below RDP here
    assert pld == pytest.approx(reference.get_epsilon(1e-5), rel=1e-3)
    assert pld == pytest.approx(5.148, abs=0.01) and rdp == pytest.approx(5.885, abs=0.01)


def test_fixed_sampling_is_accounted_with_rdp_and_an_explicit_pld_is_refused() -> None:
    cfg = dp_config("dp.sampling=fixed", "fed.clients_per_round=2")
    dp = ClientLevelDP(cfg.dp, cfg.fed)
    dp.start(["a", "b", "c", "d"], 2)
    assert dp.row()["dp_accountant"] == "rdp"
    with pytest.raises(ConfigError, match=r"dp\.accountant pld does not cover dp\.sampling fixed"):
        dp_config("dp.sampling=fixed", "dp.accountant=pld")
    poisson = dp_config()
    assert ClientLevelDP(poisson.dp, poisson.fed).accountant == "pld"


def test_the_ledger_composes_runs_and_round_trips() -> None:
    release = RoundMechanism("poisson", 100, 0.1, 0, 1.1)
    ledger = PrivacyLedger()
    for _ in range(7):
        ledger.record(release)
    assert ledger.state_dict() == [
        {
            "sampling": "poisson",
            "population": 100,
            "rate": 0.1,
            "sample_size": 0,
            "noise_multiplier": 1.1,
            "count": 7,
        }
    ]
    again = PrivacyLedger()
    again.load_state_dict(ledger.state_dict())
    assert again.epsilon(1e-5) == ledger.epsilon(1e-5) == epsilon_after([(release, 7)], 1e-5)
    # (PLD composes 7 + 1 rounds by FFT where it composes 8 at once: equal to rounding)
    assert ledger.epsilon(1e-5, extra=release) == pytest.approx(epsilon_after([(release, 8)], 1e-5), rel=1e-9)


def test_max_epsilon_names_the_round_it_stops_before() -> None:
    cfg = dp_config("dp.max_epsilon=3", "fed.fraction=0.5")
    dp = ClientLevelDP(cfg.dp, cfg.fed)
    dp.start(["a", "b", "c", "d"], 2)
    rnd = 1
    while (reason := dp.stop_reason(rnd)) is None:
        dp.sample(["a", "b", "c", "d"], rnd)
        dp.aggregate({"w": np.zeros(1, np.float32)}, [])
        rnd += 1
    assert dp.epsilon() <= 3 < dp.ledger.epsilon(1e-5, extra=dp.mechanism)
    assert f"before round {rnd}" in reason and "dp.max_epsilon" in reason


def test_a_small_population_is_warned_about() -> None:
    few = population_warnings(RoundMechanism("poisson", 4, 1.0, 0, 1.0), 1e-5, 5.0)
    assert any("only 4 clients" in w for w in few)
    many = population_warnings(RoundMechanism("poisson", 10_000, 0.01, 0, 1.0), 1e-7, 2.0)
    assert many == []


# ----- config ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("algorithm", "why"),
    [("fedmkt", "logits"), ("perfit", "mask")],
)
def test_a_method_that_cannot_be_covered_refuses_dp_with_its_reason(algorithm: str, why: str) -> None:
    with pytest.raises(ConfigError, match=rf"algorithm '{algorithm}' cannot run with client-level") as err:
        dp_config(f"algorithm={algorithm}", "eval.personal=true")
    assert why in str(err.value)


def test_fedpft_refuses_dp_only_with_its_apoz_based_distillation() -> None:
    with pytest.raises(ConfigError, match=r"fedpft\.neuron_every"):
        dp_config("algorithm=fedpft")
    assert dp_config("algorithm=fedpft", "fedpft.neuron_every=0").dp.enabled


@pytest.mark.parametrize(
    ("setting", "key"),
    [
        ("fed.aggregator=median", "fed.aggregator"),
        ("fed.screen=5", "fed.screen"),
        ("fed.mode=standalone", "fed.mode"),
        ("dp.clip_norm=null", "dp.clip_norm"),
        ("dp.target_epsilon=4", "dp.target_epsilon"),
        ("dp.max_epsilon=0.5", "dp.max_epsilon"),
    ],
)
def test_what_dp_cannot_run_with_is_a_config_error(setting: str, key: str) -> None:
    overrides = [setting] if setting != "dp.max_epsilon=0.5" else [setting, "dp.target_epsilon=4"]
    if setting == "dp.max_epsilon=0.5":
        overrides.append("dp.noise_multiplier=null")
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        dp_config(*overrides)


def test_the_default_screen_is_off_under_dp_and_dp_is_off_by_default() -> None:
    assert validate_config({}).dp.enabled is False
    assert validate_config({}).fed.screen == 10.0
    assert dp_config().fed.screen is None


def test_exactly_the_methods_that_aggregate_client_tensors_declare_dp_support() -> None:
    from fedtune.algorithms.registry import algorithm_names, get_algorithm

    builtin = {"fedit", "fedavgm", "fedpt", "fedbiot", "fedpft", "fedmkt", "perfit"}
    supported = {n for n in algorithm_names() if n in builtin and get_algorithm(n).Config.dp_refused is None}
    assert supported == {"fedit", "fedavgm", "fedpt", "fedbiot", "fedpft"}
