"""FedPT's proxy-tuned large LM, during a run and after it.

A finished run's model is the proxy-tuned large LM (``proxy``) or the small LM (``small``), both over
Alg. 1's output: the last round's aggregate before its distillation (``artifacts/adapter``). The
variants ``proxy-distilled`` / ``small-distilled`` use the small LM after that distillation
(``artifacts/adapter-distilled``).

``artifacts/proxy.json`` records what the proxy needs beyond the small LM's adapter: the alpha the
run chose, the large model it was chosen for, the shared vocabulary width and the alpha study.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch.nn.functional as F
from torch import Tensor

from fedtune.algorithms.final import (
    ADAPTER_DIR,
    Decoder,
    FinalModel,
    FinalModelError,
    load_adapter_model,
)
from fedtune.config import ExperimentConfig, load_run_config
from fedtune.data.records import Record
from fedtune.data.templates import TemplateName
from fedtune.eval.evaluate import EvalResult, evaluate_generations, perplexity_batches
from fedtune.eval.metrics import perplexity_from_nll
from fedtune.models.lora import load_adapter
from fedtune.proxy.api_url import is_api_url
from fedtune.proxy.http_source import API_KEY_ENV, HTTPLogitSource, HTTPSettings
from fedtune.proxy.source import LocalLogitSource, LogitSource
from fedtune.resources import Resources, model_spec

if TYPE_CHECKING:
    from fedtune.proxy.decode import ProxyTunedLM

PROXY_FILE = "proxy.json"
DISTILLED_ADAPTER = "adapter-distilled"
"""The peft directory (in ``artifacts/``) of the small LM after the last round's distillation."""


def large_source(cfg: ExperimentConfig, resources: Resources) -> LogitSource:
    """The black-box large LM (``fedpt.large_model`` in its own dtype, never quantised: it only
    serves logits on the server; the run's device, cache and seed) as a source of next-token logits,
    built once per process."""
    section = cfg.section("fedpt")
    if is_api_url(section.large_model):
        # Behind an API: the server's tokenizer is checked against the small model's, which it then uses.
        return resources.get(
            "fedpt/large", lambda: http_source(section, resources.tokenizer(resources.base_spec))
        )
    spec = model_spec(cfg.model, cfg.seed).replace(
        name=section.large_model, dtype=section.large_dtype, gguf_file=None, quantization=None
    )

    def build() -> LogitSource:
        model, tokenizer = resources.model(spec, copy="fedpt/large")
        return LocalLogitSource(model, tokenizer, spec.name)

    return resources.get("fedpt/large", build)


def http_source(section: Any, tokenizer: Any) -> HTTPLogitSource:
    """``fedpt.large_model`` as an API (``fedpt.large_model_name``, ``top_k``, ``api_*``; the bearer
    token from ``FEDTUNE_LARGE_API_KEY``), connected and its tokenizer checked against ``tokenizer``."""
    settings = HTTPSettings(
        top_k=section.top_k,
        timeout=section.api_timeout,
        retries=section.api_retries,
        backoff=section.api_backoff,
        concurrency=section.api_concurrency,
    )
    return HTTPLogitSource.connect(
        section.large_model,
        tokenizer,
        model=section.large_model_name,
        settings=settings,
        api_key=os.environ.get(API_KEY_ENV) or None,
    )


def proxy_lm(
    cfg: ExperimentConfig, resources: Resources, adapter: Mapping[str, Any], vocab_width: int
) -> ProxyTunedLM:
    """The proxy-tuned LM of a running job with ``adapter`` on the small LM (the proxy is built once
    per process; the adapter is loaded into the small LM every call)."""
    from fedtune.proxy.decode import ProxyTunedLM

    model, tokenizer = resources.lora_lm()
    load_adapter(model, adapter)
    alpha = cfg.section("fedpt").alpha
    return resources.get(
        "fedpt/proxy",
        lambda: ProxyTunedLM(
            large_source(cfg, resources), model, tokenizer, alpha=alpha, vocab_width=vocab_width
        ),
    )


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
        by_alpha = proxy_perplexities(
            proxy, tokenizer, records, [alpha], settings, template=template, max_length=max_length
        )
        result.metrics["perplexity"] = by_alpha[alpha]
    return result


def proxy_perplexities(
    proxy: ProxyTunedLM,
    tokenizer: Any,
    records: Sequence[Record],
    alphas: Sequence[float],
    settings: Any,
    *,
    template: TemplateName,
    max_length: int,
) -> dict[float, float]:
    """The proxy-tuned LM's perplexity on ``records``' references at each of ``alphas``: the three
    models run once a batch, whatever the number of alphas."""
    batches = perplexity_batches(records, tokenizer, settings, template=template, max_length=max_length)
    total_nll = dict.fromkeys(alphas, 0.0)
    total_tokens = 0
    for batch in batches:
        parts = proxy.labelled_parts(batch)
        targets = batch["labels"][:, 1:][batch["labels"][:, 1:] != -100].to(parts[1].device)
        for alpha in alphas:
            logits = proxy.combine(parts, alpha)
            total_nll[alpha] += float(F.cross_entropy(logits.float(), targets, reduction="sum"))
        total_tokens += int(targets.numel())
    return {alpha: float(perplexity_from_nll(nll, total_tokens)) for alpha, nll in total_nll.items()}


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

    def context_length(self) -> int | None:
        """The shorter of the small models' context and the large model's (its source's)."""
        from fedtune.decode.generate import context_length

        limits = (context_length(self.proxy.small), getattr(self.proxy.large, "max_model_len", None))
        known = [limit for limit in limits if limit is not None]
        return min(known) if known else None

    def labelled_logits(self, batch: Mapping[str, Tensor]) -> Tensor:
        """The proxy's logits ``z_large + alpha * (z_tuned - z_base)`` over the shared vocabulary, at the
        run's (or ``--option``'s) alpha: log-likelihoods of text under the proxy-tuned model."""
        logits: Tensor = self.proxy.labelled_logits(batch)
        return logits

    def decoder(self) -> Decoder:
        """Proxy-tuned decoding step by step: the large, tuned and base small models' logits combined."""
        proxy = self.proxy
        proxy.small.eval()
        return Decoder(lambda: proxy.step_fn(), proxy.eos_token_ids(), proxy.device)

    def generate(
        self, prompts: list[str], *, max_new_tokens: int, temperature: float, top_p: float, seed: int
    ) -> list[str]:
        texts: list[str] = self.proxy.generate(
            prompts, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed
        )
        return texts


def final_model(
    cfg: ExperimentConfig, run_dir: Path, variant: str | None, options: Mapping[str, str]
) -> FinalModel:
    """``FedPT.load_final`` (variant and option names checked): the proxy-tuned LM at the run's alpha
    or ``--option alpha=...``, or the small LM with its adapter; over Alg. 1's output small LM, or with
    ``*-distilled`` over the one after the last round's distillation. ``--option large_model=...``
    (a model or an API URL) and ``top_k=...`` reach the large model another way than the run did."""
    adapter = DISTILLED_ADAPTER if variant is not None and variant.endswith("-distilled") else ADAPTER_DIR
    if variant in ("small", "small-distilled"):
        if options:
            raise FinalModelError(
                f"--option {sorted(options)[0]} applies to the proxy-tuned model (--variant proxy) only"
            )
        return load_adapter_model(cfg, run_dir, adapter)
    alpha = _option_number(options, "alpha", float)
    top_k = _option_number(options, "top_k", int)
    if top_k is not None and top_k < 1:
        raise FinalModelError(f"--option top_k={options['top_k']!r} must be at least 1")
    proxy, _ = load_proxy_model(run_dir, alpha, adapter, large_model=options.get("large_model"), top_k=top_k)
    return ProxyModel(cfg, proxy)


def _option_number(options: Mapping[str, str], key: str, kind: type[float] | type[int]) -> Any:
    if key not in options:
        return None
    try:
        return kind(options[key])
    except ValueError:
        what = "a number" if kind is float else "an integer"
        raise FinalModelError(f"--option {key}={options[key]!r} is not {what}") from None


def load_proxy_model(
    run_dir: Path,
    alpha: float | None = None,
    adapter: str = ADAPTER_DIR,
    *,
    large_model: str | None = None,
    top_k: int | None = None,
) -> tuple[ProxyTunedLM, ExperimentConfig]:
    """The proxy-tuned LM of a finished FedPT run, and the run's config.

    ``alpha``: the explicit argument, else the one the run chose (``artifacts/proxy.json``), else
    the config's ``fedpt.alpha``. ``adapter``: the small LM's peft directory in ``artifacts/``
    (Alg. 1's output by default, `DISTILLED_ADAPTER` for the small LM after the last distillation).
    ``large_model`` / ``top_k`` replace ``fedpt.large_model`` / ``fedpt.top_k`` (e.g. the local weights
    of a model the run reached over HTTP); the run's chosen alpha still applies.
    """
    from fedtune.proxy.decode import ProxyTunedLM

    cfg = load_run_config(run_dir)
    small = load_adapter_model(cfg, run_dir, adapter)
    section = cfg.section("fedpt")
    ran_with = section.large_model
    if large_model is not None or top_k is not None:
        update = {"large_model": large_model or section.large_model, "top_k": top_k or section.top_k}
        section = section.model_copy(update=update)
    large: LogitSource
    if is_api_url(section.large_model):
        large = http_source(section, small.tokenizer)
    else:
        large = LocalLogitSource.load(
            section.large_model,
            dtype=section.large_dtype,
            device=cfg.model.device,
            cache_dir=None if cfg.model.cache_dir is None else Path(cfg.model.cache_dir).expanduser(),
            seed=cfg.seed,
        )
    if alpha is None:
        alpha = _saved_alpha(run_dir / "artifacts" / PROXY_FILE, ran_with)
    proxy = ProxyTunedLM(large, small.model, small.tokenizer, section.alpha if alpha is None else alpha)
    return proxy, cfg


def write_proxy_json(
    directory: Path,
    alpha: float,
    large_model: str,
    vocab_width: int,
    alpha_study: Mapping[int, Mapping[str, float]],
) -> None:
    """``proxy.json`` in ``directory`` (the run's ``artifacts/``), as ``load_proxy_model`` reads it."""
    (directory / PROXY_FILE).write_text(
        json.dumps(
            {
                "alpha": alpha,
                "large_model": large_model,
                "vocab_width": vocab_width,
                "alpha_study": {str(k): v for k, v in alpha_study.items()},
            },
            indent=1,
        )
    )


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
