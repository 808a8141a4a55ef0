"""Secure aggregation through whole runs: FedIT with SecAgg+ equals FedIT within quantisation, the
update never crosses the wire unmasked, a client lost after the key exchange is recovered, and DP noises
the unmasked sum."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedtune.algorithms.adapters import ADAPTER
from fedtune.algorithms.registry import algorithm_names, get_algorithm
from fedtune.fl import secagg
from fedtune.fl.checkpoint import latest_checkpoint, load_checkpoint
from fedtune.fl.payload import Payload, arrays
from fedtune.fl.simulation import TapHook
from tests.integration.helpers import ADAPTIVE_STEP_IS_THE_RELEASE, quiet_runner, tiny_config

ONE_ROUND = ("fed.rounds=1", "eval.before=false", "eval.metrics=[perplexity]", "eval.max_examples=4")

Wire = list[tuple[str, str, str, Payload]]


def recorder(seen: Wire) -> TapHook:
    def tap(direction: str, client: str, task: str, rnd: int, payload: Payload) -> None:
        seen.append((direction, client, task, payload))

    return tap


def adapter(run_dir: Path) -> dict[str, np.ndarray]:
    tree = load_checkpoint(latest_checkpoint(run_dir))  # type: ignore[arg-type]
    return {k: np.asarray(v) for k, v in tree["algorithm"]["global_adapter"].items()}


def test_secure_fedit_equals_fedit_and_no_update_crosses_the_wire_unmasked(tmp_path: Path) -> None:
    # Prepare: the same run with and without secure aggregation, every message recorded.
    plain_wire: Wire = []
    secure_wire: Wire = []
    plain_cfg = tiny_config("fedit", *ONE_ROUND)
    secure_cfg = tiny_config("fedit", *ONE_ROUND, "secagg.enabled=true")

    # Execute
    plain = quiet_runner(plain_cfg, tmp_path / "plain", tap=recorder(plain_wire)).run()
    secure = quiet_runner(secure_cfg, tmp_path / "secure", tap=recorder(secure_wire)).run()

    # Assert: the same model within the quantisation step, the same statistics, the overhead recorded
    step = secagg.quantization_step(1.0, secure_cfg.secagg.bits)
    for key, value in adapter(tmp_path / "plain").items():
        np.testing.assert_allclose(adapter(tmp_path / "secure")[key], value, rtol=0, atol=4 * step)
    assert secure[1]["train_loss"] == plain[1]["train_loss"]
    assert secure[1]["eval"]["perplexity"] == pytest.approx(plain[1]["eval"]["perplexity"], rel=1e-4)
    assert secure[1]["secagg_clients"] == 4 and secure[1]["secagg_bytes_up"] > 0
    assert secure[1]["bytes_up"] > plain[1]["bytes_up"]

    # Assert on the payloads: the fit replies carry no array; each masked upload is unrelated to the
    # update its client computed (taken from the plain run's fit reply, the same training).
    sent = {c: arrays(p, ADAPTER) for way, c, task, p in plain_wire if way == "down" and task == "fit"}
    trained = {c: arrays(p, ADAPTER) for way, c, task, p in plain_wire if way == "up" and task == "fit"}
    weights = {c: int(p["num_examples"]) for way, c, task, p in plain_wire if way == "up" and task == "fit"}
    uploads = [(c, task, p) for way, c, task, p in secure_wire if way == "up"]
    assert {task for _, task, _ in uploads} == {"fit", *secagg.TASKS}
    for client, task, payload in uploads:
        floats = [k for k, v in payload.items() if isinstance(v, np.ndarray) and v.dtype.kind == "f"]
        assert not floats, (task, floats)
        if task == "fit":
            assert not arrays(payload)
        if task == "secagg_mask":
            keys = sorted(trained[client])
            update = np.concatenate([(trained[client][k] - sent[client][k]).ravel() for k in keys])
            scaled = update * weights[client] / max(weights.values())
            quantised = secagg.quantize(scaled, 1.0, secure_cfg.secagg.bits, np.random.default_rng(0))
            masked = payload["masked"]
            assert isinstance(masked, np.ndarray) and masked.shape == quantised.shape
            # Uncorrelated: within 5 standard errors (1 / sqrt(n)) of zero.
            correlation = np.corrcoef(masked.astype(np.float64), quantised.astype(np.float64))[0, 1]
            assert abs(correlation) < 5 / np.sqrt(masked.size)
            assert not np.isin(quantised[:64], masked).all()


def test_a_client_lost_after_the_key_exchange_is_recovered_and_dp_noises_the_sum(tmp_path: Path) -> None:
    # Prepare: DP with every client sampled; c02 dies after advertising its keys, in round 1.
    settings = ("dp.enabled=true", "dp.noise_multiplier=1.0", "dp.clip_norm=1e-5", "secagg.enabled=true")
    cfg = tiny_config("fedit", *ONE_ROUND, "fed.keep_checkpoints=3", *settings)

    def lose(client: str, task: str, rnd: int) -> None:
        if client == "c02" and task == "secagg_mask":
            raise RuntimeError("connection lost")

    # Execute
    history = quiet_runner(cfg, tmp_path / "run", before_task=lose).run()

    # Assert: the round completed with the three others, one release accounted, the step noise-sized
    row = history[1]
    assert row["failed"] == {"c02": "RuntimeError: connection lost"}
    assert row["secagg_clients"] == 3 and row["secagg_dropped"] == 1
    assert row["dp_epsilon"] > 0
    before = load_checkpoint(tmp_path / "run" / "checkpoints" / "round_0000")["algorithm"]["global_adapter"]
    after = adapter(tmp_path / "run")
    size = sum(v.size for v in before.values())
    step = float(np.sqrt(sum(np.sum((after[k] - before[k]).astype(np.float64) ** 2) for k in before)))
    # (3 updates clipped to C on the clients + noise z C per coordinate) / q N = 4
    assert 0 < step < (3e-5 + 1.2e-5 * np.sqrt(size)) / 4


def test_too_few_survivors_fail_the_round_with_the_reason(tmp_path: Path) -> None:
    cfg = tiny_config("fedit", *ONE_ROUND, "secagg.enabled=true")

    def lose(client: str, task: str, rnd: int) -> None:
        if client in ("c01", "c02") and task == "secagg_mask":
            raise RuntimeError("connection lost")

    with pytest.raises(secagg.SecAggFailed, match=r"masked upload: 2 of the round's 4 clients"):
        quiet_runner(cfg, tmp_path / "run", before_task=lose).run()


SUPPORTED = [name for name in algorithm_names() if get_algorithm(name).Config.dp_refused is None]
STATE = {"fedpft": "global_state", "fedkseed": "released"}
SETTINGS = {
    "fedpt": ("fedpt.distill=false",),
    "fedpft": ("fedpft.neuron_every=0",),
    **ADAPTIVE_STEP_IS_THE_RELEASE,
}
"""FedPT's distillation on public data follows the aggregate; without it the adapter is the mean itself (as
the adaptive optimisers' is with ADAPTIVE_STEP_IS_THE_RELEASE)."""
SECURE = {"fedkseed": ("secagg.clip_range=4",)}
"""FedKSeed's per-seed scalar sums exceed the default range of 1; the quantisation error at range 4 stays
within the tolerance (step(4) / 2 = 2 step(1))."""


@pytest.mark.parametrize("algorithm", SUPPORTED)
def test_every_method_that_supports_it_aggregates_securely_as_it_does_plainly(
    algorithm: str, tmp_path: Path
) -> None:
    settings = (*ONE_ROUND, *SETTINGS.get(algorithm, ()))
    quiet_runner(tiny_config(algorithm, *settings), tmp_path / "plain").run()
    secure = quiet_runner(
        tiny_config(algorithm, *settings, *SECURE.get(algorithm, ()), "secagg.enabled=true"),
        tmp_path / "secure",
    ).run()
    assert secure[1]["secagg_clients"] == 4 and secure[1]["failed"] == {}
    key = STATE.get(algorithm, "global_adapter")
    states = [
        load_checkpoint(latest_checkpoint(tmp_path / name))["algorithm"][key]  # type: ignore[arg-type]
        for name in ("plain", "secure")
    ]
    step = secagg.quantization_step(1.0, 20)
    for name, value in states[0].items():
        np.testing.assert_allclose(states[1][name], value, rtol=0, atol=4 * step, err_msg=name)


def _secret_words(run_dir: Path) -> list[str]:
    """Where a client's SecAgg secrets or held update could sit in the server's checkpoints."""
    found = []
    for path in sorted((run_dir / "checkpoints").rglob("*")):
        if not path.is_file():
            continue
        data = path.read_bytes()
        found += [
            f"{path.name}: {word}" for word in (b"secret:", b"mask_private", b"share_private") if word in data
        ]
    return found


@pytest.mark.parametrize("stage", ["secagg_keys", "secagg_share", "secagg_mask", "secagg_unmask"])
def test_a_dropped_clients_secrets_and_update_never_reach_the_servers_checkpoints(
    stage: str, tmp_path: Path
) -> None:
    # Prepare: c02 drops at one stage of round 1; the run goes on to round 2.
    cfg = tiny_config("fedit", *ONE_ROUND, "fed.rounds=2", "fed.keep_checkpoints=3", "secagg.enabled=true")

    def lose(client: str, task: str, rnd: int) -> None:
        if client == "c02" and task == stage and rnd == 1:
            raise RuntimeError("connection lost")

    # Execute
    history = quiet_runner(cfg, tmp_path / "run", before_task=lose).run()

    # Assert: both rounds ran, and no checkpoint holds a client's protocol state or its held update
    assert [row["round"] for row in history] == [0, 1, 2]
    assert "c02" in history[1]["failed"]
    assert _secret_words(tmp_path / "run") == []
    for number in (1, 2):
        tree = load_checkpoint(tmp_path / "run" / "checkpoints" / f"round_{number:04d}")
        for client, state in tree["federation"]["clients"].items():
            assert not [key for key in state if "secagg" in key or "secret" in key], (number, client)


def test_a_dp_round_that_samples_one_client_moves_the_model_by_the_noise_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prepare: Poisson DP with SecAgg; the secret sample of round 1 holds a single client (as a Poisson
    # draw may), round 2 two.
    from fedtune.fl.privacy import ClientLevelDP

    drawn = {1: ["c01"], 2: ["c00", "c03"]}
    real_sample = ClientLevelDP.sample

    def sample(self: ClientLevelDP, client_ids: list[str], rnd: int) -> list[str]:
        real_sample(self, client_ids, rnd)
        return drawn[rnd]

    monkeypatch.setattr(ClientLevelDP, "sample", sample)
    dp = ("dp.enabled=true", "dp.noise_multiplier=1.0", "dp.clip_norm=0.5", "fed.clients_per_round=2")
    cfg = tiny_config(
        "fedit", *ONE_ROUND, "fed.rounds=2", "fed.keep_checkpoints=3", *dp, "secagg.enabled=true"
    )

    # Execute
    history = quiet_runner(cfg, tmp_path / "run").run()

    # Assert: round 1 is a release of the noise alone (accounted), the lone client's update left out with
    # the reason; round 2 aggregates as usual
    first, second = history[1], history[2]
    assert "c01" in first["failed"] and "revealed" in first["failed"]["c01"]
    assert 0 < first["dp_epsilon"] < second["dp_epsilon"]
    assert second["secagg_clients"] == 2
    before = load_checkpoint(tmp_path / "run" / "checkpoints" / "round_0000")["algorithm"]["global_adapter"]
    after = load_checkpoint(tmp_path / "run" / "checkpoints" / "round_0001")["algorithm"]["global_adapter"]
    assert any(not np.array_equal(before[k], after[k]) for k in before)  # the noise moved it
