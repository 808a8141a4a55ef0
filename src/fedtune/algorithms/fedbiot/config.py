"""FedBiOT's config section (``fedbiot:``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from fedtune.config import AlgorithmConfig, ExperimentConfig


class FedBiOTConfig(AlgorithmConfig):
    """FedBiOT and its baselines: clients tune an adapter on top of a layer-dropped emulator.

    ``split: last`` is FedBiOT's LayerExtract (adapter = the last ``adapter_layers`` layers);
    ``split: first_last`` is Offsite-tuning's / FedOT's (half of ``adapter_layers`` first, half last).
    ``align_steps: 0`` keeps the emulator fixed after the initial distillation (Offsite-tuning, FedOT).
    """

    modes = ("federated", "centralized")  # centralized: Offsite-tuning (one client, all data)
    # The adapter is aggregated through Algorithm.aggregate; the emulator aligns on public data only.
    dp_refused = None
    quantization_refused = (
        "a client's emulator is built from the weights the server sends (and re-aligns every round), "
        "not loaded from a checkpoint that bitsandbytes could quantise, and the server distils the "
        "emulator's full layers against the full model"
    )

    split: Literal["last", "first_last"] = "last"
    """`last`: FedBiOT's adapter; `first_last`: Offsite-tuning's and FedOT's."""
    adapter_layers: int = Field(2, ge=1)
    """Layers in the adapter."""
    dropout: float = Field(0.2, ge=0, lt=1)
    """Share of the non-adapter layers the emulator drops."""
    adapter_mode: Literal["full", "lora"] = "full"
    """Train the adapter layers whole (`full`) or LoRA on them."""
    prox_eps: float = Field(0.5, ge=0)
    """The clients' proximal term eps."""
    align_lambda: float = Field(0.5, ge=0)
    """Weight of the KL term in the emulator alignment."""
    kl_order: Literal["emulator_first", "full_first"] = "emulator_first"
    """The alignment's KL order: `emulator_first` = eq. 2's KL(M(x; A, E) || M(x; A, E*)), the emulator
    model's distribution first; `full_first` = the usual distillation order KL(full || emulator), an
    ablation (and what runs before this key existed used)."""
    align_lm: float = Field(0.0, ge=0)
    """Weight of a next-token cross-entropy term of the emulator model on the public batches, beside
    eq. 2's terms: Offsite-tuning distils its emulator with LM 1 + KD 30 (its scripts), i.e. ``1/30``
    beside the normalised MSE (with ``align_lambda: 0``); 0 (the default): eq. 2 alone."""
    init_steps: int = Field(50, ge=0)
    """Emulator distillation steps before training (I_0)."""
    align_steps: int = Field(10, ge=0)
    """Alignment steps every round (0: the emulator stays fixed)."""
    align_batch_size: int = Field(4, ge=1)
    """Public examples per alignment step."""
    align_optimizer: Literal["sgd", "adamw"] = "sgd"
    """The alignment's optimizer."""
    align_lr: float = Field(1e-3, gt=0)
    """The alignment's learning rate."""
    align_clip_norm: float | None = Field(1.0, gt=0)
    """Gradient clipping of the alignment (its optimizer persists across rounds)."""
    public_dataset: str | None = None
    """The built-in dataset whose public split the emulator is aligned on (default: the training
    dataset's)."""
    public_examples: int | None = Field(512, ge=1)
    """Public examples used."""
    client_cache: Literal["auto", "memory", "disk"] = "auto"
    """Where clients keep received weights: `auto` = disk on Flower, memory in simulation."""
    # A directory shared by runs: the initial emulator distillation is kept there under the
    # fingerprint of the settings it depends on, and reused by any run with the same settings.
    init_cache: str | None = None

    @model_validator(mode="after")
    def _check_split(self) -> FedBiOTConfig:
        if self.split == "first_last" and self.adapter_layers % 2:
            raise ValueError(
                "fedbiot.adapter_layers must be even with split first_last (half first, half last)"
            )
        return self


def init_fingerprint(cfg: ExperimentConfig) -> dict[str, Any]:
    """The settings the initial emulator distillation depends on: the key it is cached under."""
    section: FedBiOTConfig = cfg.section("fedbiot")
    return {
        "model": cfg.model.name,
        "seed": cfg.seed,
        "split": section.split,
        "adapter_layers": section.adapter_layers,
        "dropout": section.dropout,
        "adapter_mode": section.adapter_mode,
        "init_steps": section.init_steps,
        "align_lambda": section.align_lambda,
        # Without a KL term the order changes nothing: FedOT's and Offsite-tuning's caches stay valid.
        **({"kl_order": section.kl_order} if section.align_lambda > 0 else {}),
        **({"align_lm": section.align_lm} if section.align_lm > 0 else {}),  # older caches stay valid
        "align_optimizer": section.align_optimizer,
        "align_lr": section.align_lr,
        "align_batch_size": section.align_batch_size,
        "public_dataset": section.public_dataset or cfg.data.dataset,
        "public_examples": section.public_examples,
        "max_length": cfg.data.max_length,
        "template": cfg.data.template,
    }
