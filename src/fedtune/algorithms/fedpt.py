"""FedPT: federated proxy-tuning of a black-box large LM (paper 000, Alg. 1; docs/methods.md).

Round t:
1. sample K clients and send them the small LM's LoRA state theta_s^t;
2. each client runs E local epochs of response-only SFT and returns its LoRA state (FedIT's task);
3. the server averages them weighted by example count -> theta_bar_s^{t+1};
4. the proxy-tuned large LM is ``z_l0 + alpha * (z_sbar - z_s0)`` (``fedtune.proxy.proxy_logits``);
5. the server distils it into theta_bar_s^{t+1} on the public set D_kd (eq. 5):
   ``(1 - lambda) * CE(y | x; theta_s) + lambda * KL(p_proxy || p_theta_s)`` over response tokens,
   with Prodigy (lr 1.0) and a cosine schedule within the round by default. The result is theta_s^{t+1}.
``fedpt.distill: false`` skips step 5: the FedAvg+PT baseline.

The large model is reached only through ``LogitSource`` (next-token logits, never weights), and
clients only ever receive the small model's LoRA state.

Choices the paper leaves open:
- The frozen part of the teacher, ``C = z_l0 - alpha * z_s0`` at D_kd's response positions, never
  changes: it is computed once per run (``teacher_cache``: ``disk`` = fp16/fp32 files in the run
  directory, reused on resume; ``memory``; ``recompute`` recomputes every round, the benchmark yardstick).
  fp16 storage rounds logits of magnitude <= 32 by at most 0.008.
- ``z_sbar`` comes from the aggregated model theta_bar_s^{t+1}, fixed for the whole distillation;
  it is computed per batch by swapping theta_bar into the LoRA weights for one no-grad forward, so
  memory holds one batch of logits rather than the whole public set's.
- The KL term runs over the shared vocabulary, the CE term over the small model's own.
- alpha is an evaluation-time knob: ``alpha_grid`` is searched on the validation split at the
  final round (``alpha_search``), with ``alpha_search_seeds`` sampling seeds on the first
  ``alpha_search_examples`` validation examples, and the best value decodes the test sets.
  Round 0 (LoRA B = 0) is the base large model for any alpha.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor

from fedtune.algorithms.adapters import ADAPTER, collect_adapters, fit_adapter, fit_round_result
from fedtune.algorithms.base import Algorithm, RoundResult, derive_seed, evaluate_model
from fedtune.algorithms.final import (
    FinalModel,
    FinalModelError,
    check_options,
    check_variant,
    load_adapter_model,
)
from fedtune.config import AlgorithmConfig, ExperimentConfig, load_run_config
from fedtune.data.records import DataError, Record
from fedtune.data.templates import TemplateName
from fedtune.data.tokenize import encode_records, make_batches
from fedtune.eval.evaluate import (
    EvalResult,
    EvalSet,
    evaluate_generations,
    merge_results,
    perplexity_batches,
    prefixed,
)
from fedtune.eval.metrics import perplexity_from_nll
from fedtune.fl.aggregate import weighted_average
from fedtune.fl.federation import ClientContext, ClientTask, Federation, ServerContext
from fedtune.fl.payload import Payload, arrays
from fedtune.models.lora import adapter_arrays, load_adapter
from fedtune.models.spec import ModelSpec
from fedtune.proxy.source import LocalLogitSource, LogitSource
from fedtune.proxy.vocab import shared_vocab_size
from fedtune.resources import model_spec
from fedtune.train.losses import distillation_kl, labelled_logits
from fedtune.train.optim import build_optimizer, build_scheduler
from fedtune.train.teacher_cache import TeacherCache

if TYPE_CHECKING:
    from fedtune.proxy.decode import ProxyTunedLM

log = logging.getLogger("fedtune")

Batch = dict[str, Tensor]


def kd_loss(
    student: Tensor, targets: Tensor, teacher: Tensor, kd_lambda: float, vocab_width: int
) -> tuple[Tensor, float, float]:
    """Eq. 5 for one batch: ``((1 - lambda) * CE + lambda * KL(teacher || student)) / N``.

    ``student [N, V_s]`` logits (CE over the student's own vocabulary), ``teacher [N, V]`` proxy
    logits over the shared ``vocab_width``. Returns the loss and the mean CE and KL per token.
    """
    count = max(1, int(targets.numel()))
    ce = F.cross_entropy(student.float(), targets, reduction="sum")
    kl = distillation_kl(student[:, :vocab_width], teacher)
    loss = ((1.0 - kd_lambda) * ce + kd_lambda * kl) / count
    return loss, float(ce.detach()) / count, float(kl.detach()) / count


class FedPTConfig(AlgorithmConfig):
    """FedPT: clients tune the small LM (``model``); the server proxy-tunes ``large_model`` with it.

    ``distill: false`` is the FedAvg+PT baseline (no distillation step). ``alpha`` steers the
    distillation teacher and decoding; at evaluation ``alpha_grid`` is searched on the validation
    split (``alpha_search``) and the best value is used on the test sets.
    """

    large_model: str = "smollm2-135m-instruct"
    large_dtype: Literal["fp32", "bf16", "fp16"] = "fp32"
    distill: bool = True
    alpha: float = Field(1.0, ge=0)
    alpha_grid: list[float] = Field(default_factory=lambda: [1.0, 1.3, 1.5, 1.8, 2.0])
    alpha_search: Literal["final", "every", "never"] = "final"
    alpha_search_seeds: int = Field(1, ge=1)
    alpha_search_examples: int | None = Field(None, ge=1)
    kd_lambda: float = Field(0.1, ge=0, le=1)
    kd_examples: int = Field(128, ge=1)
    kd_batch_size: int = Field(16, ge=1)
    kd_steps: int = Field(8, ge=1)
    kd_optimizer: Literal["adamw", "sgd", "prodigy"] = "prodigy"
    kd_lr: float = Field(1.0, gt=0)
    kd_weight_decay: float = Field(0.01, ge=0)
    kd_schedule: Literal["constant", "cosine", "linear"] = "cosine"
    # The distillation's own optimiser settings (the defaults are train's defaults, as before).
    kd_betas: tuple[float, float] = (0.9, 0.999)
    kd_momentum: float = Field(0.0, ge=0)
    kd_warmup_ratio: float = Field(0.0, ge=0, lt=1)
    kd_min_lr_ratio: float = Field(0.0, ge=0, le=1)
    kd_clip_norm: float | None = Field(1.0, gt=0)
    teacher_cache: Literal["disk", "memory", "recompute"] = "disk"
    teacher_dtype: Literal["fp16", "fp32"] = "fp16"
    eval_small: bool = True


class FedPT(Algorithm[FedPTConfig]):
    name = "fedpt"
    Config = FedPTConfig

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        self.global_adapter: dict[str, np.ndarray] = {}
        self.alphas: dict[int, float] = {}
        self.alpha_study: dict[int, dict[str, float]] = {}
        self.vocab_width = 0
        self._kd_batches: list[Batch] = []
        self._teacher: TeacherCache | None = None

    # ----- clients: FedIT's local SFT of the small LM ---------------------------------------------
    def client_tasks(self) -> dict[str, ClientTask]:
        return {"fit": self._fit}

    def _fit(self, ctx: ClientContext, msg: Payload) -> Payload:
        return fit_adapter(ctx, arrays(msg, ADAPTER), prox_mu=0.0)

    # ----- server ---------------------------------------------------------------------------------
    def large_spec(self) -> ModelSpec:
        """The black-box large LM: its own name and dtype, the run's device, cache and seed."""
        sec: FedPTConfig = self.section
        return model_spec(self.cfg.model, self.cfg.seed).replace(
            name=sec.large_model, dtype=sec.large_dtype, gguf_file=None
        )

    def large(self, server: ServerContext) -> LogitSource:
        spec = self.large_spec()

        def build() -> LogitSource:
            model, tokenizer = server.resources.model(spec, copy="fedpt/large")
            return LocalLogitSource(model, tokenizer, spec.name)

        return server.resources.get("fedpt/large", build)

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
        if sec.distill:
            self._kd_batches = self._public_batches(server)
            self._teacher = TeacherCache(
                sec.teacher_cache,
                server.run_dir / "cache" / "fedpt-teacher",
                {
                    "small": self.cfg.model.name,
                    "large": sec.large_model,
                    "alpha": sec.alpha,
                    "dtype": sec.teacher_dtype,
                    "kd_examples": sec.kd_examples,
                    "kd_batch_size": sec.kd_batch_size,
                    "max_length": self.cfg.data.max_length,
                    "template": self.cfg.data.template,
                    "dataset": self.cfg.data.dataset,
                    "seed": self.cfg.seed,
                    "vocab_width": self.vocab_width,
                },
                sec.teacher_dtype,
            )

    def _public_batches(self, server: ServerContext) -> list[Batch]:
        sec: FedPTConfig = self.section
        records = list(server.public_records)
        if not records:
            raise DataError(
                f"fedpt distils on a public set, but data.dataset {self.cfg.data.dataset!r} has no "
                "'public' split; use a built-in dataset or set fedpt.distill=false (FedAvg+PT)"
            )
        if len(records) > sec.kd_examples:
            records = random.Random(derive_seed(self.cfg.seed, "kd-sample")).sample(records, sec.kd_examples)
        _, tokenizer = server.resources.lora_lm()
        examples = encode_records(records, tokenizer, self.cfg.data.template, self.cfg.data.max_length)
        pad = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
        return make_batches(
            examples, sec.kd_batch_size, pad, seed=derive_seed(self.cfg.seed, "kd"), bucketing=True
        )

    def run_round(self, rnd: int, server: ServerContext, fed: Federation) -> RoundResult:
        message: Payload = {ADAPTER + k: v for k, v in self.global_adapter.items()}
        sampled, replies, weights = collect_adapters(self, fed, rnd, self.global_adapter, message)
        average = weighted_average([arrays(r, ADAPTER) for r in replies.values()], weights)
        kd_stats: dict[str, float] = {}
        if self.section.distill:
            average, kd_stats = self._distill(rnd, server, average)
        self.global_adapter = average
        return fit_round_result(sampled, replies, weights, kd_stats)

    def _distill(
        self, rnd: int, server: ServerContext, average: Mapping[str, np.ndarray]
    ) -> tuple[dict[str, np.ndarray], dict[str, float]]:
        """Step 5: distil the proxy-tuned large LM into the aggregated small LM on D_kd."""
        sec: FedPTConfig = self.section
        assert self._teacher is not None
        start = time.perf_counter()
        teacher_before = self._teacher.compute_seconds
        # LoRA dropout draws from torch's global RNG: seed it here, or the distillation depends on
        # whatever ran before in this process (the clients' local SFT in simulation, nothing on Flower).
        torch.manual_seed(derive_seed(self.cfg.seed, rnd, "kd-dropout"))
        model, _ = server.resources.lora_lm()
        large = self.large(server)
        load_adapter(model, average)
        trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
        theta_bar = {n: p.detach().clone() for n, p in trainable.items()}
        optimizer = build_optimizer(
            trainable.values(),
            sec.kd_optimizer,
            lr=sec.kd_lr,
            weight_decay=sec.kd_weight_decay,
            betas=sec.kd_betas,
            momentum=sec.kd_momentum,
        )
        scheduler = build_scheduler(
            optimizer,
            sec.kd_schedule,
            steps_this_round=sec.kd_steps,
            rnd=rnd,
            rounds=self.cfg.fed.rounds,
            scope="round",
            warmup_ratio=sec.kd_warmup_ratio,
            min_ratio=sec.kd_min_lr_ratio,
        )
        order = np.random.default_rng(derive_seed(self.cfg.seed, rnd, "kd-order")).permutation(
            len(self._kd_batches)
        )
        device = next(model.parameters()).device
        width = self.vocab_width
        ce_total = kl_total = student_seconds = 0.0
        for step in range(sec.kd_steps):
            index = int(order[step % len(order)])
            batch = {k: v.to(device) for k, v in self._kd_batches[index].items()}
            frozen = self._teacher.get(index, partial(self._frozen_teacher, model, large, batch))
            sbar = self._logits_with(model, trainable, theta_bar, batch)
            teacher = frozen.to(device) + sec.alpha * sbar[:, :width]
            student_start = time.perf_counter()
            model.train()
            optimizer.zero_grad(set_to_none=True)
            student, targets = labelled_logits(model, batch)
            loss, ce, kl = kd_loss(student, targets, teacher, sec.kd_lambda, width)
            loss.backward()
            if sec.kd_clip_norm:
                torch.nn.utils.clip_grad_norm_(list(trainable.values()), sec.kd_clip_norm)
            optimizer.step()
            scheduler.step()
            student_seconds += time.perf_counter() - student_start
            ce_total += ce
            kl_total += kl
            server.report(step + 1, sec.kd_steps, loss.item())
        model.eval()
        seconds = time.perf_counter() - start
        return dict(adapter_arrays(model)), {
            "kd_ce": ce_total / sec.kd_steps,
            "kd_kl": kl_total / sec.kd_steps,
            "kd_seconds": seconds,
            "kd_student_seconds": student_seconds,
            "teacher_seconds": self._teacher.compute_seconds - teacher_before,
        }

    def _frozen_teacher(self, model: Any, large: LogitSource, batch: Batch) -> Tensor:
        """``z_l0 - alpha * z_s0`` at the labelled positions (the part of the teacher that never changes)."""
        width = self.vocab_width
        z_large = large.labelled_logits(batch)[:, :width]
        if self.section.alpha == 0.0:
            return z_large
        model.eval()
        with torch.inference_mode(), model.disable_adapter():
            z_base, _ = labelled_logits(model, batch)
        return z_large - self.section.alpha * z_base[:, :width].float()

    @staticmethod
    def _logits_with(
        model: Any, trainable: Mapping[str, Tensor], weights: Mapping[str, Tensor], batch: Batch
    ) -> Tensor:
        """The model's labelled logits with ``weights`` swapped into its trainable tensors.

        Eval mode (no LoRA dropout) and no grad; the current weights are restored afterwards.
        """
        model.eval()
        with torch.no_grad():
            current = {n: p.detach().clone() for n, p in trainable.items()}
            for name, param in trainable.items():
                param.copy_(weights[name])
            try:
                logits, _ = labelled_logits(model, batch)
            finally:
                for name, param in trainable.items():
                    param.copy_(current[name])
        return logits.float()

    # ----- evaluation -----------------------------------------------------------------------------
    def proxy_model(self, server: ServerContext) -> Any:
        """The proxy-tuned LM with the current global adapter (built once; the adapter is reloaded)."""
        from fedtune.proxy.decode import ProxyTunedLM

        model, tokenizer = server.resources.lora_lm()
        load_adapter(model, self.global_adapter)
        return server.resources.get(
            "fedpt/proxy",
            lambda: ProxyTunedLM(
                self.large(server), model, tokenizer, alpha=self.section.alpha, vocab_width=self.vocab_width
            ),
        )

    def _alpha(self, rnd: int, server: ServerContext) -> float:
        sec: FedPTConfig = self.section
        if rnd in self.alphas:
            return self.alphas[rnd]
        search = rnd > 0 and (
            sec.alpha_search == "every" or (sec.alpha_search == "final" and rnd == self.cfg.fed.rounds)
        )
        alpha = sec.alpha
        if search and not server.validation_records:
            log.warning("fedpt: no validation split to search alpha on; using fedpt.alpha = %s", alpha)
        elif search:
            settings = self.cfg.eval.model_copy(update={"seeds": sec.alpha_search_seeds})
            metric = next((m for m in settings.metrics if m != "perplexity"), "perplexity")
            scores: dict[str, float] = {}
            records = server.validation_records[: sec.alpha_search_examples]
            for candidate in sec.alpha_grid:
                result = self._evaluate_proxy(server, records, candidate, rnd, settings)
                scores[f"{candidate:g}"] = result.metrics[metric]
            better = min if metric == "perplexity" else max
            alpha = float(better(scores, key=lambda a: scores[a]))
            self.alpha_study[rnd] = scores
            log.info("fedpt round %d: validation %s by alpha %s -> alpha %g", rnd, metric, scores, alpha)
        self.alphas[rnd] = alpha
        return alpha

    def _evaluate_proxy(
        self, server: ServerContext, records: Sequence[Record], alpha: float, rnd: int, settings: Any
    ) -> EvalResult:
        _, tokenizer = server.resources.lora_lm()
        return evaluate_proxy(
            self.proxy_model(server),
            tokenizer,
            records,
            alpha,
            settings,
            template=self.cfg.data.template,
            max_length=self.cfg.data.max_length,
            seed=derive_seed(self.cfg.seed, rnd, "eval"),
        )

    def evaluate(self, rnd: int, server: ServerContext, fed: Federation, eval_set: EvalSet) -> EvalResult:
        alpha = self._alpha(rnd, server)
        result = self._evaluate_proxy(server, eval_set.records, alpha, rnd, self.cfg.eval)
        if not eval_set.name:  # the alpha study belongs to the primary test set's row only
            result.metrics["alpha"] = alpha
            for candidate, score in self.alpha_study.get(rnd, {}).items():
                result.metrics[f"alpha_study/{candidate}"] = score
        if not self.section.eval_small:
            return result
        model, tokenizer = server.resources.lora_lm()
        load_adapter(model, self.global_adapter)
        small = evaluate_model(self.cfg, model, tokenizer, eval_set.records, rnd)
        return merge_results(result, prefixed(small, "small/"))

    # ----- state and artifacts --------------------------------------------------------------------
    final_variants = ("proxy", "small")
    """``proxy``: the proxy-tuned large LM (FedPT's output); ``small``: the small LM with its adapter."""
    final_options = ("alpha",)
    """``alpha``: the proxy's strength (default: the run's chosen alpha, then ``fedpt.alpha``)."""

    def final_adapter(self) -> dict[str, np.ndarray]:
        return self.global_adapter

    @classmethod
    def load_final(
        cls,
        cfg: ExperimentConfig,
        run_dir: Path,
        variant: str | None = None,
        options: Mapping[str, str] | None = None,
    ) -> FinalModel:
        variant = check_variant(cls.name, cls.final_variants, variant)
        options = dict(options or {})
        check_options(cls.name, cls.final_options, options)
        if variant == "small":
            if options:
                raise FinalModelError("alpha applies to the proxy-tuned model (--variant proxy) only")
            return load_adapter_model(cfg, run_dir)
        alpha = None
        if "alpha" in options:
            try:
                alpha = float(options["alpha"])
            except ValueError:
                raise FinalModelError(f"--option alpha={options['alpha']!r} is not a number") from None
        proxy, _ = load_proxy_model(run_dir, alpha)
        return ProxyModel(cfg, proxy)

    def write_artifacts(self, directory: Path) -> None:
        last = max(self.alphas) if self.alphas else None
        alpha = self.alphas[last] if last is not None else self.section.alpha
        (directory / "proxy.json").write_text(
            json.dumps(
                {
                    "alpha": alpha,
                    "large_model": self.section.large_model,
                    "vocab_width": self.vocab_width,
                    "alpha_study": {str(k): v for k, v in self.alpha_study.items()},
                },
                indent=1,
            )
        )

    def state_dict(self) -> dict[str, Any]:
        return {
            "global_adapter": self.global_adapter,
            "alphas": {str(k): v for k, v in self.alphas.items()},
            "alpha_study": {str(k): v for k, v in self.alpha_study.items()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.global_adapter = {k: np.asarray(v) for k, v in state["global_adapter"].items()}
        self.alphas = {int(k): float(v) for k, v in state.get("alphas", {}).items()}
        self.alpha_study = {int(k): dict(v) for k, v in state.get("alpha_study", {}).items()}


def evaluate_proxy(
    proxy: ProxyTunedLM,
    tokenizer: Any,
    records: Sequence[Record],
    alpha: float,
    settings: Any,
    *,
    template: TemplateName,
    max_length: int,
    seed: int,
) -> EvalResult:
    """The proxy-tuned LM at strength ``alpha`` on ``records``: generation metrics, and perplexity
    from its labelled logits when ``settings.metrics`` asks for it."""

    def generate(prompts: Sequence[str], sample_seed: int) -> list[str]:
        texts: list[str] = proxy.generate(
            list(prompts),
            max_new_tokens=settings.max_new_tokens,
            batch_size=settings.batch_size,
            temperature=settings.temperature,
            top_p=settings.top_p,
            seed=sample_seed,
            alpha=alpha,
        )
        return texts

    result = evaluate_generations(generate, tokenizer, records, settings, template=template, seed=seed)
    if "perplexity" in settings.metrics:
        batches = perplexity_batches(records, tokenizer, settings, template=template, max_length=max_length)
        total_nll, total_tokens = 0.0, 0
        for batch in batches:
            logits = proxy.labelled_logits(batch, alpha=alpha)
            targets = batch["labels"][:, 1:][batch["labels"][:, 1:] != -100].to(logits.device)
            total_nll += float(F.cross_entropy(logits.float(), targets, reduction="sum"))
            total_tokens += int(targets.numel())
        result.metrics["perplexity"] = float(perplexity_from_nll(total_nll, total_tokens))
    return result


class ProxyModel(FinalModel):
    """A finished FedPT run's output: the proxy-tuned large LM."""

    def __init__(self, cfg: ExperimentConfig, proxy: ProxyTunedLM) -> None:
        super().__init__(cfg, proxy.tokenizer)
        self.proxy = proxy

    def evaluate(self, records: list[Record]) -> EvalResult:
        cfg = self.cfg
        return evaluate_proxy(
            self.proxy,
            self.tokenizer,
            records,
            self.proxy.alpha,
            cfg.eval,
            template=cfg.data.template,
            max_length=cfg.data.max_length,
            seed=cfg.seed,
        )

    def generate(
        self, prompts: list[str], *, max_new_tokens: int, temperature: float, top_p: float, seed: int
    ) -> list[str]:
        texts: list[str] = self.proxy.generate(
            prompts, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed
        )
        return texts


def load_proxy_model(run_dir: Path, alpha: float | None = None) -> tuple[ProxyTunedLM, ExperimentConfig]:
    """The proxy-tuned LM of a finished FedPT run, and the run's config.

    ``alpha``: the explicit argument, else the one the run chose (``artifacts/proxy.json``), else
    the config's ``fedpt.alpha``.
    """
    from fedtune.proxy.decode import ProxyTunedLM
    from fedtune.proxy.source import LocalLogitSource

    cfg = load_run_config(run_dir)
    small = load_adapter_model(cfg, run_dir)
    section = cfg.section("fedpt")
    large = LocalLogitSource.load(
        section.large_model,
        dtype=section.large_dtype,
        device=cfg.model.device,
        cache_dir=None if cfg.model.cache_dir is None else Path(cfg.model.cache_dir).expanduser(),
        seed=cfg.seed,
    )
    if alpha is None:
        alpha = _saved_alpha(run_dir / "artifacts" / "proxy.json", section.large_model)
    proxy = ProxyTunedLM(large, small.model, small.tokenizer, section.alpha if alpha is None else alpha)
    return proxy, cfg


def _saved_alpha(path: Path, large_model: str) -> float | None:
    if not path.is_file():
        return None
    saved = json.loads(path.read_text())
    if saved.get("large_model", large_model) != large_model:
        raise FinalModelError(
            f"{path} was written for large model {saved['large_model']!r}, but the run's config "
            f"names {large_model!r}"
        )
    return float(saved["alpha"])
