"""FedMKT on tiny models: what travels, the settings and baselines, heterogeneous tokenizers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedtune.algorithms.fedmkt import FedMKT
from fedtune.algorithms.fedmkt.transfer import public_view
from fedtune.algorithms.fedmkt.wire import ADAPTER, LLM, PUBLIC, public_subset
from fedtune.config import ConfigError
from fedtune.fl.payload import Payload
from fedtune.resources import Resources
from fedtune.rundata import prepare_data
from tests.integration.helpers import quiet_runner, tiny_config

KNOWLEDGE = {"loss", "ids", "values"}


def tapped_run(
    tmp_path: Path, *overrides: str
) -> tuple[list[dict[str, Any]], list[tuple[str, str, str, Payload]]]:
    cfg = tiny_config("fedmkt", *overrides)
    seen: list[tuple[str, str, str, Payload]] = []

    def tap(direction: str, client: str, task: str, rnd: int, payload: Payload) -> None:
        seen.append((direction, client, task, payload))

    return quiet_runner(cfg, tmp_path, tap=tap).run(), seen


def expected_counts(cfg: Any, client: str) -> list[int]:
    """Response tokens per public example as the client's own tokenizer sees them."""
    algorithm = FedMKT(cfg)
    spec = algorithm.client_model_spec(client)
    records = public_subset(prepare_data(cfg).public_records, cfg.fedmkt.public_examples, cfg.seed)
    tokenizer = Resources(cfg).tokenizer(spec)
    return public_view(records, tokenizer, cfg.data.template, cfg.data.max_length).counts


def test_clients_send_only_public_set_losses_and_top_k(tmp_path: Path) -> None:
    cfg = tiny_config("fedmkt", "fedmkt.compress=false")
    _, seen = tapped_run(tmp_path, "fedmkt.compress=false")

    uploads = [(client, p) for direction, client, task, p in seen if direction == "up" and task == "fit"]
    assert uploads
    for client, payload in uploads:
        array_keys = {k for k, v in payload.items() if isinstance(v, np.ndarray)}
        assert array_keys == {PUBLIC + name for name in KNOWLEDGE}, client
        counts = expected_counts(cfg, client)
        assert payload[PUBLIC + "loss"].shape == (len(counts),)
        assert payload[PUBLIC + "ids"].shape == (sum(counts), cfg.fedmkt.top_k)
        assert payload[PUBLIC + "values"].dtype == np.float16
    downs = [p for direction, _, task, p in seen if direction == "down" and task == "distill"]
    assert downs and all(
        {k for k, v in p.items() if isinstance(v, np.ndarray)} == {LLM + n for n in KNOWLEDGE} for p in downs
    )


def test_llm2slm_keeps_the_llm_frozen_and_standalone_transfers_nothing(tmp_path: Path) -> None:
    frozen, _ = tapped_run(tmp_path / "llm2slm", "fedmkt.llm_learns=false")
    assert frozen[-1]["eval"]["perplexity"] == pytest.approx(frozen[0]["eval"]["perplexity"])
    assert frozen[-1]["eval"]["personal/perplexity"] != pytest.approx(
        frozen[0]["eval"]["personal/perplexity"]
    )

    alone, seen = tapped_run(tmp_path / "standalone", "fed.mode=standalone")
    assert alone[-1]["eval"]["perplexity"] == pytest.approx(alone[0]["eval"]["perplexity"])
    assert not [p for _, _, _, p in seen if any(isinstance(v, np.ndarray) for v in p.values())]


def test_homogeneous_fedavg_sends_the_average_before_distillation(tmp_path: Path) -> None:
    _, seen = tapped_run(tmp_path, "fedmkt.clients=[tiny-qwen2]", "fedmkt.slm_fedavg=true")
    distill = [p for direction, _, task, p in seen if direction == "down" and task == "distill"]
    assert distill and all(any(k.startswith(ADAPTER) for k in p) for p in distill)
    first = [p for p in distill if p["round"] == 1]
    assert all(np.array_equal(first[0][k], p[k]) for p in first for k in first[0] if k.startswith(ADAPTER))


def test_fedavg_of_different_slms_is_a_config_error(tmp_path: Path) -> None:
    cfg = tiny_config("fedmkt", "fedmkt.slm_fedavg=true")
    with pytest.raises((ConfigError, ValueError), match="same SLM"):
        quiet_runner(cfg, tmp_path).run()


def test_a_node_loads_only_its_own_slm_and_the_llms_tokenizer(tmp_path: Path) -> None:
    import yaml

    from fedtune.flower.node import build_runtime, execute

    cfg = tiny_config("fedmkt", "fed.rounds=1")
    runtime = build_runtime(yaml.safe_dump(cfg.to_yaml_dict()), {"partition-id": 1, "workdir": str(tmp_path)})
    outcome = execute(runtime, "fit", 1, {"round": 1}, {})

    assert outcome.error is None and outcome.reply is not None
    own = FedMKT(cfg).client_model_spec(runtime.client_id)
    assert own.name == cfg.fedmkt.clients[1]
    assert runtime.resources.loads == [own.key]


def test_compressed_traffic_carries_the_same_knowledge_in_fewer_bytes(tmp_path: Path) -> None:
    plain, _ = tapped_run(tmp_path / "plain", "fedmkt.compress=false")
    packed, seen = tapped_run(tmp_path / "packed")

    uploads = [p for direction, _, task, p in seen if direction == "up" and task == "fit"]
    assert all(
        {k for k, v in p.items() if isinstance(v, np.ndarray)}
        == {"public/loss", "public/ids.planes.z", "public/values.planes.z"}
        for p in uploads
    )
    assert packed[-1]["bytes_up"] < plain[-1]["bytes_up"]
    assert packed[-1]["eval"] == plain[-1]["eval"]


def test_fedtune_eval_scores_the_final_llm_like_the_last_round(tmp_path: Path) -> None:
    from fedtune.artifacts import evaluate_run

    history, _ = tapped_run(tmp_path)
    result = evaluate_run(tmp_path)
    assert result.metrics["perplexity"] == pytest.approx(history[-1]["eval"]["perplexity"], rel=1e-4)


def test_a_client_claiming_an_impossible_loss_cannot_win_dual_min_ce(tmp_path: Path) -> None:
    # A negative per-sample loss would beat the LLM's on every public sample (DualMinCE keeps the lower).
    cfg = tiny_config("fedmkt", "fed.rounds=1", "eval.before=false")

    def negative(client: str, task: str, rnd: int, reply: Payload) -> Payload:
        if client == "c00" and task == "fit":
            return {**reply, PUBLIC + "loss": -np.abs(np.asarray(reply[PUBLIC + "loss"])) - 1.0}
        return reply

    history = quiet_runner(cfg, tmp_path / "run", after_task=negative).run()

    assert "cross-entropy cannot be" in history[1]["rejected"]["c00"]


def test_a_top_k_beyond_a_vocabulary_names_the_key_before_anything_runs(tmp_path: Path) -> None:
    cfg = tiny_config("fedmkt", "fedmkt.top_k=100000")

    with pytest.raises(ConfigError, match=r"fedmkt\.top_k 100000 exceeds the \d+-token vocabulary"):
        quiet_runner(cfg, tmp_path / "run").run()

    assert not (tmp_path / "run" / "checkpoints").exists() or not any(
        (tmp_path / "run" / "checkpoints").iterdir()
    )


def test_a_client_model_that_does_not_exist_names_its_key(tmp_path: Path) -> None:
    cfg = tiny_config("fedmkt", "fedmkt.clients=[tiny-llama-bpe,no-such-model-xyz]")

    with pytest.raises(ConfigError, match=r"fedmkt\.clients\[1\]: 'no-such-model-xyz' is not"):
        quiet_runner(cfg, tmp_path / "run").run()

    assert not (tmp_path / "run" / "checkpoints").exists()


def test_centralized_trains_the_run_model_on_all_private_data_and_the_public_set(tmp_path: Path) -> None:
    """The paper's Centralized baseline: one party tunes ``model:`` by SFT on the union of the clients'
    private data and the public set; nothing else travels but its LoRA."""
    overrides = ("fed.mode=centralized", "eval.personal=false", "train.max_steps=null", "fed.rounds=1")
    cfg = tiny_config("fedmkt", *overrides)
    data = prepare_data(cfg)
    public = public_subset(data.public_records, cfg.fedmkt.public_examples, cfg.seed)

    history, seen = tapped_run(tmp_path, *overrides)

    (upload,) = [p for direction, _, task, p in seen if direction == "up" and task == "fit"]
    private = len(data.clients["central"])
    assert upload["num_examples"] == private  # the aggregation weight: the data the party holds
    assert upload["trained_examples"] == private + len(public)
    arrays = {k for k, v in upload.items() if isinstance(v, np.ndarray)}
    assert arrays and all(k.startswith(ADAPTER) for k in arrays)
    assert history[-1]["eval"]["perplexity"] != pytest.approx(history[0]["eval"]["perplexity"])


def test_lam_one_trains_the_llm_on_the_public_set_alone(tmp_path: Path) -> None:
    """``fedmkt.lam=1`` (the "LLM on the public set only" row): the LLM's loss is the public set's CE
    alone, so knowledge the SLMs send -- here selected by DualMinCE on every sample, and different in
    the two runs (SLMs trained at two learning rates) -- does not move it; it still trains."""
    row = ("fedmkt.lam=1", "fedmkt.slm_learns=false", "fed.rounds=1", "fedmkt.clients=[tiny-llama-L2-H64]")
    first, _ = tapped_run(tmp_path / "a", *row)
    other, _ = tapped_run(tmp_path / "b", *row, "train.lr=0.05")

    assert first[-1]["llm_kd_selected"] > 0 and other[-1]["llm_kd_selected"] > 0
    assert first[-1]["eval"]["perplexity"] == other[-1]["eval"]["perplexity"]
    assert first[-1]["eval"]["perplexity"] != pytest.approx(first[0]["eval"]["perplexity"])


def test_the_simulation_holds_one_tokenizer_per_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The top_k check reads every vocabulary before the models load; the tokenizer it read must not
    stay beside the one each model brings (a Gemma-3 tokenizer alone holds ~0.3 GB)."""
    import gc

    from transformers import PreTrainedTokenizerBase

    def alive() -> int:
        gc.collect()
        return sum(issubclass(type(o), PreTrainedTokenizerBase) for o in gc.get_objects())

    kept: list[Resources] = []

    class Kept(Resources):  # the run's resources, alive after it with every model it loaded
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            kept.append(self)

    monkeypatch.setattr("fedtune.runner.Resources", Kept)
    cfg = tiny_config("fedmkt", "fed.rounds=1")
    algorithm = FedMKT(cfg)
    clients = [f"c{i:02d}" for i in range(cfg.data.partition.num_clients)]
    models = {algorithm.server_model_spec().key, *(algorithm.client_model_spec(c).key for c in clients)}
    before = alive()

    quiet_runner(cfg, tmp_path).run()

    assert len(models) >= 2 and kept
    assert alive() - before == len(models)
