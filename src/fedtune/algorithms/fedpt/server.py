"""FedPT's server: the rounds (FedAvg of the small LM's LoRA, then the distillation of the proxy-tuned
large LM into it), the alpha search and evaluation, the run state and the final artifacts."""

from __future__ import annotations

import logging
import random
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

import fedtune.algorithms.fedpt.client as client
from fedtune.algorithms.adapters import ADAPTER, collect_adapters, fit_round_result
from fedtune.algorithms.base import Algorithm, RoundResult, derive_seed, evaluate_model
from fedtune.algorithms.exporting import Exported, export_causal_lm, full_precision
from fedtune.algorithms.fedpt.config import FedPTConfig
from fedtune.algorithms.fedpt.distillation import (
    Batch,
    frozen_teacher,
    kd_optimizer,
    kd_step,
    logits_with,
    proxy_teacher,
)
from fedtune.algorithms.fedpt.final import (
    DISTILLED_ADAPTER,
    PROXY_FILE,
    evaluate_proxy,
    final_model,
    large_source,
    proxy_lm,
    proxy_perplexities,
    write_proxy_json,
)
from fedtune.algorithms.final import FinalModel, FinalRun
from fedtune.config import ExperimentConfig
from fedtune.data.loaders import load_public_set
from fedtune.data.records import DataError, Record
from fedtune.data.tokenize import encode_records, make_batches
from fedtune.eval.evaluate import EvalResult, EvalSet, merge_results, prefixed
from fedtune.fl.federation import ClientTask, Federation, ServerContext
from fedtune.fl.payload import Payload, arrays
from fedtune.modelcard import base_model_of, save_peft_adapter
from fedtune.models.lora import adapter_arrays, load_adapter
from fedtune.proxy.api_url import is_api_url
from fedtune.proxy.http_source import APIUsage, api_usage
from fedtune.proxy.source import LogitSource
from fedtune.proxy.vocab import shared_vocab_size
from fedtune.train.teacher_cache import TeacherCache

log = logging.getLogger("fedtune")


class FedPT(Algorithm[FedPTConfig]):
    name = "fedpt"
    Config = FedPTConfig
    final_variants = ("proxy", "small", "proxy-distilled", "small-distilled")
    """``proxy``: the proxy-tuned large LM over the last round's aggregate, before its distillation
    (Alg. 1's output); ``small``: that small LM; ``proxy-distilled`` / ``small-distilled``: the same
    over the small LM after the round's distillation (what the clients would be sent next)."""
    final_options = ("alpha", "large_model", "top_k")
    """``alpha``: the proxy's strength (default: the run's chosen alpha, then ``fedpt.alpha``)."""

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        self.global_adapter: dict[str, np.ndarray] = {}
        """The small LM's LoRA after the round's distillation: what the clients are sent."""
        self.aggregated_adapter: dict[str, np.ndarray] = {}
        """The round's FedAvg aggregate before its distillation: the small LM of Alg. 1's output."""
        self._resources: Any = None
        self.alphas: dict[int, float] = {}
        self.alpha_study: dict[int, dict[str, float]] = {}
        self.vocab_width = 0
        self._kd_batches: list[Batch] = []
        self._run_dir: Path | None = None
        self._teachers: dict[float, TeacherCache] = {}
        """The frozen teacher parts' stores, one per alpha the teacher has run at."""

    @classmethod
    def client_tasks(cls, cfg: ExperimentConfig) -> dict[str, ClientTask]:
        return {"fit": client.fit}

    # ----- setup ----------------------------------------------------------------------------------
    def large(self, server: ServerContext) -> LogitSource:
        """The black-box large LM, reached through its next-token logits only."""
        return large_source(self.cfg, server.resources)

    def setup(self, server: ServerContext) -> None:
        sec: FedPTConfig = self.section
        model, tokenizer = server.resources.lora_lm()
        large = self.large(server)
        small_base: Any = model.get_base_model()
        small_width = int(small_base.get_output_embeddings().weight.shape[0])
        self.vocab_width = shared_vocab_size(
            tokenizer,
            small_width,
            large.tokenizer,
            large.vocab_width,
            small_name=f"model.name {self.cfg.model.name!r}",
            large_name=f"fedpt.large_model {sec.large_model!r}",
        )
        self.global_adapter = dict(server.resources.initial_adapter())
        self.aggregated_adapter = dict(self.global_adapter)
        self._resources = server.resources
        if sec.distill:
            self._kd_batches = self._public_batches(server)
            self._run_dir = server.run_dir

    def _public_batches(self, server: ServerContext) -> list[Batch]:
        sec: FedPTConfig = self.section
        records = load_public_set(sec.public_dataset, server.public_records, key="fedpt.public_dataset")
        if not records:
            raise DataError(
                f"fedpt distils on a public set, but data.dataset {self.cfg.data.dataset!r} has no "
                "'public' split; set fedpt.public_dataset to a built-in dataset with one, or "
                "fedpt.distill=false (FedAvg+PT)"
            )
        if len(records) > sec.kd_examples:
            records = random.Random(derive_seed(self.cfg.seed, "kd-sample")).sample(records, sec.kd_examples)
        _, tokenizer = server.resources.lora_lm()
        examples = encode_records(records, tokenizer, self.cfg.data.template, self.cfg.data.max_length)
        pad = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
        return make_batches(
            examples, sec.kd_batch_size, pad, seed=derive_seed(self.cfg.seed, "kd"), bucketing=True
        )

    def _teacher_cache(self, alpha: float) -> TeacherCache:
        """The frozen teacher's store at ``alpha``, keyed by everything its logits depend on; one
        directory per alpha, so a teacher that follows the search keeps every alpha's parts."""
        sec: FedPTConfig = self.section
        if alpha in self._teachers:
            return self._teachers[alpha]
        assert self._run_dir is not None
        name = "fedpt-teacher" if alpha == sec.alpha else f"fedpt-teacher-alpha{alpha:g}"
        fingerprint = {
            "small": self.cfg.model.name,
            "large": sec.large_model,
            "alpha": alpha,
            "dtype": sec.teacher_dtype,
            "kd_examples": sec.kd_examples,
            "kd_batch_size": sec.kd_batch_size,
            "max_length": self.cfg.data.max_length,
            "template": self.cfg.data.template,
            "dataset": self.cfg.data.dataset,
            "public_dataset": sec.public_dataset,
            "seed": self.cfg.seed,
            "vocab_width": self.vocab_width,
        }
        if is_api_url(sec.large_model):  # what the served teacher's logits depend on beyond the URL
            fingerprint.update({"large_model_name": sec.large_model_name, "top_k": sec.top_k})
        self._teachers[alpha] = TeacherCache(
            sec.teacher_cache, self._run_dir / "cache" / name, fingerprint, sec.teacher_dtype
        )
        return self._teachers[alpha]

    # ----- rounds ---------------------------------------------------------------------------------
    def run_round(self, rnd: int, server: ServerContext, fed: Federation) -> RoundResult:
        message: Payload = {ADAPTER + k: v for k, v in self.global_adapter.items()}
        sampled, replies, weights = collect_adapters(self, fed, rnd, self.global_adapter, message)
        adapters = [arrays(r, ADAPTER) for r in replies.values()]
        average = self.aggregate(adapters, weights, reference=self.global_adapter)
        kd_stats: dict[str, float] = {}
        self.aggregated_adapter = dict(average)  # Alg. 1 l.9 builds the output from this one
        if self.section.distill:
            before = api_usage(self.large(server))
            average, kd_stats = self._distill(rnd, server, average)
            kd_stats.update(self._api_cost(server, before))
        self.global_adapter = average
        return fit_round_result(sampled, replies, weights, kd_stats)

    def _distill(
        self, rnd: int, server: ServerContext, average: Mapping[str, np.ndarray]
    ) -> tuple[dict[str, np.ndarray], dict[str, float]]:
        """Step 5: distil the proxy-tuned large LM (at ``_teacher_alpha``) into the aggregated small LM
        on D_kd."""
        sec: FedPTConfig = self.section
        alpha = self._teacher_alpha(rnd)
        cache = self._teacher_cache(alpha)
        start = time.perf_counter()
        teacher_before = cache.compute_seconds
        # LoRA dropout draws from torch's global RNG: seed it here, or the distillation depends on
        # whatever ran before in this process (the clients' local SFT in simulation, nothing on Flower).
        torch.manual_seed(derive_seed(self.cfg.seed, rnd, "kd-dropout"))
        model, _ = server.resources.lora_lm()
        large = self.large(server)
        load_adapter(model, average)
        trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
        theta_bar = {n: p.detach().clone() for n, p in trainable.items()}
        params = list(trainable.values())
        optimizer, scheduler = kd_optimizer(params, sec, rnd, self.cfg.fed.rounds)
        order = np.random.default_rng(derive_seed(self.cfg.seed, rnd, "kd-order")).permutation(
            len(self._kd_batches)
        )
        device = next(model.parameters()).device
        width = self.vocab_width
        ce_total = kl_total = student_seconds = 0.0
        for step in range(sec.kd_steps):
            index = int(order[step % len(order)])
            batch = {k: v.to(device) for k, v in self._kd_batches[index].items()}
            frozen = cache.get(index, partial(frozen_teacher, model, large, batch, alpha, width))
            sbar = logits_with(model, trainable, theta_bar, batch)
            teacher = proxy_teacher(frozen.to(device), sbar, alpha, width)
            student_start = time.perf_counter()
            loss, ce, kl = kd_step(
                model, batch, teacher, optimizer, params, kd_lambda=sec.kd_lambda, clip_norm=sec.kd_clip_norm
            )
            scheduler.step()
            student_seconds += time.perf_counter() - student_start
            ce_total += ce
            kl_total += kl
            server.report(step + 1, sec.kd_steps, loss)
        model.eval()
        return dict(adapter_arrays(model)), {
            "kd_ce": ce_total / sec.kd_steps,
            "kd_kl": kl_total / sec.kd_steps,
            "kd_seconds": time.perf_counter() - start,
            "kd_student_seconds": student_seconds,
            "teacher_seconds": cache.compute_seconds - teacher_before,
        }

    def _api_cost(self, server: ServerContext, before: APIUsage | None) -> dict[str, float]:
        """What the large model's API cost since ``before`` (``api_*`` metrics; none for a local model)."""
        after = api_usage(self.large(server))
        return {} if before is None or after is None else (after - before).metrics()

    def _teacher_alpha(self, rnd: int) -> float:
        """Round ``rnd``'s teacher alpha: with ``teacher_alpha: searched``, the alpha the latest search
        before the round chose (the one decoding uses); ``fedpt.alpha`` before any search or when fixed.
        ``alphas`` and ``alpha_study`` are checkpointed, so a resumed run picks the same."""
        searched = [r for r in self.alpha_study if r < rnd]
        if self.section.teacher_alpha == "fixed" or not searched:
            return self.section.alpha
        return self.alphas[max(searched)]

    # ----- evaluation -----------------------------------------------------------------------------
    def _alpha(self, rnd: int, server: ServerContext) -> float:
        """Round ``rnd``'s alpha: searched on the validation split when ``alpha_search`` says so."""
        sec: FedPTConfig = self.section
        if rnd in self.alphas:
            return self.alphas[rnd]
        final = sec.alpha_search == "final" and rnd == self.cfg.fed.rounds
        search = rnd > 0 and (sec.alpha_search == "every" or final)
        if search and not server.validation_records:
            log.warning("fedpt: no validation split to search alpha on; using fedpt.alpha = %s", sec.alpha)
        search = search and bool(server.validation_records)
        self.alphas[rnd] = self._search_alpha(rnd, server) if search else sec.alpha
        return self.alphas[rnd]

    def _search_alpha(self, rnd: int, server: ServerContext) -> float:
        """The best of ``alpha_grid`` on the first ``alpha_search_examples`` validation records."""
        sec: FedPTConfig = self.section
        metric = sec.search_metric(self.cfg.eval.metrics)
        # only the metric searched by: perplexity alone decodes nothing (deterministic and cheap)
        settings = self.cfg.eval.model_copy(update={"seeds": sec.alpha_search_seeds, "metrics": [metric]})
        scores: dict[str, float] = {}
        records = server.validation_records[: sec.alpha_search_examples]
        if metric == "perplexity":  # the three models run once a batch for the whole grid
            proxy, tokenizer = self._proxy(server)
            by_alpha = proxy_perplexities(
                proxy,
                tokenizer,
                records,
                sec.alpha_grid,
                settings,
                template=self.cfg.data.template,
                max_length=self.cfg.data.max_length,
            )
            scores = {f"{candidate:g}": by_alpha[candidate] for candidate in sec.alpha_grid}
        else:
            for candidate in sec.alpha_grid:
                result = self._evaluate_proxy(server, records, candidate, rnd, settings)
                scores[f"{candidate:g}"] = result.metrics[metric]
        better = min if metric == "perplexity" else max
        alpha = float(better(scores, key=lambda a: scores[a]))
        self.alpha_study[rnd] = scores
        log.info("fedpt round %d: validation %s by alpha %s -> alpha %g", rnd, metric, scores, alpha)
        return alpha

    def _proxy(
        self, server: ServerContext, adapter: Mapping[str, np.ndarray] | None = None
    ) -> tuple[Any, Any]:
        """The proxy-tuned LM over ``adapter`` (default: Alg. 1's output), and its tokenizer."""
        _, tokenizer = server.resources.lora_lm()
        small = self.aggregated_adapter if adapter is None else adapter
        return proxy_lm(self.cfg, server.resources, small, self.vocab_width), tokenizer

    def _evaluate_proxy(
        self,
        server: ServerContext,
        records: Sequence[Record],
        alpha: float,
        rnd: int,
        settings: Any,
        adapter: Mapping[str, np.ndarray] | None = None,
    ) -> EvalResult:
        """The proxy over ``adapter`` (default: Alg. 1's output, the aggregate before distillation)."""
        proxy, tokenizer = self._proxy(server, adapter)
        return evaluate_proxy(
            proxy,
            tokenizer,
            records,
            alpha,
            settings,
            template=self.cfg.data.template,
            max_length=self.cfg.data.max_length,
            seed=derive_seed(self.cfg.seed, rnd, "eval"),
        )

    def evaluate(self, rnd: int, server: ServerContext, fed: Federation, eval_set: EvalSet) -> EvalResult:
        before = api_usage(self.large(server))
        alpha = self._alpha(rnd, server)
        result = self._evaluate_proxy(server, eval_set.records, alpha, rnd, self.cfg.eval)
        distilled = self.section.eval_distilled and self.section.distill
        if distilled:  # the variant: the proxy over the small LM after the round's distillation
            after = self._evaluate_proxy(
                server, eval_set.records, alpha, rnd, self.cfg.eval, self.global_adapter
            )
            result = merge_results(result, prefixed(after, "distilled/"))
        result.metrics.update(self._api_cost(server, before))  # the alpha search's and decoding's requests
        if not eval_set.name:  # the alpha study belongs to the primary test set's row only
            result.metrics["alpha"] = alpha
            for candidate, score in self.alpha_study.get(rnd, {}).items():
                result.metrics[f"alpha_study/{candidate}"] = score
        if not self.section.eval_small:
            return result
        model, tokenizer = server.resources.lora_lm()
        load_adapter(model, self.aggregated_adapter)
        small = evaluate_model(self.cfg, model, tokenizer, eval_set.records, rnd)
        result = merge_results(result, prefixed(small, "small/"))
        if distilled:
            load_adapter(model, self.global_adapter)
            small = evaluate_model(self.cfg, model, tokenizer, eval_set.records, rnd)
            result = merge_results(result, prefixed(small, "distilled/small/"))
        return result

    # ----- state and the final model --------------------------------------------------------------
    def final_adapter(self) -> dict[str, np.ndarray]:
        """Alg. 1's output small LM: the last aggregate, before its distillation."""
        return self.aggregated_adapter

    @classmethod
    def final_model(cls, run: FinalRun) -> FinalModel:
        return final_model(run.cfg, run.run_dir, run.variant, run.options)

    @classmethod
    def export_final(cls, run: FinalRun, fmt: str, out: Path) -> Exported:
        """The small LM with its federated adapter (the ``small`` variant; ``small-distilled`` for the
        ``*-distilled`` variants) whatever the variant: the proxy-tuned model is the large LM steered at
        decoding time by the small LM's shift, not one set of weights to write. ``proxy.json`` (the
        run's alpha and large model) goes beside it."""
        distilled = run.variant is not None and run.variant.endswith("-distilled")
        small = "small-distilled" if distilled else "small"
        final = cls.final_model(full_precision(replace(run, variant=small)))
        exported = export_causal_lm(final, fmt, out, "FedPT's small LM")
        saved = run.run_dir / "artifacts" / PROXY_FILE
        if saved.is_file():
            shutil.copyfile(saved, out / f"fedpt-{PROXY_FILE}")
        large = run.cfg.section("fedpt").large_model
        return Exported(
            f"{exported.what}. FedPT's final model, the proxy-tuned {large!r}, is not one set of weights: it "
            f"is {large!r} steered while decoding by this model's shift (alpha in fedpt-{PROXY_FILE}; "
            "`fedtune generate` runs it)",
            exported.causal_lm,
        )

    def write_artifacts(self, directory: Path) -> None:
        last = max(self.alphas) if self.alphas else None
        alpha = self.alphas[last] if last is not None else self.section.alpha
        write_proxy_json(directory, alpha, self.section.large_model, self.vocab_width, self.alpha_study)
        # The variants *-distilled: the small LM after the last round's distillation.
        model, _ = self._resources.lora_lm()
        load_adapter(model, self.global_adapter)
        save_peft_adapter(model, directory / DISTILLED_ADAPTER, base_model_of(self.cfg.model))

    def state_dict(self) -> dict[str, Any]:
        return {
            "global_adapter": self.global_adapter,
            "aggregated_adapter": self.aggregated_adapter,
            "alphas": {str(k): v for k, v in self.alphas.items()},
            "alpha_study": {str(k): v for k, v in self.alpha_study.items()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.global_adapter = {k: np.asarray(v) for k, v in state["global_adapter"].items()}
        # A checkpoint written before the aggregate was kept: the distilled state stands in for it.
        aggregated = state.get("aggregated_adapter", state["global_adapter"])
        self.aggregated_adapter = {k: np.asarray(v) for k, v in aggregated.items()}
        self.alphas = {int(k): float(v) for k, v in state.get("alphas", {}).items()}
        self.alpha_study = {int(k): dict(v) for k, v in state.get("alpha_study", {}).items()}
