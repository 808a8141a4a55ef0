"""A client builds its method's task table from the config alone: no server side is constructed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from fedtune.algorithms.base import Algorithm
from fedtune.algorithms.registry import client_tasks, get_algorithm
from fedtune.config import ExperimentConfig, load_config
from fedtune.fl.federation import ClientContext, ClientTask
from fedtune.fl.payload import Payload
from fedtune.fl.secagg import client_tasks as secagg_tasks
from fedtune.flower.node import task_names
from fedtune.plugins import algorithm_names

CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "test"


def tiny(name: str, *overrides: str) -> ExperimentConfig:
    return load_config(CONFIGS / f"{name}-tiny.yaml", list(overrides))


@pytest.fixture
def no_algorithm(monkeypatch: pytest.MonkeyPatch) -> None:
    """Constructing any Algorithm fails the test."""

    def refuse(self: Algorithm[Any], cfg: ExperimentConfig) -> None:
        raise AssertionError(f"{type(self).__name__} was constructed")

    monkeypatch.setattr(Algorithm, "__init__", refuse)


@pytest.mark.usefixtures("no_algorithm")
@pytest.mark.parametrize("name", algorithm_names())
def test_a_node_builds_its_task_table_without_the_algorithm(name: str) -> None:
    # Prepare
    cfg = tiny(name)
    # Execute
    names = task_names(yaml.safe_dump(cfg.to_yaml_dict()))
    table = client_tasks(cfg)
    # Assert
    assert "fit" in names and names == list(table)
    assert names == list(get_algorithm(name).client_tasks(cfg))


@pytest.mark.usefixtures("no_algorithm")
def test_with_secure_aggregation_the_table_holds_the_protocol_tasks() -> None:
    cfg = tiny("fedavgm", "secagg.enabled=true")
    plain = get_algorithm("fedavgm").client_tasks(cfg)
    table = client_tasks(cfg)
    assert set(table) == set(plain) | set(secagg_tasks())
    assert table["fit"] is not plain["fit"]  # the update stays on the client, summed masked


def plain_fit(ctx: ClientContext, msg: Payload) -> Payload:
    return {}


class OldStyle(Algorithm[Any]):
    """A method written against the old contract: ``client_tasks`` reads the server's own state."""

    name = "old-style"

    def client_tasks(self) -> dict[str, ClientTask]:  # type: ignore[override]
        return {"fit": plain_fit}


def test_a_client_tasks_that_is_not_a_classmethod_is_refused_by_name() -> None:
    with pytest.raises(TypeError, match="'old-style': client_tasks must be a classmethod"):
        OldStyle.client_table(tiny("fedit"))
