"""experiments/fedpt_table.py: what defines a method wins over ``--set``."""

from __future__ import annotations

from experiments import fedpt_table

from tests.integration.helpers import ROOT


def test_fedavg_large_stays_on_the_large_model_when_set_changes_the_small_one() -> None:
    from fedtune.config import load_config

    config = ROOT / "configs" / "paper" / "fedpt-smollm2.yaml"
    extra = ["model.name=smollm2-135m-instruct-l20"]
    cfg = load_config(config, extra)
    models = {
        method: load_config(config, fedpt_table.run_overrides(method, cfg, extra)).model.name
        for method in ("fedavg_large", "fedavg_small", "fedpt")
    }

    assert models["fedavg_large"] == cfg.fedpt.large_model == "smollm2-135m-instruct"
    assert models["fedavg_small"] == models["fedpt"] == "smollm2-135m-instruct-l20"
