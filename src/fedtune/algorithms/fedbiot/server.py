"""FedBiOT's server: it holds the full model, aligns the emulator, sends the adapter, averages it."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedtune.algorithms.adapters import ADAPTER, collect_adapters, fit_round_result
from fedtune.algorithms.base import Algorithm, RoundResult, derive_seed, evaluate_model
from fedtune.algorithms.exporting import Exported, ExportError, export_causal_lm, full_precision
from fedtune.algorithms.fedbiot.client import fit
from fedtune.algorithms.fedbiot.config import FedBiOTConfig, init_fingerprint
from fedtune.algorithms.fedbiot.emulator import (
    AlignStats,
    Batch,
    align_emulator,
    alignment_optimizer,
    make_split,
    public_batches,
)
from fedtune.algorithms.fedbiot.final import final_model, save_final
from fedtune.algorithms.fedbiot.wire import (
    adapter_parameters,
    adapter_state,
    emulator_state,
    emulator_traffic,
    layout_payload,
    parameter_counts,
    part_payload,
    with_adapter_lora,
)
from fedtune.algorithms.final import FinalModel, FinalRun
from fedtune.config import ExperimentConfig
from fedtune.data.loaders import load_public_set
from fedtune.data.records import DataError, Record
from fedtune.eval.evaluate import EvalResult, EvalSet, merge_results, prefixed
from fedtune.fl.broadcast import VersionedBroadcast, load_npz, save_npz
from fedtune.fl.clipping import update_norm
from fedtune.fl.federation import ClientTask, Federation, ServerContext
from fedtune.fl.payload import Payload, arrays
from fedtune.models.surgery import (
    LayerSplit,
    build_emulator,
    load_layer_state,
    load_parameters,
    num_decoder_layers,
    set_trainable,
)
from fedtune.rundir import waiting_lock
from fedtune.train.optim import optimizer_state_from_tree, optimizer_state_to_tree
from fedtune.units import BYTES_PER_MB

Models = tuple[Any, Any, LayerSplit]
"""(the full model M with the adapter = AdapFu, the emulator model = AdapEmu, the split)."""


class FedBiOT(Algorithm[FedBiOTConfig]):
    name = "fedbiot"
    Config = FedBiOTConfig
    resends_after_restart = ("bytes_down", "emulator_sends", "emulator_mb_down")
    final_variants = ("adapfu", "adapemu")
    """``adapfu``: the adapter plugged into the full model; ``adapemu``: the adapter on the emulator."""

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        self.global_adapter: dict[str, np.ndarray] = {}
        self.emulator_version = 0
        # The frozen part (embeddings, norm, head) never changes: version 1 for the whole run.
        self.broadcast = VersionedBroadcast(("frozen", "emulator"))
        self.broadcast.set_version("frozen", 1)
        self._models: Models | None = None
        self._public: list[Batch] = []
        self.init_stats = AlignStats(0.0, 0.0, 0.0, 0)
        self.align_optimizer: torch.optim.Optimizer | None = None
        self._saved_align_optimizer: dict[str, Any] | None = None

    @classmethod
    def client_tasks(cls, cfg: ExperimentConfig) -> dict[str, ClientTask]:
        return {"fit": fit}

    # ----------------------------------------------------------------- models
    def server_models(self, server: ServerContext) -> Models:
        """(full model M with adapter = AdapFu, emulator model = AdapEmu, split), built once."""

        def build() -> Models:
            base, _ = server.resources.model(self.server_model_spec())
            split = make_split(self.section, num_decoder_layers(base))
            full = base
            emulator = build_emulator(base, split)
            if self.section.adapter_mode == "lora":
                lora, seed = self.cfg.lora, self.cfg.seed
                full = with_adapter_lora(full, split, lora, seed=seed, emulator=False)
                emulator = with_adapter_lora(emulator, split, lora, seed=seed, emulator=True)
            for model in (full, emulator):
                set_trainable(model, {})
                model.eval()
            return full, emulator, split

        models: Models = server.resources.get("fedbiot/server_models", build)
        return models

    @property
    def models(self) -> Models:
        """The server's models (``server_models``), once ``setup`` has run."""
        if self._models is None:
            raise RuntimeError("fedbiot: setup() must run first")
        return self._models

    def _load_adapter(self, model: Any, emulator: bool, state: Mapping[str, Any]) -> None:
        _, _, split = self.models
        params = adapter_parameters(model, split, self.section.adapter_mode, emulator=emulator)
        load_parameters(params, state, "adapter")

    # ------------------------------------------------------------------ setup
    def setup(self, server: ServerContext) -> None:
        full, emulator, split = self._models = self.server_models(server)
        _, tokenizer = server.resources.model(self.server_model_spec())
        self._public = self._public_batches(server.public_records, tokenizer)
        self.global_adapter = adapter_state(full, split, self.section.adapter_mode)
        self._load_adapter(emulator, True, self.global_adapter)
        self.emulator_version = 1
        self.init_stats = self._initial_distillation(server.run_dir / "fedbiot")

    def _public_batches(self, public: list[Record], tokenizer: Any) -> list[Batch]:
        """The public set the emulator is aligned on (``public_examples`` of it), batched."""
        section, data = self.section, self.cfg.data
        records = load_public_set(section.public_dataset, public, key="fedbiot.public_dataset")
        if not records:
            raise DataError(
                f"fedbiot aligns the emulator on a public set, but data.dataset {data.dataset!r} has no "
                "'public' split; set fedbiot.public_dataset to a built-in dataset with one"
            )
        return public_batches(
            records,
            tokenizer,
            template=data.template,
            max_length=data.max_length,
            batch_size=section.align_batch_size,
            count=section.public_examples,
            seed=self.cfg.seed,
        )

    def _initial_distillation(self, own: Path) -> AlignStats:
        """I_0 steps of eq. (2) before federated learning, cached in ``own`` for resume.

        With ``init_cache`` set, the result is also kept there under its settings' fingerprint, and
        a run with the same settings loads it instead of distilling again.
        """
        section = self.section
        digest = hashlib.sha256(json.dumps(init_fingerprint(self.cfg), sort_keys=True).encode()).hexdigest()
        places = [own]
        if section.init_cache:
            places.append(Path(section.init_cache).expanduser() / digest[:24])
        # Runs sharing the cache may start together (a table's --jobs): the first to take the entry's
        # lock distils, the others wait and load what it saved.
        guard = waiting_lock(places[-1] / "init.lock") if section.init_cache else contextlib.nullcontext()
        with guard:
            return self._distil_or_load(places, digest)

    def _distil_or_load(self, places: list[Path], digest: str) -> AlignStats:
        """The initial emulator from the first of ``places`` holding it, else distilled and saved to all."""
        full, emulator, split = self.models
        section = self.section
        cached = _load_cached_init(places, digest, emulator, split)
        if cached is not None:
            return cached
        stats = align_emulator(
            full,
            emulator,
            split,
            self._align_batches(section.init_steps, "init"),
            lam=section.align_lambda,
            kl_order=section.kl_order,
            optimizer=self._new_align_optimizer(),
            clip_norm=section.align_clip_norm,
            lm_weight=section.align_lm,
        )
        state = emulator_state(emulator, split)
        info = {"fingerprint": digest, "config": init_fingerprint(self.cfg), "stats": stats.__dict__}
        for directory in places:
            _save_init(directory, state, info)
        return stats

    def _align_batches(self, count: int, tag: int | str) -> list[Batch]:
        rng = np.random.default_rng(derive_seed(self.cfg.seed, "align", tag))
        order = rng.permutation(len(self._public))
        return [self._public[int(order[i % len(order)])] for i in range(count)]

    def _new_align_optimizer(self) -> torch.optim.Optimizer:
        _, emulator, split = self.models
        return alignment_optimizer(emulator, split, self.section.align_optimizer, self.section.align_lr)

    def _align_optimizer(self) -> torch.optim.Optimizer:
        """The per-round alignment's optimizer: one for the whole run, its state checkpointed."""
        if self.align_optimizer is None:
            self.align_optimizer = self._new_align_optimizer()
            if self._saved_align_optimizer is not None:
                self.align_optimizer.load_state_dict(optimizer_state_from_tree(self._saved_align_optimizer))
        return self.align_optimizer

    # ------------------------------------------------------------------ round
    def run_round(self, rnd: int, server: ServerContext, fed: Federation) -> RoundResult:
        align = self._align(rnd) if self.section.align_steps > 0 else AlignStats(0.0, 0.0, 0.0, 0)
        sampled = self.sample_clients(fed, rnd)
        self.broadcast.set_version("emulator", self.emulator_version)
        messages = {client: self.message(client) for client in sampled}
        emulator_sends, emulator_bytes = emulator_traffic(messages.values(), self.cfg.fed.wire_dtype)
        self.broadcast.delivered(sampled)
        _, replies, weights = collect_adapters(self, fed, rnd, self.global_adapter, messages, sampled=sampled)
        self.broadcast.forget_unanswered(sampled, replies)
        adapters = [arrays(r, ADAPTER) for r in replies.values()]
        shift = adapter_shift(adapters, self.global_adapter)
        average = self.aggregate(adapters, weights, reference=self.global_adapter)
        self.global_adapter = {k: np.asarray(v, dtype=np.float32) for k, v in average.items()}
        extra = {
            "emulator_version": float(self.emulator_version),
            "emulator_sends": float(emulator_sends),
            "emulator_mb_down": emulator_bytes / BYTES_PER_MB,
        }
        if align.steps:
            extra.update(align_loss=align.loss, align_mse=align.mse, align_kl=align.kl)
        extra.update(shift)
        return fit_round_result(sampled, replies, weights, extra)

    def _align(self, rnd: int) -> AlignStats:
        """The round's ``align_steps`` of eq. (2) with the current adapter; a new emulator version."""
        full, emulator, split = self.models
        self._load_adapter(full, False, self.global_adapter)
        self._load_adapter(emulator, True, self.global_adapter)
        align = align_emulator(
            full,
            emulator,
            split,
            self._align_batches(self.section.align_steps, rnd),
            lam=self.section.align_lambda,
            kl_order=self.section.kl_order,
            optimizer=self._align_optimizer(),
            clip_norm=self.section.align_clip_norm,
            lm_weight=self.section.align_lm,
        )
        self.emulator_version += 1
        return align

    def message(self, client: str) -> Payload:
        """What ``client`` is sent for ``fit``: the adapter, the layout, and the parts it does not hold."""
        _, emulator, split = self.models
        mode = self.section.adapter_mode
        message: Payload = {ADAPTER + k: v for k, v in self.global_adapter.items()}
        message.update(layout_payload(split))
        message.update(self.broadcast.message(client, lambda part: part_payload(part, emulator, split, mode)))
        return message

    # ------------------------------------------------------------------- eval
    def evaluate(self, rnd: int, server: ServerContext, fed: Federation, eval_set: EvalSet) -> EvalResult:
        full, emulator, _ = self.models
        _, tokenizer = server.resources.model(self.server_model_spec())
        results = []
        for prefix, model, is_emulator in (("adapemu/", emulator, True), ("adapfu/", full, False)):
            self._load_adapter(model, is_emulator, self.global_adapter)
            result = evaluate_model(self.cfg, model, tokenizer, eval_set.records, rnd)
            results.append(prefixed(result, prefix))
        return merge_results(*results)

    # -------------------------------------------------------------- final model
    @classmethod
    def final_model(cls, run: FinalRun) -> FinalModel:
        return final_model(run.cfg, run.run_dir, run.variant)

    @classmethod
    def export_final(cls, run: FinalRun, fmt: str, out: Path) -> Exported:
        """AdapFu (the default variant: the final adapter plugged into the full model), as a peft adapter
        for the full model or merged into it; AdapEmu (``adapemu``: the adapter on the emulator, a
        compressed model only this run has) merged only."""
        if run.variant == "adapemu" and fmt == "peft":
            raise ExportError(
                "--variant adapemu: its adapter sits on the run's emulator, a compressed model no one else "
                "has; export it with --format merged (emulator and adapter as one model), or export "
                "AdapFu (the default variant) as peft"
            )
        what = (
            "FedBiOT's AdapEmu (the final adapter on the emulator)"
            if run.variant == "adapemu"
            else "FedBiOT's AdapFu (the final adapter plugged into the full model)"
        )
        return export_causal_lm(cls.final_model(full_precision(run)), fmt, out, what)

    def write_artifacts(self, directory: Path) -> None:
        """The final adapter (keyed by original layer index) and the split; AdapFu = base model + it."""
        if self._models is None:
            return
        full, emulator, split = self._models
        info = {
            "algorithm": self.name,
            "base_model": self.cfg.model.name,
            "split": split.describe(),
            "emulator_version": self.emulator_version,
            "params": parameter_counts(full, emulator, split, self.section.adapter_mode),
            "initial_distillation": self.init_stats.__dict__,
            "settings": init_fingerprint(self.cfg),
        }
        save_final(directory, self.global_adapter, emulator_state(emulator, split), info)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "global_adapter": self.global_adapter,
            "emulator_version": self.emulator_version,
        }
        if self._models is not None:
            _, emulator, split = self._models
            state["emulator"] = emulator_state(emulator, split)
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


def adapter_shift(adapters: list[dict[str, np.ndarray]], sent: Mapping[str, np.ndarray]) -> dict[str, float]:
    """How far the round's clients moved the adapter: the mean L2 norm of (reply - ``sent``), absolute
    (``adapter_shift``) and in percent of the norm of ``sent`` (``adapter_shift_pct``: the runner keeps
    two decimals of a round's statistics, too few for a ratio near 1e-3); {} when no reply carries the
    adapter (no replies, or secure aggregation: the server never sees one client's adapter).

    The proximal term (eps/2)||theta - theta_sent||^2 acts on exactly this distance, so the two read
    together say whether eps can matter at the run's local budget.
    """
    seen = [adapter for adapter in adapters if adapter and sent.keys() <= adapter.keys()]
    if not seen:
        return {}
    shift = float(np.mean([update_norm(adapter, sent) for adapter in seen]))
    scale = float(np.sqrt(sum(np.sum(np.square(value, dtype=np.float64)) for value in sent.values())))
    return {"adapter_shift": shift, "adapter_shift_pct": 100.0 * shift / scale if scale > 0 else 0.0}


def _load_cached_init(places: list[Path], digest: str, emulator: Any, split: LayerSplit) -> AlignStats | None:
    """The first of ``places`` holding the initial emulator of fingerprint ``digest``, loaded into
    ``emulator`` (and copied to ``places[0]``, the run's own); None when none holds it."""
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
    return None


def _save_init(directory: Path, state: Mapping[str, np.ndarray], info: Mapping[str, Any]) -> None:
    """The initial emulator and its fingerprint; the fingerprint last, so a reader never pairs it
    with a half-written emulator."""
    save_npz(directory / "emulator-init.npz", state)
    tmp = directory / f"emulator-init.json.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(dict(info), indent=1))
    os.replace(tmp, directory / "emulator-init.json")
