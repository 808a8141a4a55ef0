"""A run's exported model names its base model so another machine can find it, carries a card written
from the run, and its files get the umask's mode (safetensors writes them 0600)."""

from __future__ import annotations

import json
import os
import stat
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml
from safetensors.numpy import save_file

from fedtune.config import ExperimentConfig, ModelConfig, load_config
from fedtune.files import current_umask, honour_umask
from fedtune.modelcard import base_model_of, model_card, save_peft_adapter
from tests.conftest import TINY_CONFIG


@pytest.fixture
def umask_022() -> Iterator[None]:
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def test_a_zoo_model_is_named_by_its_hub_id(tmp_path: Path) -> None:
    # Execute: a cache without the model (no fetch happens)
    base = base_model_of(ModelConfig(name="smollm2-135m-instruct", cache_dir=str(tmp_path)))

    # Assert
    assert base.hub_id == base.reference == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert base.local_path is None and "GGUF" in base.note


def test_hub_ids_local_directories_and_tiny_models_are_named_as_they_load(tmp_path: Path) -> None:
    assert base_model_of(ModelConfig(name="Qwen/Qwen2.5-0.5B")).reference == "Qwen/Qwen2.5-0.5B"
    local = base_model_of(ModelConfig(name=str(tmp_path)))
    assert local.hub_id is None and local.reference == str(tmp_path.resolve())
    tiny = base_model_of(ModelConfig(name="tiny-llama"))
    assert tiny.hub_id is None and tiny.local_path is None and tiny.reference == "tiny-llama"


def test_a_safetensors_file_gets_the_mode_a_plain_write_gives(tmp_path: Path, umask_022: None) -> None:
    # Prepare: safetensors writes through a 0600 temporary file
    save_file({"weight": np.zeros(3, dtype=np.float32)}, str(tmp_path / "adapter_model.safetensors"))
    (tmp_path / "plain.json").write_text("{}")

    # Execute
    honour_umask(tmp_path)

    # Assert: both as a plain write under umask 022
    assert current_umask() == 0o022
    for name in ("adapter_model.safetensors", "plain.json"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o644


def _finished_run(run_dir: Path, cfg: ExperimentConfig) -> Path:
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.to_yaml_dict(), sort_keys=False))
    rows = [
        {"round": 0, "eval": {"rougeL": 0.1, "perplexity": 30.0}},
        {"round": 1, "train_loss": 2.0},
        {"round": 2, "train_loss": 1.5, "eval": {"rougeL": 0.25, "perplexity": 12.5}},
    ]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return run_dir


def test_the_card_says_method_base_data_rounds_metrics_and_config(tmp_path: Path) -> None:
    # Prepare
    cfg = load_config(TINY_CONFIG, ["model.name=smollm2-135m-instruct", f"model.cache_dir={tmp_path}"])
    run_dir = _finished_run(tmp_path / "run", cfg)

    # Execute
    card = model_card(run_dir, cfg, "peft")

    # Assert
    assert card.startswith("---\nbase_model: HuggingFaceTB/SmolLM2-135M-Instruct\nlibrary_name: peft\n")
    assert "the method **fedit**: 2 of 2 rounds, 4 clients (federated), seed 0" in card
    assert 'AutoModelForCausalLM.from_pretrained("HuggingFaceTB/SmolLM2-135M-Instruct")' in card
    assert "training data: `wordnet-instruct`" in card and "partition: `pathological` over 4 clients" in card
    assert "## Final metrics (round 2)" in card and "| perplexity | 30 | 12.5 |" in card
    assert "```yaml\nname: fedit-tiny\n" in card


def test_a_merged_card_loads_with_transformers_alone(tmp_path: Path) -> None:
    cfg = load_config(TINY_CONFIG, [])
    card = model_card(_finished_run(tmp_path / "run", cfg), cfg, "merged")
    assert "library_name: transformers" in card and "base_model:" not in card
    assert 'AutoModelForCausalLM.from_pretrained("path/to/this/directory")' in card


def test_a_saved_adapter_names_its_base_and_asks_no_hub(tmp_path: Path) -> None:
    from fedtune.config import LoraConfig
    from fedtune.models.loading import load_causal_lm
    from fedtune.models.lora import build_lora

    # Prepare: a tiny LoRA model named after a zoo model (whose hub id peft's "auto" would look up)
    model, _ = load_causal_lm("tiny-llama")
    lora = build_lora(model, LoraConfig(r=2, alpha=4), seed=0)
    base = base_model_of(ModelConfig(name="smollm2-135m-instruct", cache_dir=str(tmp_path)))

    # Execute: offline, any warning (peft's "Could not find a config file") fails the test
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        save_peft_adapter(lora, tmp_path / "adapter", base)

    # Assert
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
