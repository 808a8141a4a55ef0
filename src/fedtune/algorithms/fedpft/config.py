"""FedPFT's config section (``fedpft:``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from fedtune.config import AlgorithmConfig


class FedPFTConfig(AlgorithmConfig):
    """FedPFT and its baselines: clients tune attention LoRA + a task head on a model the server derives.

    ``submodel``: ``ffn`` (FedPFT: every layer's FFN cut to its ``keep_ratio`` most salient neurons,
    ``keep_layers`` whole), ``full`` (FedPETuning: the full model), ``layerdrop`` (FedOT: the first and
    last ``edge_layers`` layers plus a uniform ``1 - drop`` share of the middle ones, whole). FedOT
    trains LoRA on the adapter (the ``edge_layers`` at each end) only, as Offsite-tuning;
    ``emulator_lora: true`` trains it on the emulator's layers too (a variant, not the baseline).
    FedOT's emulator is distilled (``emulator_distill``) with the same budget as FedPFT's layer-level
    distillation. ``distill_steps: 0`` is the ablation without layer-level distillation (FedOT: an
    undistilled emulator, as ``emulator_distill: false``), ``neuron_every: 0`` the one without
    neuron-level distillation.
    """

    modes = ("federated", "centralized")
    quantization_refused = (
        "its clients train a sequence classifier (an encoder or a decoder with a task head) that the "
        "server prunes from the full model and sends over the wire, which bitsandbytes cannot quantise "
        "on load"
    )

    submodel: Literal["ffn", "full", "layerdrop"] = "ffn"
    """`ffn`: FedPFT; `full`: FedPETuning; `layerdrop`: FedOT."""
    keep_ratio: float = Field(0.25, gt=0, le=1)
    """Share of each FFN's neurons the sub-model keeps."""
    keep_layers: list[int] = Field(default_factory=lambda: [0, -1])
    """Layers whose FFN is kept whole."""
    drop: float = Field(0.5, ge=0, lt=1)
    """`layerdrop`: share of the middle layers dropped."""
    edge_layers: int = Field(1, ge=0)
    """`layerdrop`: adapter layers at each end (where FedOT's LoRA trains)."""
    emulator_lora: bool = False
    """`layerdrop`: also train LoRA on the emulator's layers (a variant)."""
    emulator_distill: bool = True
    """`layerdrop`: distil the emulator before federated learning, as Offsite-tuning builds it: its
    middle layers (between the adapters) train so that their output matches the full model's middle
    block's (Offsite-tuning's normalised MSE), with the layer-level distillation's budget
    (`distill_steps`, `distill_lr`, its schedule, the public set); `false`: the layer-dropped emulator
    as cut (an ablation)."""
    labels: list[str] | None = None
    """Class names (default: the records' choices or a built-in set's categories)."""
    # Layer-level distillation (eq. 13) before federated learning, on public data.
    distill_steps: int = Field(100, ge=0)
    distill_lr: float = Field(1e-4, gt=0)
    """Learning rate of the layer-level distillation (AdamW)."""
    distill_batch_size: int = Field(8, ge=1)
    """Public examples per distillation step."""
    mu: float = Field(0.0, ge=0)
    """Weight of eq. 13's FFN product term."""
    # ``mse``: eq. 13's hidden-state MSE; ``token_relative``: each position's error relative to the
    # full model's norm there (for decoders, whose first token carries huge activations);
    # ``layer_relative``: each layer's error relative to the full model's scale there (the authors' code).
    hidden_loss: Literal["mse", "token_relative", "layer_relative"] = "mse"
    # Each distillation's (layer- and neuron-level) learning rate: linear warmup over
    # ``distill_warmup_ratio`` of its steps, then constant or cosine decay to 0.
    distill_schedule: Literal["constant", "cosine"] = "constant"
    distill_warmup_ratio: float = Field(0.0, ge=0, lt=1)
    """Share of each distillation's steps spent warming up its learning rate."""
    # Train the compressed layers' FFN output LayerNorm with their FFN (the authors' code does): BERT's
    # ``output.LayerNorm``, Gemma-3's ``post_feedforward_layernorm``; re-sent with the FFNs.
    distill_norms: bool = False
    public_dataset: str | None = None
    """The built-in dataset whose public split is distilled on (default: the training dataset's; `all`: every
    built-in dataset's public split, a general corpus)."""
    public_examples: int | None = Field(512, ge=1)
    """Public examples used."""
    # Neuron-level distillation (eq. 14) every ``neuron_every`` rounds (0: never).
    neuron_every: int = Field(10, ge=0)
    freeze_fraction: float = Field(0.5, ge=0, le=1)
    """Share of neurons frozen (the most active on client data)."""
    neuron_steps: int = Field(50, ge=0)
    """Steps of each neuron-level distillation."""
    apoz_examples: int | None = Field(64, ge=1)
    """Examples per client for the APoZ statistics."""
    client_cache: Literal["auto", "memory", "disk"] = "auto"
    """Where clients keep the received sub-model: `auto` = disk on Flower, memory in simulation."""

    # The LoRA + head are aggregated through Algorithm.aggregate; the layer-level distillation uses
    # public data. The neuron-level one does not qualify (``dp_problem``).
    dp_refused = None

    def dp_problem(self) -> str | None:
        if self.neuron_every > 0 and self.neuron_steps > 0:
            return (
                "fedpft.neuron_every > 0: the neuron-level distillation picks the neurons to freeze from "
                "the clients' APoZ counts on their own data, which travel outside the protected sum; set "
                "fedpft.neuron_every: 0 (the ablation without neuron-level distillation)"
            )
        return None

    @model_validator(mode="after")
    def _fedot_has_an_adapter(self) -> FedPFTConfig:
        if self.submodel == "layerdrop" and self.edge_layers == 0 and not self.emulator_lora:
            raise ValueError(
                "fedpft.edge_layers 0 leaves FedOT no adapter layer to train: "
                "set edge_layers >= 1 or emulator_lora: true"
            )
        if self.labels is not None and len(self.labels) < 2:
            raise ValueError(
                "fedpft.labels names the classes in order: give two or more, or leave it out to read them "
                "from the dataset"
            )
        return self
