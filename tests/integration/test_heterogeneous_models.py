"""An algorithm may give every client its own model spec; in-process each distinct spec loads once."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import torch

from fedtune.algorithms.base import Algorithm, RoundResult
from fedtune.algorithms.fedit import FedITConfig
from fedtune.data.tokenize import encode_records, make_batches
from fedtune.eval.evaluate import EvalResult, EvalSet
from fedtune.fl.federation import ClientContext, ClientTask, Federation, ServerContext
from fedtune.fl.payload import Payload
from fedtune.fl.validation import ReplySpec
from fedtune.models.spec import ModelSpec
from fedtune.plugins import register
from fedtune.resources import Resources
from fedtune.train.losses import response_nll
from tests.integration.helpers import quiet_runner, tiny_config

ARCHS = ("tiny-llama", "tiny-qwen2-L2-H32")


class ProbeConfig(FedITConfig):
    pass


def probe_spec(cfg: Any, client: str) -> ModelSpec:
    """Clients alternate between the two architectures."""
    return ModelSpec(ARCHS[int(client[1:]) % 2], seed=cfg.seed)


class HeteroProbe(Algorithm[ProbeConfig]):
    """Clients alternate between two architectures and report their model's loss on local data."""

    name = "hetero-probe"
    Config = ProbeConfig
    seen: ClassVar[dict[str, str]] = {}
    loads: ClassVar[list[str]] = []

    def client_model_spec(self, client: str) -> ModelSpec:
        return probe_spec(self.cfg, client)

    @classmethod
    def client_tasks(cls, cfg: Any) -> dict[str, ClientTask]:
        return {"fit": cls._fit}

    @staticmethod
    def _fit(ctx: ClientContext, msg: Payload) -> Payload:
        model, tokenizer = ctx.resources.model(probe_spec(ctx.cfg, ctx.client_id))
        HeteroProbe.seen[ctx.client_id] = model.config.model_type
        HeteroProbe.loads[:] = ctx.resources.loads
        examples = encode_records(ctx.data[:4], tokenizer, "alpaca", 64)
        batch = make_batches(examples, 4, int(tokenizer.pad_token_id), seed=0)[0]
        with torch.no_grad():
            nll, count = response_nll(model, batch)
        return {"num_examples": len(ctx.data), "train_loss": float(nll) / max(1, count)}

    def setup(self, server: ServerContext) -> None:
        return None

    def run_round(self, rnd: int, server: ServerContext, fed: Federation) -> RoundResult:
        clients = fed.client_ids()
        spec = ReplySpec(scalars={"num_examples": int, "train_loss": float}, example_limits=fed.client_sizes)
        replies = fed.call(clients, "fit", {}, expect=spec)
        losses = [float(r["train_loss"]) for r in replies.values()]
        return RoundResult(
            clients, sum(losses) / len(losses), sum(int(r["num_examples"]) for r in replies.values()), 0
        )

    def evaluate(self, rnd: int, server: ServerContext, fed: Federation, eval_set: EvalSet) -> EvalResult:
        return EvalResult({})

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        return None


def test_each_client_gets_its_spec_and_each_spec_loads_once(tmp_path: Path) -> None:
    register(HeteroProbe)  # here, not at import: the contract test lists algorithms at collection
    cfg = tiny_config("fedit", "algorithm=hetero-probe", "fed.rounds=2", "eval.before=false")
    runner = quiet_runner(cfg, tmp_path / "run")
    history = runner.run()
    assert set(HeteroProbe.seen.values()) == {"llama", "qwen2"}
    assert HeteroProbe.seen["c00"] == "llama" and HeteroProbe.seen["c01"] == "qwen2"
    assert all(row["train_loss"] > 0 for row in history[1:])
    # Four clients, two rounds, one process: each of the two specs was loaded exactly once.
    assert sorted(HeteroProbe.loads) == sorted(ModelSpec(a, seed=cfg.seed).key for a in ARCHS)


def test_a_node_loads_only_what_its_clients_tasks_ask_for(tmp_path: Path) -> None:
    """A SuperNode's runtime loads nothing up front; a FedBiOT client never loads the LLM at all."""
    import yaml

    from fedtune.flower.node import build_runtime, execute
    from tests.integration.test_fedbiot import _built

    cfg = tiny_config("fedbiot", "fed.rounds=1")
    algorithm, _, _ = _built(cfg, tmp_path / "server")
    runtime = build_runtime(yaml.safe_dump(cfg.to_yaml_dict()), {"partition-id": 0, "workdir": str(tmp_path)})
    assert runtime.resources.loads == []
    message = algorithm.message(runtime.client_id)
    outcome = execute(runtime, "fit", 1, message, {})
    assert outcome.error is None and outcome.reply is not None
    assert runtime.resources.loads == []  # the emulator came over the wire; only a tokenizer was loaded

    fedit = tiny_config("fedit", "fed.rounds=1")
    node = build_runtime(yaml.safe_dump(fedit.to_yaml_dict()), {"partition-id": 1, "workdir": str(tmp_path)})
    initial = Resources(fedit).initial_adapter()
    done = execute(node, "fit", 1, {f"adapter/{k}": v for k, v in initial.items()}, {})
    assert done.error is None and node.resources.loads == [node.resources.base_spec.key]
