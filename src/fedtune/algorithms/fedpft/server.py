"""FedPFT's server: it holds the full model, derives and distils the client model, averages LoRA + head."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedtune.algorithms.adapters import fit_round_result
from fedtune.algorithms.base import Algorithm, RoundResult, derive_seed
from fedtune.algorithms.exporting import Exported
from fedtune.algorithms.fedpft.client import apoz, fit
from fedtune.algorithms.fedpft.config import FedPFTConfig
from fedtune.algorithms.fedpft.distill import distill_masks, public_batches
from fedtune.algorithms.fedpft.final import (
    INFO_FILE,
    TUNED_FILE,
    ClassifierModel,
    classification_result,
    export_classifier,
)
from fedtune.algorithms.fedpft.wire import (
    TUNED,
    Layout,
    apoz_counts_of,
    apoz_problem,
    apoz_spec,
    arrays_of,
    broadcast_parts,
    derive_client_model,
    emulator_outputs,
    emulator_parameters,
    fit_spec,
    layout_payload,
    output_norm_parameters,
    parameter_counts,
    part_payload,
    server_parameters,
    submodel_traffic,
    tuned_parameters,
    with_lora,
)
from fedtune.algorithms.final import FinalModel, FinalRun
from fedtune.config import ExperimentConfig
from fedtune.data.classify import (
    class_names,
    encode_classification,
)
from fedtune.data.loaders import load_public_set
from fedtune.data.records import DataError, Record
from fedtune.eval.evaluate import EvalResult, EvalSet
from fedtune.fl.broadcast import save_npz
from fedtune.fl.federation import ClientTask, Federation, ServerContext
from fedtune.fl.payload import Payload, arrays
from fedtune.models.loading import load_encoder_classifier
from fedtune.models.surgery import load_parameters
from fedtune.train.ffn_distill import aggregate_apoz, distill_ffns, neurons_to_freeze
from fedtune.units import BYTES_PER_MB

Models = tuple[Any, Any, Any]
"""(the full model + LoRA, the client model + LoRA, the tokenizer)."""


class FedPFT(Algorithm[FedPFTConfig]):
    name = "fedpft"
    Config = FedPFTConfig
    resends_after_restart = ("bytes_down", "submodel_sends", "submodel_mb_down")

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        self.global_state: dict[str, np.ndarray] = {}
        self.ffn_version = 1
        self.frozen_neurons: dict[int, np.ndarray] = {}
        self.broadcast = broadcast_parts(self.section.submodel == "ffn")
        self.layout: Layout | None = None
        self._models: Models | None = None
        self._public: list[dict[str, torch.Tensor]] = []
        self.distill_log: list[dict[str, float]] = []

    @classmethod
    def client_tasks(cls, cfg: ExperimentConfig) -> dict[str, ClientTask]:
        return {"fit": fit, "apoz": apoz}

    # ----------------------------------------------------------------- models
    def labels(self, records: list[Record]) -> list[str]:
        return class_names(self.cfg.data.dataset, records, self.section.labels)

    def _build(self, server: ServerContext) -> Models:
        """(full model + LoRA, client model + LoRA, tokenizer); the client model is the sub-model."""
        spec = self.server_model_spec()
        names = self.labels(list(server.eval_records))
        base, tokenizer = load_encoder_classifier(
            spec.name, len(names), dtype="fp32", device=spec.device, cache_dir=spec.cache_path, seed=spec.seed
        )
        client, self.layout = derive_client_model(base, self.section)
        self.broadcast = broadcast_parts(bool(self.layout.compressed))
        full = with_lora(base, self.cfg.lora, self.cfg.seed)
        client = with_lora(client, self.cfg.lora, self.cfg.seed)
        return full.eval(), client.eval(), tokenizer

    def server_models(self, server: ServerContext) -> Models:
        models: Models = server.resources.get("fedpft/server_models", lambda: self._build(server))
        self._models = models
        return models

    @property
    def models(self) -> Models:
        """The server's models (``server_models``), once ``setup`` has run."""
        if self._models is None:
            raise RuntimeError("fedpft: setup() must run first")
        return self._models

    def _distills(self) -> bool:
        """Whether the client model has compressed FFNs to distil (FedPFT with something removed)."""
        return self.layout is not None and bool(self.layout.compressed)

    def _distills_emulator(self) -> bool:
        """Whether FedOT's emulator is distilled before federated learning (Offsite-tuning's recipe; with
        ``distill_steps`` > 0, which `setup` checks for both distillations)."""
        section = self.section
        return section.submodel == "layerdrop" and section.emulator_distill

    def _load_tuned(self, model: Any, state: Mapping[str, np.ndarray], what: str) -> None:
        """``state`` into the full model, or into the client model (keys mapped by the layout)."""
        if self._models is not None and model is self._models[1]:
            load_parameters(tuned_parameters(model, self.layout), state, what)
            return
        # FedOT's LoRA covers only the emulator's layers: the dropped layers' LoRA stays at its
        # initialisation (B = 0), i.e. those layers run as pretrained.
        targets = tuned_parameters(model)
        load_parameters({k: p for k, p in targets.items() if k in state}, state, what)

    # ------------------------------------------------------------------ setup
    def setup(self, server: ServerContext) -> None:
        full, client, tokenizer = self.server_models(server)
        held = set(tuned_parameters(client, self.layout))
        self.global_state = {k: v for k, v in arrays_of(tuned_parameters(full)).items() if k in held}
        self._load_tuned(client, self.global_state, "initial state")
        self._public = self._public_batches(server.public_records, tokenizer)
        if (self._distills() or self._distills_emulator()) and self.section.distill_steps > 0:
            self._distill(self.section.distill_steps, "init", {})

    def _public_batches(self, public: list[Record], tokenizer: Any) -> list[dict[str, torch.Tensor]]:
        """The public set the distillations run on (``public_examples`` of it), batched."""
        section, data = self.section, self.cfg.data
        records = load_public_set(section.public_dataset, public, key="fedpft.public_dataset")
        if not records:
            raise DataError(
                f"fedpft distils the sub-model on a public set, but data.dataset {data.dataset!r} "
                "has no 'public' split; set fedpft.public_dataset to a built-in dataset with one"
            )
        return public_batches(
            records,
            tokenizer,
            max_length=data.max_length,
            batch_size=section.distill_batch_size,
            count=section.public_examples,
            seed=self.cfg.seed,
        )

    def _distill(self, steps: int, tag: int | str, frozen: Mapping[int, np.ndarray]) -> None:
        """``steps`` of eq. 13 on public batches, training the compressed layers' FFNs except ``frozen``
        neurons (eq. 14), and with ``distill_norms`` their FFN output norms; layers kept whole stay exact
        copies of the full model's."""
        full, client, _ = self.models
        layout = self.layout
        assert layout is not None
        rng = np.random.default_rng(derive_seed(self.cfg.seed, "distill", tag))
        order = rng.permutation(len(self._public))
        batches = [self._public[int(order[i % len(order)])] for i in range(steps)]
        if layout.compressed:  # FedPFT: the compressed FFNs, layer by layer (eq. 13)
            what: dict[str, Any] = {
                "grad_masks": distill_masks(client, layout.widths, layout.compressed, frozen),
                "mu": self.section.mu,
                "hidden_loss": self.section.hidden_loss,
                "extra_params": output_norm_parameters(client, layout.compressed) if layout.norms else None,
            }
        else:  # FedOT: the emulator's middle layers, on the middle block's output, Offsite-tuning's
            # normalised MSE (the squared error over the teacher's mean square: layer_relative)
            edge = self.section.edge_layers
            what = {
                "params": emulator_parameters(client, layout, edge),
                "compare": emulator_outputs(layout, edge),
                "mu": 0.0,
                "hidden_loss": "layer_relative",
            }
        start = time.perf_counter()
        stats = distill_ffns(
            full,
            client,
            batches,
            steps=steps,
            lr=self.section.distill_lr,
            schedule=self.section.distill_schedule,
            warmup_ratio=self.section.distill_warmup_ratio,
            **what,
        )
        self.distill_log.append(
            {
                "round": float(tag) if isinstance(tag, int) else 0.0,
                "steps": float(steps),
                "seconds": time.perf_counter() - start,
                "first_loss": stats.first_loss,
                "last_loss": stats.last_loss,
            }
        )

    # ------------------------------------------------------------------ round
    def message(self, client_id: str) -> Payload:
        """What a client is sent: the LoRA + head, the layout, and the parts it does not hold."""
        _, client, _ = self.models
        layout = self.layout
        assert layout is not None
        message: Payload = {TUNED + k: v for k, v in self.global_state.items()}
        message.update(layout_payload(layout))
        message.update(self.broadcast.message(client_id, lambda part: part_payload(part, client, layout)))
        return message

    def run_round(self, rnd: int, server: ServerContext, fed: Federation) -> RoundResult:
        self.server_models(server)
        sampled = self.sample_clients(fed, rnd)
        if "ffn" in self.broadcast.versions:
            self.broadcast.set_version("ffn", self.ffn_version)
        messages = {client: self.message(client) for client in sampled}
        sends, submodel_bytes = submodel_traffic(messages.values(), self.cfg.fed.wire_dtype)
        self.broadcast.delivered(sampled)
        spec = fit_spec(self.global_state, self.cfg.fed.norm_bound, fed.client_sizes)
        replies = fed.call(sampled, "fit", messages, timeout=self.cfg.fed.client_timeout, expect=spec)
        self.broadcast.forget_unanswered(sampled, replies)
        self.require_replies(replies, sampled, fed.traffic)
        weights = [int(r["num_examples"]) for r in replies.values()]
        tuned = [arrays(r, TUNED) for r in replies.values()]
        average = self.aggregate(tuned, weights, reference=self.global_state)
        self.global_state = {k: np.asarray(v, dtype=np.float32) for k, v in average.items()}
        extra = {
            "ffn_version": float(self.ffn_version),
            "submodel_sends": float(sends),
            "submodel_mb_down": submodel_bytes / BYTES_PER_MB,
        }
        if self._neuron_round(rnd):
            extra.update(self._neuron_distillation(rnd, sorted(replies), fed))
        return fit_round_result(sampled, replies, weights, extra)

    def _neuron_round(self, rnd: int) -> bool:
        every = self.section.neuron_every
        return (
            self._distills()
            and every > 0
            and self.section.neuron_steps > 0
            and rnd % every == 0
            and rnd < self.cfg.fed.rounds
        )

    def _apoz_positions(self, client_id: str, fed: Federation) -> int:
        """The most token positions ``client_id`` can count: the examples it samples (``apoz_examples``,
        at most its data) x ``data.max_length``; unbounded when neither is known."""
        known = [n for n in (self.section.apoz_examples, fed.client_sizes.get(client_id)) if n]
        return min(known) * self.cfg.data.max_length if known else 2**62

    def _neuron_distillation(self, rnd: int, clients: list[str], fed: Federation) -> dict[str, float]:
        """Eq. 14: the clients' APoZ picks the neurons to keep; the rest re-align on public data."""
        assert self.layout is not None
        messages = {client: self.message(client) for client in clients}
        spec = apoz_spec(self.layout)
        replies = fed.call(clients, "apoz", messages, timeout=self.cfg.fed.client_timeout, expect=spec)
        for client_id in list(replies):
            problem = apoz_problem(replies[client_id], self._apoz_positions(client_id, fed))
            if problem is not None:
                fed.traffic.rejected[client_id] = problem
                del replies[client_id]
        if not replies:
            return {"apoz_clients": 0.0}
        apoz = aggregate_apoz([apoz_counts_of(r) for r in replies.values()])
        self.frozen_neurons = neurons_to_freeze(apoz, self.section.freeze_fraction)
        full, client, _ = self.models
        self._load_tuned(full, self.global_state, "global state")
        self._load_tuned(client, self.global_state, "global state")
        self._distill(self.section.neuron_steps, rnd, self.frozen_neurons)
        self.ffn_version += 1
        return {
            "apoz_clients": float(len(replies)),
            "apoz_mean": float(np.mean([v.mean() for v in apoz.values()])),
            "distill_seconds": self.distill_log[-1]["seconds"],
        }

    # ------------------------------------------------------------------- eval
    def evaluate(self, rnd: int, server: ServerContext, fed: Federation, eval_set: EvalSet) -> EvalResult:
        """The LoRA + head plugged into the full model; ``sub/`` metrics: on the sub-model."""
        full, client, tokenizer = self.server_models(server)
        records = list(eval_set.records)
        names = self.labels(records)
        examples = server.resources.get(
            "fedpft/eval_examples",
            lambda: encode_classification(records, tokenizer, names, self.cfg.data.max_length),
        )
        batch_size, pad = self.cfg.eval.batch_size, int(tokenizer.pad_token_id or 0)
        results = []
        for model in (full, client):
            self._load_tuned(model, self.global_state, "global state")
            result = classification_result(
                model, examples, records, len(names), batch_size=batch_size, pad_token_id=pad
            )
            results.append(result)
        sub = {f"sub/{k}": v for k, v in results[1].metrics.items()}
        return EvalResult(metrics={**results[0].metrics, **sub}, by_category=results[0].by_category)

    # -------------------------------------------------------------- final model
    @classmethod
    def final_model(cls, run: FinalRun) -> FinalModel:
        """The full classifier with the final LoRA + head (it classifies; it does not generate)."""
        return ClassifierModel(run.cfg, run.run_dir)

    export_formats = ("merged",)

    @classmethod
    def export_final(cls, run: FinalRun, fmt: str, out: Path) -> Exported:
        """The classifier merged (LoRA into the weights, with the trained head): a transformers
        sequence-classification directory; not a causal LM, so neither peft nor GGUF."""
        return export_classifier(run.cfg, run.run_dir, out)

    def write_artifacts(self, directory: Path) -> None:
        """The final LoRA + head (keyed like the full model), the layout and the distillation log."""
        if self.layout is None:
            return
        directory.mkdir(parents=True, exist_ok=True)
        save_npz(directory / TUNED_FILE, self.global_state)
        info = {
            "algorithm": self.name,
            "base_model": self.cfg.model.name,
            "submodel": self.section.submodel,
            "layers": list(self.layout.layers),
            "widths": list(self.layout.widths),
            "ffn_version": self.ffn_version,
            "params": parameter_counts(*self._models[:2], self.layout) if self._models else {},
            "distillation": self.distill_log,
        }
        (directory / INFO_FILE).write_text(json.dumps(info, indent=1))

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "global_state": self.global_state,
            "ffn_version": self.ffn_version,
            "frozen_neurons": {str(k): v for k, v in self.frozen_neurons.items()},
            # Every distillation so far (its "seconds" is a wall-clock reading).
            "distill_log": [dict(entry) for entry in self.distill_log],
        }
        if self._models is not None:
            state["ffn"] = arrays_of(server_parameters(self._models[1], self.layout))
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if self._models is None:
            raise RuntimeError("fedpft: setup() must run before load_state_dict()")
        self.global_state = {k: np.asarray(v) for k, v in state["global_state"].items()}
        self.ffn_version = int(state["ffn_version"])
        self.frozen_neurons = {int(k): np.asarray(v) for k, v in state["frozen_neurons"].items()}
        # Replaces the log of setup()'s repeated initial distillation: each distillation is reported once.
        self.distill_log = [
            {k: float(v) for k, v in entry.items()} for entry in state.get("distill_log", self.distill_log)
        ]
        self.broadcast.reset()
        load_parameters(server_parameters(self._models[1], self.layout), state["ffn"], "checkpoint")
