"""FedIT's options and run modes on the tiny config: FedProx, standalone, centralized, sampling."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from fedtune.fl.checkpoint import latest_checkpoint, load_checkpoint
from fedtune.resources import Resources
from tests.integration.helpers import quiet_runner, tiny_config


def final_state(run_dir: Path) -> dict[str, np.ndarray]:
    path = latest_checkpoint(run_dir)
    assert path is not None
    return load_checkpoint(path)["algorithm"]["global_adapter"]  # type: ignore[no-any-return]


def distance(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    return math.sqrt(sum(float(np.sum((a[k] - b[k]) ** 2)) for k in a))


def test_fedprox_pulls_clients_towards_the_global_model(tmp_path: Path) -> None:
    plain = quiet_runner(tiny_config("fedit", "fed.rounds=1", "eval.before=false"), tmp_path / "avg")
    prox = quiet_runner(
        tiny_config("fedit", "fed.rounds=1", "eval.before=false", "fedit.prox_mu=1000.0"), tmp_path / "prox"
    )
    plain.run()
    prox.run()
    start = Resources(tiny_config("fedit")).initial_adapter()
    assert distance(final_state(tmp_path / "prox"), start) < distance(final_state(tmp_path / "avg"), start)


def test_standalone_keeps_a_personal_adapter_per_client(tmp_path: Path) -> None:
    runner = quiet_runner(tiny_config("fedit", "fed.mode=standalone"), tmp_path / "run")
    history = runner.run()
    path = latest_checkpoint(tmp_path / "run")
    assert path is not None
    clients = load_checkpoint(path)["federation"]["clients"]
    adapters = [state["adapter"] for state in clients.values()]
    assert len(adapters) == 4
    first_key = next(iter(adapters[0]))
    assert not np.allclose(adapters[0][first_key], adapters[1][first_key])
    # Nothing is broadcast after round 1: each client continues from its own adapter.
    assert history[2]["bytes_down"] < history[1]["bytes_down"]


def test_centralized_trains_one_model_on_all_data(tmp_path: Path) -> None:
    history = quiet_runner(tiny_config("fedit", "fed.mode=centralized"), tmp_path / "run").run()
    assert history[1]["clients"] == ["central"]
    assert history[1]["num_examples"] == 96


def test_client_sampling_fraction(tmp_path: Path) -> None:
    history = quiet_runner(
        tiny_config("fedit", "fed.fraction=0.5", "fed.rounds=3", "eval.every=3"), tmp_path / "run"
    ).run()
    sampled = [tuple(row["clients"]) for row in history[1:]]
    assert all(len(s) == 2 for s in sampled)
    assert len(set(sampled)) > 1
    assert "eval" not in history[1] and "eval" in history[3]


@pytest.mark.parametrize("arch", ["tiny-qwen2", "tiny-gpt2"])
def test_other_decoder_families_run(arch: str, tmp_path: Path) -> None:
    cfg = tiny_config("fedit", f"model.name={arch}", "fed.rounds=1", "eval.metrics=[perplexity]")
    history = quiet_runner(cfg, tmp_path / "run").run()
    assert history[1]["eval"]["perplexity"] < history[0]["eval"]["perplexity"]
    assert history[1]["bytes_up"] > 0


def test_standalone_with_sampling_starts_new_clients_from_the_initial_adapter(tmp_path: Path) -> None:
    cfg = tiny_config("fedit", "fed.mode=standalone", "fed.fraction=0.5", "fed.rounds=3", "eval.every=3")
    history = quiet_runner(cfg, tmp_path / "run").run()

    rounds = history[1:]
    assert all(row["failed"] == {} and row["rejected"] == {} for row in rounds)
    sampled = [set(row["clients"]) for row in rounds]
    assert len(set.union(*sampled)) > len(sampled[0]), "the config must sample a new client after round 1"
    path = latest_checkpoint(tmp_path / "run")
    assert path is not None
    states = load_checkpoint(path)["federation"]["clients"]
    assert {cid for cid, state in states.items() if "adapter" in state} == set.union(*sampled)
    # Only a client seen for the first time is sent the initial adapter.
    new_in_round_2 = sampled[1] - sampled[0]
    assert (rounds[1]["bytes_down"] > 0) == bool(new_in_round_2)


def test_standalone_evaluation_averages_each_clients_own_adapter(tmp_path: Path) -> None:
    from fedtune.algorithms.adapters import evaluate_adapter

    cfg = tiny_config("fedit", "fed.mode=standalone", "fed.rounds=1")
    history = quiet_runner(cfg, tmp_path / "run").run()
    path = latest_checkpoint(tmp_path / "run")
    assert path is not None
    states = load_checkpoint(path)["federation"]["clients"]
    resources = Resources(cfg)
    from fedtune.rundata import prepare_data

    records = prepare_data(cfg).eval_records
    per_client = [evaluate_adapter(cfg, resources, s["adapter"], records, 1) for s in states.values()]
    expected = sum(r.metrics["perplexity"] for r in per_client) / len(per_client)
    assert history[1]["eval"]["perplexity"] == pytest.approx(expected, rel=1e-9)
    assert history[1]["eval"]["perplexity"] != pytest.approx(history[0]["eval"]["perplexity"])


def test_the_run_summary_names_categories_no_client_trained_on(tmp_path: Path) -> None:
    import json

    from rich.console import Console

    from fedtune.runner import Runner

    cfg = tiny_config(
        "fedit", "fed.rounds=1", "data.partition.num_clients=2", "data.partition.classes_per_client=1"
    )
    console = Console(record=True, width=200)
    Runner(cfg, tmp_path / "run", console=console).run()

    stats = json.loads((tmp_path / "run" / "data_stats.json").read_text())
    held = {c for per_client in stats["counts"].values() for c, n in per_client.items() if n}
    left_out = sorted(set(stats["eval_counts"]) - held)
    assert left_out, "the config must leave a category out"
    assert f"evaluated all the same): {', '.join(left_out)}" in console.export_text()
