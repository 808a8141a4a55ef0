"""Client-side (personal) evaluation: each client's own model on its own held-out split."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedtune.config import ConfigError
from fedtune.fl.checkpoint import latest_checkpoint, load_checkpoint
from fedtune.fl.payload import Payload
from fedtune.resources import Resources
from tests.integration.helpers import quiet_runner, tiny_config


def test_standalone_personal_eval_is_each_clients_adapter_on_its_own_held_out_data(tmp_path: Path) -> None:
    from fedtune.algorithms.adapters import evaluate_adapter
    from fedtune.rundata import prepare_data

    cfg = tiny_config("fedit", "fed.mode=standalone", "fed.rounds=1", "eval.personal=true")
    history = quiet_runner(cfg, tmp_path / "run").run()
    data = prepare_data(cfg)
    assert data.client_eval and all(data.client_eval.values())
    for cid, held in data.client_eval.items():  # held-out records are not trained on
        assert not {id(r) for r in held} & {id(r) for r in data.clients[cid]}
    path = latest_checkpoint(tmp_path / "run")
    assert path is not None
    states = load_checkpoint(path)["federation"]["clients"]
    resources = Resources(cfg)
    row = history[1]
    for cid, state in states.items():
        own = evaluate_adapter(cfg, resources, state["adapter"], data.client_eval[cid], 1)
        assert row["eval_by_client"][cid]["perplexity"] == pytest.approx(own.metrics["perplexity"], rel=1e-9)
    per_client = [v["perplexity"] for v in row["eval_by_client"].values()]
    assert row["eval"]["personal/perplexity"] == pytest.approx(sum(per_client) / len(per_client))
    assert "personal/perplexity_weighted" in row["eval"]
    assert history[0]["eval_by_client"].keys() == row["eval_by_client"].keys()


def test_federated_personal_eval_sends_the_global_adapter(tmp_path: Path) -> None:
    cfg = tiny_config("fedit", "fed.rounds=1", "eval.personal=true", "eval.metrics=[perplexity]")
    seen: list[tuple[str, str]] = []
    history = quiet_runner(cfg, tmp_path / "run", tap=lambda d, c, task, r, p: seen.append((d, task))).run()
    assert ("down", "evaluate_personal") in seen and ("up", "evaluate_personal") in seen
    assert len(history[1]["eval_by_client"]) == cfg.data.partition.num_clients


def test_personal_eval_needs_an_algorithm_that_has_it() -> None:
    with pytest.raises(ConfigError, match=r"eval\.personal: algorithm 'fedpt' has no client-side evaluation"):
        tiny_config("fedpt", "eval.personal=true")


@pytest.mark.parametrize("algorithm", ["fedit", "perfit", "fedmkt"])
def test_a_non_finite_personal_metric_is_rejected_and_left_out(algorithm: str, tmp_path: Path) -> None:
    # Prepare: client c00 reports a NaN perplexity for its own model in every evaluation.
    cfg = tiny_config(algorithm, "fed.rounds=1", "eval.personal=true", "eval.before=false")

    def poison(client: str, task: str, rnd: int, reply: Payload) -> Payload:
        if client == "c00" and task == "evaluate_personal":
            return {**reply, "metric/perplexity": float("nan")}
        return reply

    # Execute
    history = quiet_runner(cfg, tmp_path / "run", after_task=poison).run()

    # Assert: the others' mean, no NaN in the row, the reason recorded
    row = history[1]
    assert "c00" not in row["eval_by_client"] and len(row["eval_by_client"]) == 3
    others = [v["perplexity"] for v in row["eval_by_client"].values()]
    assert row["eval"]["personal/perplexity"] == pytest.approx(sum(others) / len(others))
    assert "not finite" in row["rejected"]["c00"]


def test_clients_too_small_for_a_held_out_split_are_an_error_naming_the_keys(tmp_path: Path) -> None:
    from fedtune.data.records import DataError

    cfg = tiny_config("fedmkt", "data.max_train_examples=8", "data.partition.num_clients=8")

    with pytest.raises(DataError, match=r"data\.partition\.num_clients"):
        quiet_runner(cfg, tmp_path / "run").run()

    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.parametrize("count", [10**9, -3])
def test_an_evaluation_claiming_more_or_fewer_records_than_it_holds_is_rejected(
    count: int, tmp_path: Path
) -> None:
    cfg = tiny_config("fedit", "fed.rounds=1", "eval.personal=true", "eval.before=false")

    def inflate(client: str, task: str, rnd: int, reply: Payload) -> Payload:
        return (
            {**reply, "num_eval_examples": count}
            if client == "c00" and task == "evaluate_personal"
            else reply
        )

    history = quiet_runner(cfg, tmp_path / "run", after_task=inflate).run()

    row = history[1]
    assert "num_eval_examples" in row["rejected"]["c00"] and "c00" not in row["eval_by_client"]
    assert len(row["eval_by_client"]) == 3 and row["eval"]["personal/perplexity_weighted"] > 0
