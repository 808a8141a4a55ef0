"""Client-level DP through whole runs: resume equals an uninterrupted run (same epsilon, same model), the
secret stays in the checkpoint, dp.max_epsilon ends a run cleanly, and every method that declares DP
support releases its model through the mechanism."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fedtune.algorithms.registry import algorithm_names, get_algorithm
from fedtune.config import ExperimentConfig
from fedtune.fl.checkpoint import latest_checkpoint, load_checkpoint
from fedtune.fl.privacy import ClientLevelDP, RoundMechanism, epsilon_after
from fedtune.report import write_report
from fedtune.rundata import prepare_data
from tests.integration.helpers import (
    ADAPTIVE_STEP_IS_THE_RELEASE,
    quiet_runner,
    stable,
    tiny_config,
)

DP = ("dp.enabled=true", "dp.noise_multiplier=0.8", "dp.clip_norm=0.5", "fed.fraction=0.5")
FAST = ("eval.before=false", "eval.metrics=[perplexity]", "eval.max_examples=4")


class Interrupt(BaseException):
    """Stands for the process dying: not an Exception, so nothing inside the run catches it."""


def fixed_secret(monkeypatch: pytest.MonkeyPatch, value: int) -> None:
    """Every ``ClientLevelDP`` created from now on draws ``value`` as its secret."""
    monkeypatch.setattr("fedtune.fl.privacy.secrets.randbits", lambda bits: value)


def secret_sampling_every_round(cfg: ExperimentConfig, rounds: int) -> int:
    """A random secret whose Poisson samples are not empty in rounds 1..rounds (so a client task runs)."""
    clients = list(prepare_data(cfg).clients)
    while True:
        mechanism = ClientLevelDP(cfg.dp, cfg.fed)
        mechanism.start(clients, len(clients))
        if all(mechanism.sample(clients, rnd) for rnd in range(1, rounds + 1)):
            return mechanism.secret


def test_resume_with_dp_equals_the_uninterrupted_run_and_the_secret_stays_in_the_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prepare: both runs draw the same secret; the interrupted one dies in round 2.
    cfg = tiny_config("fedit", *DP, *FAST, "fed.rounds=3")
    secret = secret_sampling_every_round(cfg, 3)
    fixed_secret(monkeypatch, secret)

    def die_in_round_2(client: str, task: str, rnd: int) -> None:
        if rnd == 2:
            raise Interrupt

    # Execute
    full = quiet_runner(cfg, tmp_path / "full").run()
    with pytest.raises(Interrupt):
        quiet_runner(cfg, tmp_path / "cut", before_task=die_in_round_2).run()
    fixed_secret(monkeypatch, secret ^ 1)  # a resume that drew a fresh secret would differ
    resumed = quiet_runner(cfg, tmp_path / "cut").run(resume=True)

    # Assert: the same rows (epsilon included), clients and model
    assert stable(resumed) == stable(full)
    assert full[0]["dp_epsilon"] == 0.0
    assert 0 < full[1]["dp_epsilon"] < full[2]["dp_epsilon"] < full[3]["dp_epsilon"]
    assert all(row["dp_delta"] == 1e-5 for row in full)
    trees = [load_checkpoint(latest_checkpoint(tmp_path / d)) for d in ("full", "cut")]  # type: ignore[arg-type]
    for key, value in trees[0]["algorithm"]["global_adapter"].items():
        np.testing.assert_array_equal(trees[1]["algorithm"]["global_adapter"][key], value)
    assert trees[0]["privacy"] == trees[1]["privacy"]
    assert trees[0]["privacy"]["ledger"][0]["count"] == 3
    # The secret is in the checkpoint, and in no file a run shares (config, metrics, data stats).
    assert int(trees[0]["privacy"]["secret"], 16) == secret
    for name in ("config.yaml", "metrics.jsonl", "data_stats.json"):
        text = (tmp_path / "full" / name).read_text()
        assert format(secret, "x") not in text and str(secret) not in text, name


def test_max_epsilon_ends_the_run_cleanly_before_the_round_that_would_exceed_it(tmp_path: Path) -> None:
    # Prepare: a budget between epsilon after one round and after two (4 clients, q 0.5, z 0.8).
    release = RoundMechanism("poisson", 4, 0.5, 0, 0.8)
    budget = (epsilon_after([(release, 1)], 1e-5, "pld") + epsilon_after([(release, 2)], 1e-5, "pld")) / 2
    cfg = tiny_config("fedit", *DP, *FAST, "fed.rounds=3", f"dp.max_epsilon={budget}")

    # Execute
    history = quiet_runner(cfg, tmp_path / "run").run()

    # Assert: rounds 0 and 1 only, within the budget, with the final artifacts written
    assert [row["round"] for row in history] == [0, 1]
    assert 0 < history[-1]["dp_epsilon"] <= budget
    assert (tmp_path / "run" / "artifacts" / "adapter" / "adapter_model.safetensors").is_file()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows == history
    report = write_report(tmp_path / "run").read_text()
    assert "## Privacy" in report and "before round 2 of 3 (dp.max_epsilon)" in report
    assert f"{history[-1]['dp_epsilon']:.4g}" in report


SUPPORTED = [name for name in algorithm_names() if get_algorithm(name).Config.dp_refused is None]
SETTINGS = {
    "fedpft": ("fedpft.neuron_every=0",),
    "fedpt": ("fedpt.distill=false",),
    **ADAPTIVE_STEP_IS_THE_RELEASE,
}
"""FedPT's distillation on public data moves the adapter after the release (post-processing, allowed);
without it the released adapter is the mechanism's output itself, which the test bounds."""
STATE = {"fedpft": "global_state", "fedkseed": "released"}


@pytest.mark.parametrize("algorithm", SUPPORTED)
def test_every_method_that_supports_dp_releases_its_model_through_the_mechanism(
    algorithm: str, tmp_path: Path
) -> None:
    # Prepare: every client sampled (q = 1), updates clipped to a C far below their norms.
    clip, noise = 1e-5, 1.0
    settings = ("fed.rounds=1", "fed.keep_checkpoints=3", *FAST, *SETTINGS.get(algorithm, ()))
    dp = ("dp.enabled=true", f"dp.noise_multiplier={noise}", f"dp.clip_norm={clip}")
    cfg = tiny_config(algorithm, *settings, *dp)

    # Execute
    history = quiet_runner(cfg, tmp_path / "dp").run()

    # Assert: one release accounted; the model moved by (4 clipped updates + noise of std z C) / 4,
    # far less than the clients' own updates (which a plain mean would have followed)
    assert history[1]["dp_epsilon"] > 0 and history[1]["dp_clipped"] == 1.0
    key = STATE.get(algorithm, "global_adapter")
    before, after = (
        load_checkpoint(tmp_path / "dp" / "checkpoints" / f"round_{r:04d}")["algorithm"][key] for r in (0, 1)
    )
    size = sum(value.size for value in before.values())
    step = float(np.sqrt(sum(np.sum((after[k] - before[k]).astype(np.float64) ** 2) for k in before)))
    bound = (4 * clip + 1.2 * noise * clip * np.sqrt(size)) / 4
    assert 0 < step < bound < history[1]["dp_update_norm"] / 4
    tree = load_checkpoint(latest_checkpoint(tmp_path / "dp"))  # type: ignore[arg-type]
    assert tree["privacy"]["ledger"][0]["count"] == 1
