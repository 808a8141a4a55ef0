"""experiments/fedpt_table.py: what defines a method wins over ``--set``."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
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


def test_small_model_study_runs_each_client_model_and_measures_fedpt_against_fedavg_large(
    tmp_path: Path,
) -> None:
    config = ROOT / "configs" / "test" / "fedpt-tiny.yaml"
    argv = [str(config), "--runs-dir", str(tmp_path / "runs"), "--results-dir", str(tmp_path / "results")]
    argv += ["--small-models", "tiny-llama", "tiny-llama-L4-H64", "--set", "fed.rounds=1"]
    fedpt_table.main(argv)
    runs = tmp_path / "runs"
    # the config's own small model under the table's directory, the large one under <name>-l<layers>
    assert (runs / "fedpt-tiny" / "fedpt" / "metrics.jsonl").is_file()
    saved = yaml.safe_load((runs / "fedpt-tiny-l4" / "fedavg_small" / "config.yaml").read_text())
    assert saved["model"]["name"] == "tiny-llama-L4-H64" and saved["algorithm"] == "fedit"
    results = json.loads((tmp_path / "results" / "study-small-fedpt-tiny.json").read_text())["results"]
    small, large = results["tiny-llama"], results["tiny-llama-L4-H64"]
    assert (small["layers"], large["layers"]) == (2, 4)
    gap = small["fedpt"]["rougeL"] - large["fedavg_small"]["rougeL"]
    text = (tmp_path / "results" / "study-small-fedpt-tiny.md").read_text()
    assert f"| {gap:+.4f} |" in text
    assert (tmp_path / "results" / "study-small-fedpt-tiny.png").read_bytes().startswith(b"\x89PNG")
