"""HetLoRA and FlexLoRA in a run: ranks per client, validated by the rank each client was sent."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from fedtune.algorithms.hetrank.maths import zero_pad
from fedtune.algorithms.registry import get_algorithm
from fedtune.config import ConfigError
from fedtune.errors import RunError
from fedtune.fl.payload import Payload, arrays
from tests.integration.helpers import quiet_runner, tiny_config


def test_a_reply_at_a_rank_the_client_was_not_given_is_rejected_with_client_and_key(tmp_path: Path) -> None:
    # Arrange: flexlora-tiny gives c00 rank 2 (ranks [2, 4] round-robin); c00 replies at lora.r = 4.
    cfg = tiny_config("flexlora", "fed.rounds=1", "eval.before=false")

    def widen(client: str, task: str, rnd: int, reply: Payload) -> Payload:
        if client != "c00" or task != "fit":
            return reply
        widened = zero_pad(arrays(reply, "adapter/"), 4)
        return {**reply, **{"adapter/" + key: value for key, value in widened.items()}}

    # Act
    history = quiet_runner(cfg, tmp_path / "run", after_task=widen).run()
    # Assert: only c00 is rejected, and the reason names a key and the rank-2 shape it was sent
    reason = history[1]["rejected"]["c00"]
    assert set(history[1]["rejected"]) == {"c00"}
    assert re.fullmatch(r"'adapter/\S+\.lora_A\.weight' has shape \(4, \d+\), expected \(2, \d+\)", reason)


@pytest.mark.parametrize("algorithm", ["hetlora", "flexlora"])
def test_a_client_rank_above_lora_r_is_refused_naming_both_keys(algorithm: str) -> None:
    cfg = tiny_config(algorithm, "lora.r=2")  # the tiny configs' ranks are [2, 4]
    with pytest.raises(RunError, match=rf"{algorithm}\.ranks \[2, 4\].*lora\.r = 2"):
        get_algorithm(algorithm)(cfg)


def test_hetlora_prunes_a_client_whose_tail_shrank(tmp_path: Path) -> None:
    # A strong regulariser shrinks every tail in round 2 below its round-1 value.
    cfg = tiny_config("hetlora", "hetlora.reg_weight=50", "eval.before=false")
    history = quiet_runner(cfg, tmp_path / "run").run()
    assert history[1]["mean_client_rank"] == 3.0  # ranks 2, 4, 2, 4: round 1 has no earlier tail
    assert history[2]["mean_client_rank"] < 3.0
    assert np.isfinite(history[2]["train_loss"])
    kept = quiet_runner(
        tiny_config("hetlora", "hetlora.reg_weight=50", "hetlora.prune=false"), tmp_path / "k"
    ).run()
    assert kept[2]["mean_client_rank"] == 3.0


@pytest.mark.parametrize(
    ("algorithm", "reason"),
    [("hetlora", "weights depend on the updates"), ("flexlora", "not linear in the replies")],
)
@pytest.mark.parametrize(
    "setting", [("dp.enabled=true", "dp.noise_multiplier=1.0", "dp.clip_norm=1.0"), ("secagg.enabled=true",)]
)
def test_dp_and_secagg_are_refused_with_the_reason(
    algorithm: str, reason: str, setting: tuple[str, ...]
) -> None:
    with pytest.raises(ConfigError, match=rf"algorithm '{algorithm}' cannot .*{reason}"):
        tiny_config(algorithm, *setting)
