"""The FedBiOT algorithm class: server setup and rounds, the client task, evaluation, state."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedtune.algorithms.adapters import ADAPTER, collect_adapters, fit_round_result
from fedtune.algorithms.base import Algorithm, RoundResult, derive_seed, evaluate_model
from fedtune.algorithms.fedbiot.config import FedBiOTConfig
from fedtune.algorithms.fedbiot.maths import (
    AlignStats,
    Batch,
    adapter_filter,
    align_emulator,
    emulator_parameters,
    frozen_parameters,
    make_split,
)
from fedtune.algorithms.fedbiot.wire import EMULATOR, FROZEN, layout_payload, split_from_layout
from fedtune.algorithms.final import CausalLMModel, FinalModel, check_options, check_variant, load_base_model
from fedtune.algorithms.local import fit_reply, train_selected
from fedtune.config import ExperimentConfig
from fedtune.data.loaders import load_dataset_records
from fedtune.data.records import DataError, Record
from fedtune.data.tokenize import encode_records, make_batches
from fedtune.eval.evaluate import EvalResult, EvalSet, merge_results, prefixed
from fedtune.fl.aggregate import weighted_average
from fedtune.fl.broadcast import (
    ClientCacheMiss,
    VersionedBroadcast,
    client_cache_mode,
    load_npz,
    receive_part,
    save_npz,
)
from fedtune.fl.federation import ClientContext, ClientTask, Federation, ServerContext
from fedtune.fl.payload import Payload, arrays, payload_nbytes, to_wire
from fedtune.models.loading import resolve_device
from fedtune.models.lora import attach_lora, default_targets
from fedtune.models.surgery import (
    LayerSplit,
    build_emulator,
    layer_parameters,
    layer_state,
    load_layer_state,
    load_parameters,
    lora_target_regex,
    num_decoder_layers,
    set_trainable,
    unwrap,
)
from fedtune.train.optim import build_optimizer, optimizer_state_from_tree, optimizer_state_to_tree
from fedtune.units import BYTES_PER_MB


def _save_init(directory: Path, state: Mapping[str, np.ndarray], info: Mapping[str, Any]) -> None:
    """The initial emulator and its fingerprint; the fingerprint last, so a reader never pairs it
    with a half-written emulator."""
    save_npz(directory / "emulator-init.npz", state)
    tmp = directory / f"emulator-init.json.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(dict(info), indent=1))
    os.replace(tmp, directory / "emulator-init.json")


class FedBiOT(Algorithm[FedBiOTConfig]):
    name = "fedbiot"
    Config = FedBiOTConfig
    resends_after_restart = ("bytes_down", "emulator_sends", "emulator_mb_down")

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        self.global_adapter: dict[str, np.ndarray] = {}
        self.emulator_version = 0
        # The frozen part (embeddings, norm, head) never changes: version 1 for the whole run.
        self.broadcast = VersionedBroadcast(("frozen", "emulator"))
        self.broadcast.set_version("frozen", 1)
        self.split: LayerSplit | None = None
        self._models: tuple[Any, Any, LayerSplit] | None = None
        self._public: list[Batch] = []
        self.init_stats = AlignStats(0.0, 0.0, 0.0, 0)
        self.align_optimizer: torch.optim.Optimizer | None = None
        self._saved_align_optimizer: dict[str, Any] | None = None

    # ----------------------------------------------------------------- models
    def _lora_targets(self, model: Any) -> list[str]:
        lora = self.cfg.lora
        return default_targets(model) if lora.target_modules == "auto" else list(lora.target_modules)

    def _with_lora(self, model: Any, positions: Sequence[int]) -> Any:
        lora = self.cfg.lora
        regex = lora_target_regex(model, positions, self._lora_targets(model))
        return attach_lora(
            model, r=lora.r, alpha=lora.alpha, dropout=lora.dropout, target_modules=regex, seed=self.cfg.seed
        )

    def server_models(self, server: ServerContext) -> tuple[Any, Any, LayerSplit]:
        """(full model M with adapter = AdapFu, emulator model = AdapEmu, split), built once."""

        def build() -> tuple[Any, Any, LayerSplit]:
            base, _ = server.resources.model(self.server_model_spec())
            split = make_split(self.section, num_decoder_layers(base))
            full = base
            emulator = build_emulator(base, split)
            if self.section.adapter_mode == "lora":
                full = self._with_lora(full, split.adapter)
                positions = split.emulator_positions()
                emulator = self._with_lora(emulator, [positions[i] for i in split.adapter])
            for model in (full, emulator):
                set_trainable(model, {})
                model.eval()
            return full, emulator, split

        models: tuple[Any, Any, LayerSplit] = server.resources.get("fedbiot/server_models", build)
        return models

    def _adapter_params(self, model: Any, split: LayerSplit, emulator: bool) -> dict[str, torch.nn.Parameter]:
        positions = split.emulator_positions() if emulator else None
        return layer_parameters(model, split.adapter, positions, adapter_filter(self.section.adapter_mode))

    def _load_adapter(self, model: Any, split: LayerSplit, emulator: bool, state: Mapping[str, Any]) -> None:
        load_parameters(self._adapter_params(model, split, emulator), state, "adapter")

    def _emulator_state(self, emulator: Any, split: LayerSplit) -> dict[str, np.ndarray]:
        return layer_state(emulator, split.emulator, split.emulator_positions())

    # ------------------------------------------------------------------ setup
    def _public_batches(self, server: ServerContext, tokenizer: Any) -> list[Batch]:
        section = self.section
        records: list[Record]
        if section.public_dataset:
            records = load_dataset_records(section.public_dataset, "public")
        else:
            records = list(server.public_records)
        if not records:
            raise DataError(
                f"fedbiot aligns the emulator on a public set, but data.dataset "
                f"{self.cfg.data.dataset!r} has no 'public' split; set fedbiot.public_dataset to a "
                "built-in dataset with one"
            )
        if section.public_examples is not None and len(records) > section.public_examples:
            rng = np.random.default_rng([self.cfg.seed, 0xB1])
            records = [
                records[i] for i in sorted(rng.choice(len(records), section.public_examples, replace=False))
            ]
        examples = encode_records(records, tokenizer, self.cfg.data.template, self.cfg.data.max_length)
        return make_batches(
            examples,
            section.align_batch_size,
            int(tokenizer.pad_token_id or 0),
            seed=self.cfg.seed,
            bucketing=False,
        )

    def _align_batches(self, count: int, tag: int | str) -> list[Batch]:
        rng = np.random.default_rng(derive_seed(self.cfg.seed, "align", tag))
        order = rng.permutation(len(self._public))
        return [self._public[int(order[i % len(order)])] for i in range(count)]

    def _fingerprint(self) -> dict[str, Any]:
        section = self.section
        return {
            "model": self.cfg.model.name,
            "seed": self.cfg.seed,
            "split": section.split,
            "adapter_layers": section.adapter_layers,
            "dropout": section.dropout,
            "adapter_mode": section.adapter_mode,
            "init_steps": section.init_steps,
            "align_lambda": section.align_lambda,
            "align_optimizer": section.align_optimizer,
            "align_lr": section.align_lr,
            "align_batch_size": section.align_batch_size,
            "public_dataset": section.public_dataset or self.cfg.data.dataset,
            "public_examples": section.public_examples,
            "max_length": self.cfg.data.max_length,
            "template": self.cfg.data.template,
        }

    def setup(self, server: ServerContext) -> None:
        full, emulator, split = self._models = self.server_models(server)
        self.split = split
        _, tokenizer = server.resources.model(self.server_model_spec())
        self._public = self._public_batches(server, tokenizer)
        self.global_adapter = layer_state(
            full, split.adapter, None, adapter_filter(self.section.adapter_mode)
        )
        self._load_adapter(emulator, split, True, self.global_adapter)
        self.emulator_version = 1
        self.init_stats = self._initial_distillation(server, full, emulator, split)

    def _initial_distillation(
        self, server: ServerContext, full: Any, emulator: Any, split: LayerSplit
    ) -> AlignStats:
        """I_0 steps of eq. (2) before federated learning, cached on disk for resume.

        With ``init_cache`` set, the result is also kept there under its settings' fingerprint, and
        a run with the same settings loads it instead of distilling again.
        """
        section = self.section
        digest = hashlib.sha256(json.dumps(self._fingerprint(), sort_keys=True).encode()).hexdigest()
        places = [server.run_dir / "fedbiot"]
        if section.init_cache:
            places.append(Path(section.init_cache).expanduser() / digest[:24])
        for directory in places:
            cache, meta = directory / "emulator-init.npz", directory / "emulator-init.json"
            if not (cache.is_file() and meta.is_file()):
                continue
            saved = json.loads(meta.read_text())
            if saved.get("fingerprint") != digest:
                continue
            state = load_npz(cache)
            load_layer_state(emulator, state, split.emulator, split.emulator_positions(), what=str(cache))
            if directory != places[0]:
                _save_init(places[0], state, saved)
            return AlignStats(**saved["stats"])
        stats = align_emulator(
            full,
            emulator,
            split,
            self._align_batches(section.init_steps, "init"),
            lam=section.align_lambda,
            optimizer=self._new_align_optimizer(emulator, split),
            clip_norm=section.align_clip_norm,
        )
        state = self._emulator_state(emulator, split)
        info = {"fingerprint": digest, "config": self._fingerprint(), "stats": stats.__dict__}
        for directory in places:
            _save_init(directory, state, info)
        return stats

    def _new_align_optimizer(self, emulator: torch.nn.Module, split: LayerSplit) -> torch.optim.Optimizer:
        params = emulator_parameters(emulator, split)
        set_trainable(emulator, params)  # the optimizer takes only parameters that require grad
        optimizer = build_optimizer(params.values(), self.section.align_optimizer, lr=self.section.align_lr)
        set_trainable(emulator, {})
        return optimizer

    def _align_optimizer(self, emulator: torch.nn.Module, split: LayerSplit) -> torch.optim.Optimizer:
        """The per-round alignment's optimizer: one for the whole run, its state checkpointed."""
        if self.align_optimizer is None:
            self.align_optimizer = self._new_align_optimizer(emulator, split)
            if self._saved_align_optimizer is not None:
                self.align_optimizer.load_state_dict(optimizer_state_from_tree(self._saved_align_optimizer))
        return self.align_optimizer

    # ------------------------------------------------------------------ round
    def run_round(self, rnd: int, server: ServerContext, fed: Federation) -> RoundResult:
        full, emulator, split = self.server_models(server)
        section = self.section
        align = AlignStats(0.0, 0.0, 0.0, 0)
        if section.align_steps > 0:
            self._load_adapter(full, split, False, self.global_adapter)
            self._load_adapter(emulator, split, True, self.global_adapter)
            align = align_emulator(
                full,
                emulator,
                split,
                self._align_batches(section.align_steps, rnd),
                lam=section.align_lambda,
                optimizer=self._align_optimizer(emulator, split),
                clip_norm=section.align_clip_norm,
            )
            self.emulator_version += 1
        sampled = fed.sample(self.clients_per_round(fed), rnd)
        self.broadcast.set_version("emulator", self.emulator_version)
        messages = {client: self._message(client, emulator, split) for client in sampled}
        emulator_bytes = sum(  # as sent: fp16 under fed.wire_dtype fp16
            payload_nbytes(
                to_wire({k: v for k, v in m.items() if k.startswith(EMULATOR)}, self.cfg.fed.wire_dtype)
            )
            for m in messages.values()
        )
        emulator_sends = sum(1 for m in messages.values() if any(k.startswith(EMULATOR) for k in m))
        self.broadcast.delivered(sampled)
        _, replies, weights = collect_adapters(self, fed, rnd, self.global_adapter, messages)
        for client in sampled:
            if client not in replies:
                self.broadcast.forget(client)
        average = weighted_average([arrays(r, ADAPTER) for r in replies.values()], weights)
        self.global_adapter = {k: np.asarray(v, dtype=np.float32) for k, v in average.items()}
        extra = {
            "emulator_version": float(self.emulator_version),
            "emulator_sends": float(emulator_sends),
            "emulator_mb_down": emulator_bytes / BYTES_PER_MB,
        }
        if align.steps:
            extra.update(align_loss=align.loss, align_mse=align.mse, align_kl=align.kl)
        return fit_round_result(sampled, replies, weights, extra)

    def _message(self, client: str, emulator: Any, split: LayerSplit) -> Payload:
        message: Payload = {ADAPTER + k: v for k, v in self.global_adapter.items()}
        message.update(layout_payload(split))
        message.update(self.broadcast.message(client, lambda part: self._wire_part(part, emulator, split)))
        return message

    def _wire_part(self, part: str, emulator: Any, split: LayerSplit) -> Payload:
        """The frozen part (with the architecture) or the emulator as payload entries."""
        if part == "frozen":
            frozen = frozen_parameters(emulator, split, self.section.adapter_mode)
            entries: Payload = {FROZEN + k: p.detach().float().cpu().numpy() for k, p in frozen.items()}
            entries["arch"] = unwrap(emulator).config.to_json_string(use_diff=False)
            return entries
        return {EMULATOR + k: v for k, v in self._emulator_state(emulator, split).items()}

    # ----------------------------------------------------------------- client
    def client_tasks(self) -> dict[str, ClientTask]:
        return {"fit": self._fit}

    def _client_model(self, ctx: ClientContext, msg: Payload, split: LayerSplit) -> Any:
        """The client's emulator model: built from the architecture it was sent, weights as received."""
        holder: dict[str, Any] = ctx.resources.get("fedbiot/client", dict)
        arch_file = ctx.workdir / "fedbiot-cache" / "arch.json"
        arch = msg.get("arch")
        if arch is not None and self._client_cache() == "disk":
            arch_file.parent.mkdir(parents=True, exist_ok=True)
            arch_file.write_text(str(arch))
        if arch is None and "model" not in holder and self._client_cache() == "disk" and arch_file.is_file():
            arch = arch_file.read_text()  # a restarted client process: the architecture from its disk
        if arch is not None and holder.get("arch") != arch:
            from transformers import AutoConfig, AutoModelForCausalLM

            spec = json.loads(str(arch))
            config = AutoConfig.for_model(spec.pop("model_type"), **spec)
            torch.manual_seed(0)
            model = AutoModelForCausalLM.from_config(config)
            if self.section.adapter_mode == "lora":
                positions = split.emulator_positions()
                model = self._with_lora(model, [positions[i] for i in split.adapter])
            holder.clear()
            model.to(resolve_device(self.client_model_spec(ctx.client_id).device))
            holder.update(arch=arch, model=model.eval(), versions={})
        if "model" not in holder:
            raise ClientCacheMiss(f"client {ctx.client_id} holds no emulator model and was not sent one")
        model = holder["model"]
        versions: dict[str, int] = holder["versions"]
        self._receive(ctx, msg, model, split, versions, "frozen")
        self._receive(ctx, msg, model, split, versions, "emulator")
        return model

    def _part(self, model: Any, split: LayerSplit, part: str) -> dict[str, torch.nn.Parameter]:
        if part == "frozen":
            return frozen_parameters(model, split, self.section.adapter_mode)
        return layer_parameters(model, split.emulator, split.emulator_positions())

    def _receive(
        self, ctx: ClientContext, msg: Payload, model: Any, split: LayerSplit, held: dict[str, int], part: str
    ) -> None:
        disk = self._client_cache() == "disk"
        receive_part(
            msg,
            part,
            FROZEN if part == "frozen" else EMULATOR,
            held,
            lambda state, what: load_parameters(self._part(model, split, part), state, what),
            cache_file=ctx.workdir / "fedbiot-cache" / f"{part}.npz" if disk else None,
            client=ctx.client_id,
        )

    def _client_cache(self) -> str:
        return client_cache_mode(
            str(self.section.client_cache), getattr(self.cfg.fed, "backend", "simulation")
        )

    def _fit(self, ctx: ClientContext, msg: Payload) -> Payload:
        from fedtune.data.tokenize import encode_records as encode

        split = split_from_layout(msg)
        model = self._client_model(ctx, msg, split)
        params = self._adapter_params(model, split, True)
        load_parameters(params, arrays(msg, ADAPTER), "adapter from the server")
        tokenizer = ctx.resources.tokenizer(self.client_model_spec(ctx.client_id))
        data_cfg = ctx.cfg.data
        examples = ctx.resources.get(
            f"fedbiot/examples/{ctx.client_id}",
            lambda: encode(ctx.data, tokenizer, data_cfg.template, data_cfg.max_length),
        )
        result = train_selected(
            ctx,
            model,
            params,
            examples,
            pad_token_id=int(tokenizer.pad_token_id or 0),
            prox_mu=self.section.prox_eps,
        )
        return fit_reply(ctx, params, result, ADAPTER)

    # ------------------------------------------------------------------- eval
    def evaluate(self, rnd: int, server: ServerContext, fed: Federation, eval_set: EvalSet) -> EvalResult:
        full, emulator, split = self.server_models(server)
        _, tokenizer = server.resources.model(self.server_model_spec())
        results = []
        for prefix, model, is_emulator in (("adapemu/", emulator, True), ("adapfu/", full, False)):
            self._load_adapter(model, split, is_emulator, self.global_adapter)
            result = evaluate_model(self.cfg, model, tokenizer, eval_set.records, rnd)
            results.append(prefixed(result, prefix))
        return merge_results(*results)

    def client_model_params(self) -> dict[str, int]:
        """Parameter counts: the full model, what a client holds (the emulator model), the adapter."""
        if self._models is None:
            return {}
        full, emulator, split = self._models

        def count(model: Any) -> int:
            return sum(p.numel() for p in unwrap(model).parameters())

        return {
            "full_params": count(full),
            "client_params": count(emulator),
            "adapter_params": sum(p.numel() for p in self._adapter_params(emulator, split, True).values()),
        }

    final_variants = ("adapfu", "adapemu")
    """``adapfu``: the adapter plugged into the full model; ``adapemu``: the adapter on the emulator."""

    @classmethod
    def load_final(
        cls,
        cfg: ExperimentConfig,
        run_dir: Path,
        variant: str | None = None,
        options: Mapping[str, str] | None = None,
    ) -> FinalModel:
        variant = check_variant(cls.name, cls.final_variants, variant)
        check_options(cls.name, cls.final_options, options or {})
        base, tokenizer = load_base_model(cfg)
        return CausalLMModel(cfg, load_final_fedbiot(cfg, base, run_dir, variant == "adapemu"), tokenizer)

    def write_artifacts(self, directory: Path) -> None:
        """The final adapter (keyed by original layer index) and the split; AdapFu = base model + it."""
        if self.split is None:
            return
        info = {
            "algorithm": self.name,
            "base_model": self.cfg.model.name,
            "split": self.split.describe(),
            "emulator_version": self.emulator_version,
            "params": self.client_model_params(),
            "initial_distillation": self.init_stats.__dict__,
            "settings": self._fingerprint(),
        }
        directory.mkdir(parents=True, exist_ok=True)
        save_npz(directory / "fedbiot-adapter.npz", self.global_adapter)
        if self._models is not None:
            _, emulator, split = self._models
            save_npz(directory / "fedbiot-emulator.npz", self._emulator_state(emulator, split))
        (directory / "fedbiot.json").write_text(json.dumps(info, indent=1))

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "global_adapter": self.global_adapter,
            "emulator_version": self.emulator_version,
        }
        if self._models is not None:
            _, emulator, split = self._models
            state["emulator"] = self._emulator_state(emulator, split)
        if self.align_optimizer is not None:
            state["align_optimizer"] = optimizer_state_to_tree(self.align_optimizer)
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if self._models is None:
            raise RuntimeError("fedbiot: setup() must run before load_state_dict()")
        _, emulator, split = self._models
        self.global_adapter = {k: np.asarray(v) for k, v in state["global_adapter"].items()}
        self.emulator_version = int(state["emulator_version"])
        self.align_optimizer = None  # rebuilt from the saved state at its next use
        self._saved_align_optimizer = state.get("align_optimizer")
        self.broadcast.reset()
        load_layer_state(
            emulator, state["emulator"], split.emulator, split.emulator_positions(), what="checkpoint"
        )


def load_final_fedbiot(cfg: Any, base: Any, run_dir: Path, emulator: bool) -> Any:
    """A finished run's final model built from ``base``: AdapFu (the adapter plugged into the full
    model) or, with ``emulator``, AdapEmu (the adapter on the final emulator)."""
    directory = run_dir / "artifacts"
    adapter_file = directory / "fedbiot-adapter.npz"
    if not adapter_file.is_file():
        raise FileNotFoundError(
            f"{adapter_file} is missing: did the run finish? (`fedtune resume {run_dir}`)"
        )
    algorithm = FedBiOT(cfg)
    split = make_split(algorithm.section, num_decoder_layers(base))
    model = build_emulator(base, split) if emulator else base
    if algorithm.section.adapter_mode == "lora":
        positions = split.emulator_positions()
        model = algorithm._with_lora(
            model, [positions[i] for i in split.adapter] if emulator else split.adapter
        )
    if emulator:
        emulator_file = directory / "fedbiot-emulator.npz"
        if not emulator_file.is_file():
            raise FileNotFoundError(f"{emulator_file} is missing (the run predates it): use --variant adapfu")
        state = load_npz(emulator_file)
        load_layer_state(model, state, split.emulator, split.emulator_positions(), what=str(emulator_file))
    algorithm._load_adapter(model, split, emulator, load_npz(adapter_file))
    return model.eval()
