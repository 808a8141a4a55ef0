"""A method defined outside ``src/`` (here, in a test module) gets what a built-in method gets: it runs,
resumes, and a finished run is evaluated and generated from with `fedtune eval` / `fedtune generate`,
with no line of fedtune naming it."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import Field
from typer.testing import CliRunner

from fedtune.algorithms.adapters import (
    ADAPTER,
    collect_adapters,
    evaluate_adapter,
    fit_adapter,
    fit_round_result,
)
from fedtune.algorithms.base import Algorithm, RoundResult
from fedtune.cli import app
from fedtune.config import AlgorithmConfig
from fedtune.eval.evaluate import EvalResult, EvalSet
from fedtune.fl.aggregate import weighted_average
from fedtune.fl.federation import ClientContext, ClientTask, Federation, ServerContext
from fedtune.fl.payload import Payload, arrays
from fedtune.plugins import _registered, register
from tests.integration.helpers import quiet_runner, stable, tiny_config


class HalfStepConfig(AlgorithmConfig):
    modes = ("federated",)

    step: float = Field(0.5, gt=0, le=1)


def fit(ctx: ClientContext, msg: Payload) -> Payload:
    """The client task: train the adapter it was sent on its own data."""
    return fit_adapter(ctx, arrays(msg, ADAPTER), prox_mu=0.0)


class HalfStep(Algorithm[HalfStepConfig]):
    """FedAvg that moves the global adapter only ``step`` of the way to the clients' mean."""

    name = "half-step"
    Config = HalfStepConfig

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        self.global_adapter: dict[str, np.ndarray] = {}

    @classmethod
    def client_tasks(cls, cfg: Any) -> dict[str, ClientTask]:
        return {"fit": fit}

    def setup(self, server: ServerContext) -> None:
        self.global_adapter = server.resources.initial_adapter()

    def run_round(self, rnd: int, server: ServerContext, fed: Federation) -> RoundResult:
        message = {ADAPTER + k: v for k, v in self.global_adapter.items()}
        sampled, replies, weights = collect_adapters(self, fed, rnd, self.global_adapter, message)
        mean = weighted_average([arrays(r, ADAPTER) for r in replies.values()], weights)
        step = self.section.step
        self.global_adapter = {k: v + step * (mean[k] - v) for k, v in self.global_adapter.items()}
        return fit_round_result(sampled, replies, weights)

    def evaluate(self, rnd: int, server: ServerContext, fed: Federation, eval_set: EvalSet) -> EvalResult:
        return evaluate_adapter(self.cfg, server.resources, self.global_adapter, eval_set.records, rnd)

    def final_adapter(self) -> dict[str, np.ndarray]:
        return self.global_adapter

    def state_dict(self) -> dict[str, Any]:
        return {"global_adapter": self.global_adapter}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.global_adapter = {k: np.asarray(v) for k, v in state["global_adapter"].items()}


class Interrupt(BaseException):
    """Stands for the process dying."""


@pytest.fixture
def half_step() -> Iterator[None]:
    register(HalfStep)  # here, not at import: the contract test lists algorithms at collection
    yield
    _registered.pop(HalfStep.name, None)


def test_a_plugin_method_runs_resumes_and_is_evaluated_and_generated_from(
    half_step: None, tmp_path: Path
) -> None:
    # Prepare
    cfg = tiny_config("fedit", "algorithm=half-step", "half-step.step=0.5", "fed.rounds=2")

    def die_in_round_2(client: str, task: str, rnd: int) -> None:
        if rnd == 2:
            raise Interrupt

    # Execute: one run straight through, one killed in round 2 and resumed
    full = quiet_runner(cfg, tmp_path / "full").run()
    with pytest.raises(Interrupt):
        quiet_runner(cfg, tmp_path / "cut", before_task=die_in_round_2).run()
    resumed = quiet_runner(cfg, tmp_path / "cut").run(resume=True)
    cli = CliRunner()
    evaluated = cli.invoke(app, ["eval", str(tmp_path / "cut")])
    generated = cli.invoke(
        app, ["generate", str(tmp_path / "cut"), "-p", "Define 'cat'.", "--max-new-tokens", "3"]
    )
    no_variant = cli.invoke(app, ["eval", str(tmp_path / "cut"), "--variant", "other"])

    # Assert
    assert stable(resumed) == stable(full)
    assert full[2]["train_loss"] is not None and full[2]["eval"]["perplexity"] > 0
    assert evaluated.exit_code == 0, evaluated.output
    eval_json = json.loads((tmp_path / "cut" / "eval.json").read_text())
    assert eval_json["metrics"]["perplexity"] == pytest.approx(full[-1]["eval"]["perplexity"], rel=1e-5)
    assert generated.exit_code == 0, generated.output
    assert ">>> Define 'cat'." in generated.output
    assert no_variant.exit_code == 2 and "no final-model variant 'other'" in no_variant.output


def test_a_plugin_method_reaches_no_fedtune_file_by_name() -> None:
    """Nothing in the runner, the final-model loading, the CLI, fl/ or eval/ names a method."""
    import re

    src = Path(__file__).resolve().parents[2] / "src" / "fedtune"
    places = [src / "runner.py", src / "artifacts.py", src / "cli.py", *(src / "fl").rglob("*.py")]
    places += list((src / "eval").rglob("*.py"))
    pattern = re.compile(r'"(fedit|fedavgm|fedbiot|fedpft|fedpt|fedmkt|perfit)"')
    named = [f"{p.relative_to(src)}:{m.group(0)}" for p in places for m in pattern.finditer(p.read_text())]
    assert named == []
