"""The run's release (``fl.release``): which bound clips an update, which range quantises it, and who
is sampled with and without DP."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedtune.config import ExperimentConfig, apply_overrides, validate_config
from fedtune.fl.federation import ClientContext
from fedtune.fl.payload import Payload
from fedtune.fl.release import Release
from fedtune.fl.secagg import TASKS, UPDATE

CLIENTS = [f"c{i:02d}" for i in range(10)]
DP = ("dp.enabled=true", "dp.noise_multiplier=1.0", "dp.clip_norm=0.5")


def config(*overrides: str) -> ExperimentConfig:
    return validate_config(apply_overrides({}, ["data.partition.num_clients=10", *overrides]))


class SampleOnly:
    """The part of a federation sampling uses: the client ids and the seeded ``sample(k, rnd)``."""

    def __init__(self) -> None:
        self.asked: list[tuple[int, int]] = []

    def client_ids(self) -> list[str]:
        return list(CLIENTS)

    def sample(self, k: int, rnd: int) -> list[str]:
        self.asked.append((k, rnd))
        return CLIENTS[:k]


def clipped_update_norm(cfg: ExperimentConfig, tmp_path: Path) -> float:
    """The L2 norm of the update a client keeps for secure aggregation after an update of norm 5."""

    def fit(ctx: ClientContext, msg: Payload) -> Payload:
        return {"w": np.array([3.0, 4.0], np.float32), "num_examples": 2}

    tasks = Release.from_config(cfg, "fit").client_tasks({"fit": fit})
    assert set(tasks) == {"fit", *TASKS}
    ctx = ClientContext("c00", cfg, [], None, {}, tmp_path, rnd=1)  # type: ignore[arg-type]
    reply = tasks["fit"](ctx, {"w": np.zeros(2, np.float32)})
    assert "w" not in reply, "the update stays on the client"
    return float(np.linalg.norm(ctx.state[UPDATE]["update"]))


def test_the_update_is_clipped_to_dp_clip_norm_under_dp_else_to_fed_norm_bound(tmp_path: Path) -> None:
    secure = "secagg.enabled=true"
    assert clipped_update_norm(config(secure, *DP, "fed.norm_bound=2.0"), tmp_path) == pytest.approx(0.5)
    assert clipped_update_norm(config(secure, "fed.norm_bound=2.0"), tmp_path) == pytest.approx(2.0)
    assert clipped_update_norm(config(secure), tmp_path) == pytest.approx(5.0)
    plain = Release.from_config(config("fed.norm_bound=2.0"), "fit")
    assert set(plain.client_tasks({"fit": lambda ctx, msg: msg})) == {"fit"}


def test_secure_aggregation_quantises_within_clip_range_else_dp_clip_norm_else_one() -> None:
    def clip_range(*overrides: str) -> float:
        secure = Release.from_config(config("secagg.enabled=true", *overrides), "fit").secure
        assert secure is not None
        return secure.settings.clip_range

    assert clip_range(*DP, "secagg.clip_range=0.25") == 0.25
    assert clip_range(*DP) == 0.5
    assert clip_range("fed.norm_bound=2.0") == 1.0


@pytest.mark.parametrize(
    ("overrides", "k"), [(("fed.clients_per_round=3",), 3), (("fed.fraction=0.45",), 4), ((), 10)]
)
def test_without_dp_a_round_samples_clients_per_round_else_a_fraction_seeded(
    overrides: tuple[str, ...], k: int
) -> None:
    fed = SampleOnly()
    assert Release.from_config(config(*overrides), "fit").sample(fed, 7) == CLIENTS[:k]  # type: ignore[arg-type]
    assert fed.asked == [(k, 7)]


def test_under_dp_a_round_samples_from_the_secret_not_the_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    def draws(secret: int) -> list[list[str]]:
        monkeypatch.setattr("fedtune.fl.privacy.secrets.randbits", lambda bits: secret)
        release = Release.from_config(config(*DP, "fed.fraction=0.5"), "fit")
        assert release.privacy is not None
        release.privacy.start(CLIENTS, 5)
        fed = SampleOnly()
        sampled = [release.sample(fed, rnd) for rnd in range(1, 6)]  # type: ignore[arg-type]
        assert fed.asked == [], "the public seed plays no part"
        return sampled

    assert draws(12345) == draws(12345), "the same secret draws the same clients"
    assert draws(12345) != draws(54321), "another secret draws others (odds of a tie 2^-50)"
