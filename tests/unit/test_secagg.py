"""SecAgg+ on synthetic updates, in-process: the secure sum is the plain sum up to quantisation, drops
after the key exchange are recovered, too few survivors fail with the reason, and what reaches the
server holds no client's update."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedtune.config import ConfigError, apply_overrides, validate_config
from fedtune.fl import secagg
from fedtune.fl.payload import REPLY_TO, Payload
from fedtune.fl.simulation import InProcessFederation

SIZE = 3000
SETTINGS = secagg.SecAggSettings(threshold=0.6, bits=20, clip_range=0.1, neighbours=5)


class Round:
    """Eight clients holding synthetic updates, every message on the wire recorded."""

    def __init__(self, workdir: Path, clients: int = 8) -> None:
        self.clients = [f"c{i:02d}" for i in range(clients)]
        self.seen: list[tuple[str, str, str, Payload]] = []
        self.fed = InProcessFederation(
            validate_config({}),
            secagg.client_tasks(),
            {c: [] for c in self.clients},
            None,  # type: ignore[arg-type]  # the protocol's tasks load no model
            workdir,
            tap=self.record,
        )
        rng = np.random.default_rng(7)
        self.updates = {c: rng.normal(0, 0.02, SIZE).astype(np.float32) for c in self.clients}
        self.weights = {c: int(rng.integers(3, 30)) for c in self.clients}

    def record(self, direction: str, client: str, task: str, rnd: int, payload: Payload) -> None:
        self.seen.append((direction, client, task, payload))

    def run(self, rnd: int = 1, settings: secagg.SecAggSettings = SETTINGS) -> secagg.SecureSum:
        self.fed.begin_round(rnd)
        for client in self.clients:
            self.fed.states[client][secagg.UPDATE] = {
                "round": rnd,
                "keys": ["w"],
                "update": self.updates[client],
                "weight": self.weights[client],
            }
        return secagg.secure_sum(self.fed, self.clients, SIZE, self.weights, rnd, settings)

    def plain(self, clients: list[str]) -> np.ndarray:
        scale = max(self.weights[c] for c in self.clients)
        return sum(self.updates[c].astype(np.float64) * self.weights[c] / scale for c in clients)  # type: ignore[return-value]


@pytest.fixture
def round_(tmp_path: Path) -> Iterator[Round]:
    yield Round(tmp_path)


def drop_in(stage: str, *clients: str) -> Any:
    def hook(client: str, task: str, rnd: int) -> None:
        if task == stage and client in clients:
            raise RuntimeError("connection lost")

    return hook


def test_the_secure_sum_is_the_plain_weighted_sum_within_quantisation(round_: Round) -> None:
    result = round_.run()
    assert result.survivors == round_.clients and result.dropped == []
    step = secagg.quantization_step(SETTINGS.clip_range, SETTINGS.bits)
    error = np.abs(result.total - round_.plain(round_.clients))
    # Each client's stochastic rounding errs by less than one step per coordinate.
    assert error.max() < len(round_.clients) * step
    assert error.mean() < 2 * step
    scale = max(round_.weights.values())
    assert result.weight == pytest.approx(sum(w / scale for w in round_.weights.values()))


@pytest.mark.parametrize("stage", ["secagg_share", "secagg_mask"])
def test_a_client_dropping_after_the_key_exchange_is_recovered(round_: Round, stage: str) -> None:
    # Prepare: two clients vanish after advertising their keys (before or after sharing them).
    round_.fed.before_task = drop_in(stage, "c02", "c05")

    # Execute
    result = round_.run()

    # Assert: the weighted mean of the six others, as if the two had never taken part
    assert result.survivors == [c for c in round_.clients if c not in ("c02", "c05")]
    assert set(round_.fed.traffic.failed) == {"c02", "c05"}
    weights = np.array([round_.weights[c] for c in result.survivors], dtype=np.float64)
    mean = sum(
        w * round_.updates[c].astype(np.float64) for w, c in zip(weights, result.survivors, strict=True)
    )
    step = secagg.quantization_step(SETTINGS.clip_range, SETTINGS.bits)
    assert np.abs(result.total / result.weight - mean / weights.sum()).max() < 6 * step


def test_a_dropped_clients_secrets_leave_the_servers_memory_when_the_round_ends(round_: Round) -> None:
    # Prepare: c02 drops after sharing its keys, so it never clears its protocol state itself.
    round_.fed.before_task = drop_in("secagg_mask", "c02")
    round_.run()
    assert secagg.STATE in round_.fed.states["c02"]

    # Execute: what a checkpoint of the round would hold, then the next round's start
    saved = round_.fed.state_dict()["clients"]["c02"]
    round_.fed.begin_round(2)

    # Assert: neither the checkpoint nor the process keeps its keys, seed or update
    assert saved == {}
    assert round_.fed.states["c02"] == {}


def test_a_supernode_writes_no_round_secret_to_its_disk(tmp_path: Path) -> None:
    # Prepare: a Flower node runtime running the key stage on a client that holds an update.
    from fedtune.flower.node import NodeRuntime, execute, load_state

    runtime = NodeRuntime(validate_config({}), "c00", [], None, tmp_path, secagg.client_tasks())
    held = {"round": 1, "keys": ["w"], "update": np.ones(3, np.float32), "weight": 1}

    # Execute
    outcome = execute(runtime, "secagg_keys", 1, {"round": 1}, {secagg.UPDATE: held, "kept": {"x": 1}})

    # Assert: the keys go back to the SuperNode's memory for the next stage, never to the client's disk;
    # a later round's task forgets them
    assert outcome.error is None and outcome.state is not None
    assert secagg.STATE in outcome.state and secagg.UPDATE in outcome.state
    assert load_state(tmp_path, 2) == {"kept": {"x": 1}}
    later = execute(runtime, "secagg_keys", 2, {"round": 2}, dict(outcome.state))
    assert later.error is not None and "no update of this round" in later.error


def test_a_survivor_silent_at_unmasking_is_covered_by_the_other_shares(round_: Round) -> None:
    round_.fed.before_task = drop_in("secagg_unmask", "c03")
    result = round_.run()
    step = secagg.quantization_step(SETTINGS.clip_range, SETTINGS.bits)
    assert np.abs(result.total - round_.plain(round_.clients)).max() < 8 * step


def test_below_the_threshold_the_round_fails_with_the_reason(round_: Round) -> None:
    round_.fed.before_task = drop_in("secagg_mask", "c01", "c02", "c03", "c04")
    with pytest.raises(secagg.SecAggFailed) as failure:
        round_.run()
    message = str(failure.value)
    assert "masked upload" in message and "4 of the round's 8 clients" in message
    assert "secagg.threshold 0.6 needs 5" in message


def test_a_mask_that_too_few_neighbours_can_rebuild_fails_the_round(round_: Round) -> None:
    # c00's neighbourhood holds 5 clients: with 3 of them silent at unmasking, 2 shares < threshold 3.
    result = round_.run(rnd=1)
    graph = secagg.neighbourhoods(
        result.survivors, 5, np.random.default_rng([SETTINGS.seed, 2, 0x5EC])
    )  # the graph round 2 will draw
    others = [c for c in graph["c00"] if c != "c00"][:3]
    round_.fed.before_task = drop_in("secagg_unmask", *others)
    with pytest.raises(secagg.SecAggFailed, match="neighbours returned a share"):
        round_.run(rnd=2)


def test_the_server_sees_no_single_update(round_: Round) -> None:
    # Execute
    round_.run()
    held = {}  # each client's seed and key shares, as its neighbours held them in clear before unmasking

    # Assert: every upload is a masked uint32 vector, keys, ciphertexts or shares: no float array, no
    # vector correlated with the client's own quantised update, no plaintext share inside a ciphertext.
    uploads = [
        (client, task, payload) for direction, client, task, payload in round_.seen if direction == "up"
    ]
    assert {task for _, task, _ in uploads} == set(secagg.TASKS)
    rng = np.random.default_rng(0)
    for client, task, payload in uploads:
        assert str(payload[REPLY_TO]).startswith(f"{task}@1#")  # the tag of the message it answers
        for key, value in payload.items():
            if key != REPLY_TO:
                assert isinstance(value, np.ndarray) and value.dtype in (np.uint8, np.uint32), (task, key)
        if task == "secagg_mask":
            masked = payload["masked"]
            assert isinstance(masked, np.ndarray)
            quantised = secagg.quantize(round_.updates[client], SETTINGS.clip_range, SETTINGS.bits, rng)
            correlation = np.corrcoef(masked.astype(np.float64), quantised.astype(np.float64))[0, 1]
            assert abs(correlation) < 5 / np.sqrt(SIZE)  # 5 standard errors
            assert not np.array_equal(masked, quantised)
            # Masked words spread over the whole modulus, far beyond the 20-bit quantised values.
            assert masked.max() > 1 << 30
        if task == "secagg_unmask":
            held.update({k: bytes(v.tobytes()) for k, v in payload.items() if isinstance(v, np.ndarray)})
    shares = list(held.values())
    assert shares, "the unmasking stage returned shares"
    for _, task, payload in uploads:
        if task == "secagg_share":
            for key, value in payload.items():
                if key == REPLY_TO:
                    continue
                assert isinstance(value, np.ndarray)
                assert not any(share[4:20] in value.tobytes() for share in shares)


def test_the_neighbourhoods_are_symmetric_and_of_the_asked_size() -> None:
    clients = [f"c{i:03d}" for i in range(40)]
    graph = secagg.neighbourhoods(clients, secagg.neighbourhood_size(40, None), np.random.default_rng(1))
    assert secagg.neighbourhood_size(40, None) == 13  # 2 ceil(log2 40) + 1
    assert all(len(members) == 13 and client in members for client, members in graph.items())
    assert all(client in graph[other] for client, members in graph.items() for other in members)
    assert secagg.neighbourhood_size(4, 6) == 4


def test_quantisation_is_unbiased_and_its_sum_dequantises() -> None:
    values = np.full(200_000, 0.0123)
    rng = np.random.default_rng(3)
    quantised = secagg.quantize(values, 0.1, 8, rng)
    restored = secagg.dequantize_sum(quantised.astype(np.uint32), 1, 0.1, 8)
    assert restored.mean() == pytest.approx(0.0123, abs=1e-5)
    assert np.abs(restored - 0.0123).max() <= secagg.quantization_step(0.1, 8)


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (("algorithm=fedmkt",), "logits"),
        (("fed.aggregator=median",), r"fed\.aggregator"),
        (("fed.screen=5",), r"fed\.screen"),
        (("data.partition.num_clients=5000", "secagg.bits=20"), r"secagg\.bits <= 19"),
        (("secagg.threshold=0.5",), r"secagg\.threshold"),
        (("fed.clients_per_round=1",), r"fed\.clients_per_round = 1.*at least 2"),
        (("data.partition.num_clients=10", "fed.fraction=0.1"), r"fed\.fraction.*at least 2"),
    ],
)
def test_what_secure_aggregation_cannot_run_with_is_a_config_error(
    overrides: tuple[str, ...], key: str
) -> None:
    with pytest.raises(ConfigError, match=key):
        validate_config(apply_overrides({}, ["secagg.enabled=true", *overrides]))


def test_the_default_screen_is_off_under_secure_aggregation() -> None:
    assert validate_config(apply_overrides({}, ["secagg.enabled=true"])).fed.screen is None


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ("dp.noise_multiplier=1.0", "dp.clip_norm=0.5"),
            r"dp\.noise_multiplier, dp\.clip_norm are set but dp\.enabled is false.*not be private",
        ),
        (("dp.sampling=fixed",), r"dp\.sampling is set but dp\.enabled is false"),
        (("secagg.bits=16",), r"secagg\.bits is set but secagg\.enabled is false.*every update"),
    ],
)
def test_privacy_settings_of_a_section_left_off_are_refused_not_ignored(
    overrides: tuple[str, ...], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        validate_config(apply_overrides({}, list(overrides)))
    enabled = [f"{o.split('.')[0]}.enabled=true" for o in overrides[:1]]
    if enabled == ["dp.enabled=true"] and "dp.clip_norm=0.5" not in overrides:
        overrides = (*overrides, "dp.clip_norm=0.5", "dp.noise_multiplier=1.0")
    validate_config(apply_overrides({}, [*enabled, *overrides]))  # on, they are taken


def test_a_trim_without_the_trimmed_mean_is_refused_not_ignored() -> None:
    with pytest.raises(ConfigError, match=r"fed\.trim 0\.3 is set but fed\.aggregator is 'mean'"):
        validate_config(apply_overrides({}, ["fed.trim=0.3"]))
    assert (
        validate_config(apply_overrides({}, ["fed.aggregator=trimmed_mean", "fed.trim=0.3"])).fed.trim == 0.3
    )
