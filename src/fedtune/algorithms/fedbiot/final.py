"""FedBiOT's final model: the final adapter plugged into the full model (AdapFu) or, as the variant
``adapemu``, on the final emulator (AdapEmu), built from the run's base model and its artifacts."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from fedtune.algorithms.fedbiot.config import FedBiOTConfig
from fedtune.algorithms.fedbiot.emulator import make_split
from fedtune.algorithms.fedbiot.wire import adapter_parameters, with_adapter_lora
from fedtune.algorithms.final import CausalLMModel, load_base_model
from fedtune.config import ExperimentConfig
from fedtune.fl.broadcast import load_npz, save_npz
from fedtune.models.surgery import build_emulator, load_layer_state, load_parameters, num_decoder_layers

ADAPTER_FILE = "fedbiot-adapter.npz"
"""The final adapter, keyed by original layer index."""
EMULATOR_FILE = "fedbiot-emulator.npz"
"""The final emulator's layers, keyed by original layer index."""
INFO_FILE = "fedbiot.json"
"""The split, the parameter counts, the initial distillation's statistics and the settings."""


def save_final(
    directory: Path,
    adapter: Mapping[str, np.ndarray],
    emulator: Mapping[str, np.ndarray],
    info: Mapping[str, Any],
) -> None:
    """The files ``load_final_fedbiot`` reads: the adapter, the emulator, the run's info."""
    directory.mkdir(parents=True, exist_ok=True)
    save_npz(directory / ADAPTER_FILE, adapter)
    save_npz(directory / EMULATOR_FILE, emulator)
    (directory / INFO_FILE).write_text(json.dumps(dict(info), indent=1))


def final_model(cfg: ExperimentConfig, run_dir: Path, variant: str | None) -> CausalLMModel:
    """AdapFu (``variant`` adapfu) or AdapEmu (adapemu) of a finished run, with the run's tokenizer."""
    base, tokenizer = load_base_model(cfg)
    return CausalLMModel(cfg, load_final_fedbiot(cfg, base, run_dir, variant == "adapemu"), tokenizer)


def load_final_fedbiot(cfg: Any, base: Any, run_dir: Path, emulator: bool) -> Any:
    """A finished run's final model built from ``base``: AdapFu (the adapter plugged into the full
    model) or, with ``emulator``, AdapEmu (the adapter on the final emulator)."""
    directory = run_dir / "artifacts"
    adapter_file = directory / ADAPTER_FILE
    if not adapter_file.is_file():
        raise FileNotFoundError(
            f"{adapter_file} is missing: did the run finish? (`fedtune resume {run_dir}`)"
        )
    section: FedBiOTConfig = cfg.section("fedbiot")
    split = make_split(section, num_decoder_layers(base))
    model = build_emulator(base, split) if emulator else base
    if section.adapter_mode == "lora":
        model = with_adapter_lora(model, split, cfg.lora, seed=cfg.seed, emulator=emulator)
    if emulator:
        emulator_file = directory / EMULATOR_FILE
        if not emulator_file.is_file():
            raise FileNotFoundError(f"{emulator_file} is missing (the run predates it): use --variant adapfu")
        state = load_npz(emulator_file)
        load_layer_state(model, state, split.emulator, split.emulator_positions(), what=str(emulator_file))
    params = adapter_parameters(model, split, section.adapter_mode, emulator=emulator)
    load_parameters(params, load_npz(adapter_file), "adapter")
    return model.eval()
