"""The worked example of "Add a method": FedAvgM end to end."""

from __future__ import annotations

from pathlib import Path

from tests.integration.helpers import quiet_runner, stable, tiny_config


def test_fedavgm_without_momentum_is_fedit(tmp_path: Path) -> None:
    fedavgm = quiet_runner(tiny_config("fedavgm", "fedavgm.momentum=0", "name=x"), tmp_path / "m").run()
    fedit = quiet_runner(tiny_config("fedit", "name=x"), tmp_path / "f").run()
    assert stable(fedavgm) == stable(fedit)


def test_momentum_changes_the_trajectory(tmp_path: Path) -> None:
    with_momentum = quiet_runner(tiny_config("fedavgm", "fed.rounds=2"), tmp_path / "m").run()
    without = quiet_runner(tiny_config("fedavgm", "fed.rounds=2", "fedavgm.momentum=0"), tmp_path / "f").run()
    # v_0 = 0: the first step is FedAvg's; from the second on, momentum carries the first step on.
    assert stable(with_momentum)[:2] == stable(without)[:2]
    assert with_momentum[2]["eval"] != without[2]["eval"]
