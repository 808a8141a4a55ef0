"""The FedPFT algorithm class: server setup and rounds, the client tasks, evaluation, state."""

from __future__ import annotations

import copy
import functools
import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedtune.algorithms.adapters import fit_round_result
from fedtune.algorithms.base import Algorithm, RoundResult, derive_seed
from fedtune.algorithms.fedpft.config import FedPFTConfig
from fedtune.algorithms.fedpft.final import TUNED_FILE, ClassifierModel, classification_result
from fedtune.algorithms.fedpft.parts import (
    Layout,
    arrays_of,
    count,
    distilled_parameters,
    ffn_parameters,
    frozen_parameters,
    model_params,
    tuned_parameters,
    with_lora,
)
from fedtune.algorithms.final import FinalModel, check_options, check_variant
from fedtune.algorithms.local import REPLY_SCALARS, fit_reply, train_selected
from fedtune.config import ExperimentConfig
from fedtune.data.classify import (
    ClassExample,
    class_names,
    classification_batches,
    classification_loss,
    encode_classification,
    encode_text,
)
from fedtune.data.loaders import load_dataset_records
from fedtune.data.records import DataError, Record
from fedtune.eval.evaluate import EvalResult, EvalSet
from fedtune.fl.aggregate import weighted_average
from fedtune.fl.broadcast import (
    ClientCacheMiss,
    VersionedBroadcast,
    client_cache_mode,
    receive_part,
    save_npz,
    version_key,
)
from fedtune.fl.federation import ClientContext, ClientTask, Federation, ServerContext
from fedtune.fl.payload import Payload, arrays, payload_nbytes, to_wire
from fedtune.fl.validation import ReplySpec
from fedtune.models.derive import truncate_layers
from fedtune.models.ffn import build_submodel, ffn_layers, resize_ffn, select_neurons
from fedtune.models.ffn import ffn_parameters as ffn_module_parameters
from fedtune.models.ffn_distill import (
    aggregate_apoz,
    apoz_counts,
    distill_ffns,
    ffn_grad_masks,
    neurons_to_freeze,
)
from fedtune.models.loading import load_encoder_classifier, resolve_device
from fedtune.models.surgery import load_parameters, num_decoder_layers, uniform_drop, unwrap
from fedtune.train.sft import epochs_started
from fedtune.units import BYTES_PER_MB

TUNED = "tuned/"
FROZEN = "frozen/"
FFN = "ffn/"
LAYOUT = "layout/"
APOZ = "apoz/"


def layout_payload(layout: Layout) -> Payload:
    return {
        LAYOUT + "num_layers": layout.num_layers,
        LAYOUT + "layers": np.asarray(layout.layers, dtype=np.int32),
        LAYOUT + "widths": np.asarray(layout.widths, dtype=np.int32),
        LAYOUT + "compressed": np.asarray(layout.compressed, dtype=np.int32),
        **({} if layout.tuned is None else {LAYOUT + "tuned": np.asarray(layout.tuned, dtype=np.int32)}),
    }


def layout_from(msg: Payload) -> Layout:
    def ints(key: str) -> tuple[int, ...]:
        return tuple(int(i) for i in np.asarray(msg[LAYOUT + key]).tolist())

    tuned = ints("tuned") if LAYOUT + "tuned" in msg else None
    return Layout(int(msg[LAYOUT + "num_layers"]), ints("layers"), ints("widths"), ints("compressed"), tuned)


def adapter_layers(num_layers: int, edge: int) -> tuple[int, ...]:
    """FedOT's adapter: the first and last ``edge`` layers."""
    return tuple(sorted(set(range(edge)) | set(range(num_layers - edge, num_layers))))


def kept_layers(num_layers: int, edge: int, drop: float) -> tuple[int, ...]:
    """FedOT's emulator layers: the first and last ``edge`` layers whole, a uniform share of the rest."""
    middle = list(range(edge, num_layers - edge))
    return tuple(sorted(set(adapter_layers(num_layers, edge)) | set(uniform_drop(middle, drop))))


class FedPFT(Algorithm[FedPFTConfig]):
    name = "fedpft"
    Config = FedPFTConfig
    resends_after_restart = ("bytes_down", "submodel_sends", "submodel_mb_down")

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        self.global_state: dict[str, np.ndarray] = {}
        self.ffn_version = 1
        self.frozen_neurons: dict[int, np.ndarray] = {}
        self.broadcast = self._broadcast(self.section.submodel == "ffn")
        self.layout: Layout | None = None
        self._models: tuple[Any, Any, Any] | None = None
        self._public: list[dict[str, torch.Tensor]] = []
        self.distill_log: list[dict[str, float]] = []

    # ----------------------------------------------------------------- models
    def labels(self, records: list[Record]) -> list[str]:
        return class_names(self.cfg.data.dataset, records, self.section.labels)

    def _build(self, server: ServerContext) -> tuple[Any, Any, Any]:
        """(full model + LoRA, client model + LoRA, tokenizer); the client model is the sub-model."""
        spec = self.server_model_spec()
        names = self.labels(list(server.eval_records))
        base, tokenizer = load_encoder_classifier(
            spec.name, len(names), dtype="fp32", device=spec.device, cache_dir=spec.cache_path, seed=spec.seed
        )
        section = self.section
        n = num_decoder_layers(base)
        tuned: tuple[int, ...] | None = None
        if section.submodel == "ffn":
            client = build_submodel(base, select_neurons(base, section.keep_ratio, section.keep_layers))
            layers = tuple(range(n))
        elif section.submodel == "layerdrop":
            layers = kept_layers(n, section.edge_layers, section.drop)
            client = truncate_layers(base, list(layers))
            if not section.emulator_lora:  # Offsite-tuning: only the adapter at both ends trains
                tuned = adapter_layers(n, section.edge_layers)
        else:
            client, layers = copy.deepcopy(base), tuple(range(n))
        widths = tuple(ffn.width for ffn in ffn_layers(client))
        full_widths = {ffn.layer: ffn.width for ffn in ffn_layers(base)}
        compressed = tuple(pos for pos, layer in enumerate(layers) if widths[pos] < full_widths[layer])
        self.layout = Layout(n, layers, widths, compressed, tuned)
        self.broadcast = self._broadcast(bool(compressed))
        lora = self.cfg.lora
        full = with_lora(base, lora.r, lora.alpha, lora.dropout, self.cfg.seed)
        client = with_lora(client, lora.r, lora.alpha, lora.dropout, self.cfg.seed)
        return full.eval(), client.eval(), tokenizer

    @staticmethod
    def _broadcast(distilled: bool) -> VersionedBroadcast:
        """Only a compressed sub-model changes after setup (its compressed FFNs, by the distillations):
        without one, no "ffn" part travels."""
        broadcast = VersionedBroadcast(("frozen", "ffn") if distilled else ("frozen",))
        broadcast.set_version("frozen", 1)
        return broadcast

    def _distills(self) -> bool:
        """Whether the client model has compressed FFNs to distil (FedPFT with something removed)."""
        return self.layout is not None and bool(self.layout.compressed)

    def server_models(self, server: ServerContext) -> tuple[Any, Any, Any]:
        models: tuple[Any, Any, Any] = server.resources.get(
            "fedpft/server_models", lambda: self._build(server)
        )
        self._models = models
        return models

    def _load_tuned(self, model: Any, state: Mapping[str, np.ndarray], what: str) -> None:
        """``state`` into the full model, or into the client model (keys mapped by the layout)."""
        if self._models is not None and model is self._models[1]:
            self._load(tuned_parameters(model, self.layout), state, what)
            return
        # FedOT's LoRA covers only the emulator's layers: the dropped layers' LoRA stays at its
        # initialisation (B = 0), i.e. those layers run as pretrained.
        targets = tuned_parameters(model)
        self._load({k: p for k, p in targets.items() if k in state}, state, what)

    # ------------------------------------------------------------------ setup
    def _public_batches(self, server: ServerContext, tokenizer: Any) -> list[dict[str, torch.Tensor]]:
        section = self.section
        records = (
            load_dataset_records(section.public_dataset, "public")
            if section.public_dataset
            else list(server.public_records)
        )
        if not records:
            raise DataError(
                f"fedpft distils the sub-model on a public set, but data.dataset {self.cfg.data.dataset!r} "
                "has no 'public' split; set fedpft.public_dataset to a built-in dataset with one"
            )
        if section.public_examples is not None and len(records) > section.public_examples:
            rng = np.random.default_rng([self.cfg.seed, 0xFF])
            records = [
                records[i] for i in sorted(rng.choice(len(records), section.public_examples, replace=False))
            ]
        # Public records need no class: distillation reads only the texts.
        max_length = self.cfg.data.max_length
        examples = [ClassExample(encode_text(r, tokenizer, max_length), 0) for r in records]
        return classification_batches(
            examples, section.distill_batch_size, int(tokenizer.pad_token_id or 0), seed=self.cfg.seed
        )

    def _distill_batches(self, steps: int, tag: int | str) -> list[dict[str, torch.Tensor]]:
        order = np.random.default_rng(derive_seed(self.cfg.seed, "distill", tag)).permutation(
            len(self._public)
        )
        return [self._public[int(order[i % len(order)])] for i in range(steps)]

    def _distill(self, steps: int, tag: int | str, frozen: Mapping[int, np.ndarray]) -> None:
        """``steps`` of eq. 13 on public batches, training the compressed layers' FFNs except ``frozen``
        neurons (eq. 14); layers kept whole stay exact copies of the full model's."""
        full, client, _ = self._models  # type: ignore[misc]
        assert self.layout is not None
        compressed = self.layout.compressed
        masks = ffn_grad_masks(client, {pos: np.asarray(frozen.get(pos, []), np.int64) for pos in compressed})
        # A layer kept whole trains nothing, not even its output bias (shared by every neuron).
        whole = [pos for pos in range(len(self.layout.widths)) if pos not in compressed]
        untouched = set(ffn_module_parameters(unwrap(client), whole))
        masks = {name: torch.zeros_like(m) if name in untouched else m for name, m in masks.items()}
        start = time.perf_counter()
        stats = distill_ffns(
            full,
            client,
            self._distill_batches(steps, tag),
            steps=steps,
            lr=self.section.distill_lr,
            mu=self.section.mu,
            grad_masks=masks,
            hidden_loss=self.section.hidden_loss,
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

    def setup(self, server: ServerContext) -> None:
        full, client, tokenizer = self.server_models(server)
        held = set(tuned_parameters(client, self.layout))
        self.global_state = {k: v for k, v in arrays_of(tuned_parameters(full)).items() if k in held}
        self._load_tuned(client, self.global_state, "initial state")
        self._public = self._public_batches(server, tokenizer)
        if self._distills() and self.section.distill_steps > 0:
            self._distill(self.section.distill_steps, "init", {})

    # ------------------------------------------------------------------ round
    def _message(self, client_id: str) -> Payload:
        assert self.layout is not None
        message: Payload = {TUNED + k: v for k, v in self.global_state.items()}
        message.update(layout_payload(self.layout))
        message.update(self.broadcast.message(client_id, self._wire_part))
        return message

    def _wire_part(self, part: str) -> Payload:
        _, client, _ = self._models  # type: ignore[misc]
        assert self.layout is not None
        if part == "frozen":
            entries: Payload = {
                FROZEN + k: v for k, v in arrays_of(frozen_parameters(client, self.layout)).items()
            }
            entries["arch"] = unwrap(client).config.to_json_string(use_diff=False)
            return entries
        return {FFN + k: v for k, v in arrays_of(distilled_parameters(client, self.layout)).items()}

    def run_round(self, rnd: int, server: ServerContext, fed: Federation) -> RoundResult:
        self.server_models(server)
        sampled = fed.sample(self.clients_per_round(fed), rnd)
        if "ffn" in self.broadcast.versions:
            self.broadcast.set_version("ffn", self.ffn_version)
        messages = {client: self._message(client) for client in sampled}
        sent = [m for m in messages.values() if any(k.startswith((FFN, FROZEN)) for k in m)]
        submodel_bytes = sum(
            payload_nbytes(
                to_wire({k: v for k, v in m.items() if k.startswith((FFN, FROZEN))}, self.cfg.fed.wire_dtype)
            )
            for m in sent
        )
        self.broadcast.delivered(sampled)
        spec = ReplySpec.like(
            {TUNED + k: v for k, v in self.global_state.items()},
            scalars=REPLY_SCALARS,
            norm_bound=self.cfg.fed.norm_bound,
            example_limits=fed.client_sizes,
        )
        replies = fed.call(sampled, "fit", messages, timeout=self.cfg.fed.client_timeout, expect=spec)
        for client in sampled:
            if client not in replies:
                self.broadcast.forget(client)
        self.require_replies(replies, sampled, fed.traffic)
        weights = [int(r["num_examples"]) for r in replies.values()]
        average = weighted_average([arrays(r, TUNED) for r in replies.values()], weights)
        self.global_state = {k: np.asarray(v, dtype=np.float32) for k, v in average.items()}
        extra = {
            "ffn_version": float(self.ffn_version),
            "submodel_sends": float(len(sent)),
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

    def _neuron_distillation(self, rnd: int, clients: list[str], fed: Federation) -> dict[str, float]:
        """Eq. 14: the clients' APoZ picks the neurons to keep; the rest re-align on public data."""
        assert self.layout is not None
        template = {f"{APOZ}{pos}": np.zeros(w, np.float32) for pos, w in enumerate(self.layout.widths)}
        spec = ReplySpec.like(template, scalars={"positions": int}, reference=False)
        messages = {client: self._message(client) for client in clients}
        replies = fed.call(clients, "apoz", messages, timeout=self.cfg.fed.client_timeout, expect=spec)
        if not replies:
            return {"apoz_clients": 0.0}
        counts = [
            {int(k): (np.asarray(v), int(r["positions"])) for k, v in arrays(r, APOZ).items()}
            for r in replies.values()
        ]
        apoz = aggregate_apoz(counts)
        self.frozen_neurons = neurons_to_freeze(apoz, self.section.freeze_fraction)
        full, client, _ = self._models  # type: ignore[misc]
        self._load_tuned(full, self.global_state, "global state")
        self._load_tuned(client, self.global_state, "global state")
        self._distill(self.section.neuron_steps, rnd, self.frozen_neurons)
        self.ffn_version += 1
        return {
            "apoz_clients": float(len(replies)),
            "apoz_mean": float(np.mean([v.mean() for v in apoz.values()])),
            "distill_seconds": self.distill_log[-1]["seconds"],
        }

    # ----------------------------------------------------------------- client
    def client_tasks(self) -> dict[str, ClientTask]:
        return {"fit": self._fit, "apoz": self._apoz}

    def _client_cache(self) -> str:
        return client_cache_mode(
            str(self.section.client_cache), getattr(self.cfg.fed, "backend", "simulation")
        )

    def _client_model(self, ctx: ClientContext, msg: Payload, layout: Layout) -> Any:
        """The client's model: built from the architecture and FFN widths it was sent, weights as received."""
        holder: dict[str, Any] = ctx.resources.get("fedpft/client", dict)
        disk = self._client_cache() == "disk"
        arch_file = ctx.workdir / "fedpft-cache" / "arch.json"
        arch = msg.get("arch")
        if arch is not None and disk:
            arch_file.parent.mkdir(parents=True, exist_ok=True)
            arch_file.write_text(str(arch))
        if arch is None and "model" not in holder and disk and arch_file.is_file():
            arch = arch_file.read_text()
        key = (arch, layout)
        if arch is not None and holder.get("key") != key:
            holder.clear()
            holder.update(key=key, model=self._model_from_arch(ctx, str(arch), layout), versions={})
        if "model" not in holder:
            raise ClientCacheMiss(f"client {ctx.client_id} holds no sub-model and was not sent one")
        model = holder["model"]
        for part, prefix, select in (
            ("frozen", FROZEN, frozen_parameters),
            ("ffn", FFN, distilled_parameters),
        ):
            if version_key(part) not in msg:
                continue
            targets = select(model, layout)
            receive_part(
                msg,
                part,
                prefix,
                holder["versions"],
                functools.partial(self._load, targets),
                cache_file=ctx.workdir / "fedpft-cache" / f"{part}.npz" if disk else None,
                client=ctx.client_id,
            )
        return model

    @staticmethod
    def _load(targets: Mapping[str, torch.nn.Parameter], state: Mapping[str, np.ndarray], what: str) -> None:
        load_parameters(targets, state, what)

    def _model_from_arch(self, ctx: ClientContext, arch: str, layout: Layout) -> Any:
        from transformers import AutoConfig, AutoModelForSequenceClassification

        spec = json.loads(arch)
        config = AutoConfig.for_model(spec.pop("model_type"), **spec)
        # Built at the narrowest width, then each FFN resized to its own: a client never allocates
        # (let alone receives) a compressed layer's full FFN.
        config.intermediate_size = min(layout.widths)
        torch.manual_seed(0)
        model = AutoModelForSequenceClassification.from_config(config)
        resize_ffn(model, dict(enumerate(layout.widths)))
        lora = self.cfg.lora
        model = with_lora(model, lora.r, lora.alpha, lora.dropout, self.cfg.seed)
        model.to(resolve_device(self.client_model_spec(ctx.client_id).device))
        return model.eval()

    def _examples(self, ctx: ClientContext) -> tuple[list[ClassExample], int]:
        tokenizer = ctx.resources.tokenizer(self.client_model_spec(ctx.client_id))
        names = self.labels(list(ctx.data))
        examples = ctx.resources.get(
            f"fedpft/examples/{ctx.client_id}",
            lambda: encode_classification(ctx.data, tokenizer, names, ctx.cfg.data.max_length),
        )
        return examples, int(tokenizer.pad_token_id or 0)

    def _ready_model(
        self, ctx: ClientContext, msg: Payload
    ) -> tuple[Any, Layout, dict[str, torch.nn.Parameter]]:
        layout = layout_from(msg)
        model = self._client_model(ctx, msg, layout)
        params = tuned_parameters(model, layout)
        self._load(params, arrays(msg, TUNED), "tuned state from the server")
        return model, layout, params

    def _fit(self, ctx: ClientContext, msg: Payload) -> Payload:
        model, _, params = self._ready_model(ctx, msg)
        examples, pad = self._examples(ctx)
        train = ctx.cfg.train
        batches = classification_batches(
            examples,
            train.batch_size,
            pad,
            seed=derive_seed(ctx.cfg.seed, ctx.rnd, ctx.client_id),
            epochs=epochs_started(train.local_epochs),
        )
        result = train_selected(
            ctx, model, params, [], pad_token_id=pad, batches=batches, loss_fn=classification_loss
        )
        return fit_reply(ctx, params, result, TUNED)

    def _apoz(self, ctx: ClientContext, msg: Payload) -> Payload:
        """Per-neuron APoZ counts on (a seeded sample of) the client's own data."""
        model, _, _ = self._ready_model(ctx, msg)
        examples, pad = self._examples(ctx)
        limit = self.section.apoz_examples
        if limit is not None and len(examples) > limit:
            rng = np.random.default_rng(derive_seed(ctx.cfg.seed, ctx.rnd, ctx.client_id, "apoz"))
            examples = [examples[int(i)] for i in sorted(rng.choice(len(examples), limit, replace=False))]
        batches = classification_batches(examples, ctx.cfg.train.batch_size, pad, seed=None)
        counts = apoz_counts(model, batches)
        reply: Payload = {f"{APOZ}{pos}": zeros.astype(np.float32) for pos, (zeros, _) in counts.items()}
        reply["positions"] = int(next(iter(counts.values()))[1])
        return reply

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
        results = []
        for model in (full, client):
            self._load_tuned(model, self.global_state, "global state")
            results.append(
                classification_result(
                    model,
                    examples,
                    records,
                    len(names),
                    batch_size=self.cfg.eval.batch_size,
                    pad_token_id=int(tokenizer.pad_token_id or 0),
                )
            )
        sub = {f"sub/{k}": v for k, v in results[1].metrics.items()}
        return EvalResult(metrics={**results[0].metrics, **sub}, by_category=results[0].by_category)

    def client_model_params(self) -> dict[str, int]:
        if self._models is None:
            return {}
        full, client, _ = self._models
        return {
            "full_params": model_params(full),
            "client_params": model_params(client),
            "tuned_params": count(tuned_parameters(client, self.layout)),
            "full_ffn_params": count(ffn_parameters(full)),
            "client_ffn_params": count(ffn_parameters(client, self.layout)),
        }

    @classmethod
    def load_final(
        cls,
        cfg: ExperimentConfig,
        run_dir: Path,
        variant: str | None = None,
        options: Mapping[str, str] | None = None,
    ) -> FinalModel:
        """The full classifier with the final LoRA + head (it classifies; it does not generate)."""
        check_variant(cls.name, cls.final_variants, variant)
        check_options(cls.name, cls.final_options, options or {})
        return ClassifierModel(cfg, run_dir)

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
            "params": self.client_model_params(),
            "distillation": self.distill_log,
        }
        (directory / "fedpft.json").write_text(json.dumps(info, indent=1))

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
            state["ffn"] = arrays_of(ffn_parameters(self._models[1], self.layout))
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
        self._load(ffn_parameters(self._models[1], self.layout), state["ffn"], "checkpoint")
