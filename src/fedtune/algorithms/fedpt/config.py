"""FedPT's config section ``fedpt:``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import Field, field_validator

from fedtune.config import AlgorithmConfig
from fedtune.proxy.api_url import check_api_url, is_api_url

SearchMetric = Literal[
    "rougeL", "dist3", "dist4", "exact_match", "numeric_accuracy", "pass_at_1", "perplexity"
]


class FedPTConfig(AlgorithmConfig):
    """FedPT: clients tune the small LM (``model``); the server proxy-tunes ``large_model`` with it.

    ``distill: false`` is the FedAvg+PT baseline (no distillation step). At evaluation ``alpha_grid`` is
    searched on the validation split (``alpha_search``) and the best value is used on the test sets and,
    from the next round on, in the distillation teacher (``teacher_alpha``); ``alpha`` is used before
    any search and wherever none runs.

    ``large_model`` is a model (loaded in the server's process) or the URL of an OpenAI-compatible API
    serving it with prompt log-probabilities (``http://host:port/v1``: vLLM, or ``fedtune serve MODEL``),
    reached through ``fedtune.proxy.http_source.HTTPLogitSource``: ``large_model_name`` names the served
    model (default: the server's first), ``top_k`` how many log-probabilities per position it returns
    (the rest is filled from the residual mass, docs/serving.md), and ``api_*`` how requests are sent.
    The bearer token, if the server wants one, comes from the environment (``FEDTUNE_LARGE_API_KEY``).
    """

    # The small LM's LoRA is aggregated through Algorithm.aggregate; the distillation uses public data.
    dp_refused = None

    large_model: str = "smollm2-135m-instruct"
    """The black-box large LM the server proxy-tunes (same vocabulary as `model:`): a model, or the URL of
    an API serving its log-probabilities (`http://host:port/v1`; docs/serving.md)."""
    large_model_name: str | None = None
    """With an API: the served model's name (default: the first the server lists)."""
    top_k: int = Field(20, ge=1)
    """With an API: log-probabilities asked per position (at most the server's `--max-logprobs`); the
    rest of the vocabulary is filled from the residual mass."""
    api_timeout: float = Field(60.0, gt=0)
    """With an API: seconds one attempt of a request may take in all (connect, send, the whole answer): a
    deadline, not a gap between bytes."""
    api_retries: int = Field(4, ge=0)
    """With an API: retries of a request that failed to connect, timed out or got 408/429/5xx."""
    api_backoff: float = Field(0.5, ge=0)
    """With an API: seconds before the first retry, doubled for each next one."""
    api_concurrency: int = Field(4, ge=1)
    """With an API: batch rows in flight at once."""
    large_dtype: Literal["fp32", "bf16", "fp16"] = "fp32"
    """The large model's dtype."""
    distill: bool = True
    """`false`: the FedAvg+PT baseline (no distillation step)."""
    alpha: float = Field(1.0, ge=0)
    """Proxy strength in decoding when not searched, and in the distillation teacher until the first search
    (always, with `teacher_alpha: fixed`)."""
    teacher_alpha: Literal["searched", "fixed"] = "searched"
    """The distillation teacher's alpha: `searched` = the alpha the latest search so far chose (the one
    decoding uses; `alpha` before any search); `fixed` = `alpha` every round, an ablation (and what runs
    before this key existed used)."""
    alpha_grid: list[float] = Field(default_factory=lambda: [1.0, 1.3, 1.5, 1.8, 2.0])
    """The alpha values searched on the validation split."""
    alpha_search: Literal["final", "every", "never"] = "final"
    """When alpha is searched: at the final round, every eval round or never."""
    alpha_search_seeds: int = Field(1, ge=1)
    """Sampling seeds per alpha candidate in the search."""
    alpha_search_examples: int | None = Field(None, ge=1)
    """Validation examples the search reads (`null`: all)."""
    # the proxy is scored by generation or perplexity; multiple-choice metrics do not apply to it
    alpha_search_metric: SearchMetric | None = None
    """The validation metric alpha is picked by (lowest perplexity, else highest score); null: the first
    generation metric of `eval.metrics` (perplexity when it lists none)."""
    kd_lambda: float = Field(0.1, ge=0, le=1)
    """Weight of the KL term in the distillation loss (1 - lambda on the CE term)."""
    public_dataset: str | None = None
    """The public set the proxy is distilled on: a built-in dataset (its `public` split), `all` (every
    built-in public split) or a file; null: the training dataset's public split."""
    kd_examples: int = Field(128, ge=1)
    """Public examples distilled on."""
    kd_batch_size: int = Field(16, ge=1)
    """Public examples per distillation step."""
    kd_steps: int = Field(8, ge=1)
    """Distillation steps per round."""
    kd_optimizer: Literal["adamw", "sgd", "prodigy"] = "prodigy"
    """The distillation's optimizer."""
    kd_lr: float = Field(1.0, gt=0)
    """The distillation's learning rate."""
    kd_weight_decay: float = Field(0.01, ge=0)
    """The distillation's weight decay."""
    kd_schedule: Literal["constant", "cosine", "linear"] = "cosine"
    """The distillation's learning-rate schedule within a round."""
    # The distillation's own optimiser settings (the defaults are train's defaults, as before).
    kd_betas: tuple[float, float] = (0.9, 0.999)
    kd_momentum: float = Field(0.0, ge=0)
    """The distillation's SGD momentum."""
    kd_warmup_ratio: float = Field(0.0, ge=0, lt=1)
    """The distillation's warm-up share."""
    kd_min_lr_ratio: float = Field(0.0, ge=0, le=1)
    """The distillation's final learning rate as a share of `kd_lr`."""
    kd_clip_norm: float | None = Field(1.0, gt=0)
    """The distillation's gradient clipping."""
    teacher_cache: Literal["disk", "memory", "recompute"] = "disk"
    """Where the frozen teacher logits are kept: computed once per run on disk or in memory, or recomputed
    every round."""
    teacher_dtype: Literal["fp16", "fp32"] = "fp16"
    """Storage dtype of the cached teacher logits."""
    eval_small: bool = True
    """Also evaluate the small model alone (metrics `small/<metric>`)."""
    # Also evaluate the proxy over the small model after the round's distillation (``distilled/``
    # metrics; the output of Alg. 1, evaluated without prefix, is the proxy over the aggregate before it).
    eval_distilled: bool = False

    def search_metric(self, eval_metrics: Sequence[str]) -> str:
        """The metric alpha is searched by: `alpha_search_metric`, else the first generation metric of
        ``eval_metrics`` (perplexity when there is none)."""
        return self.alpha_search_metric or next((m for m in eval_metrics if m != "perplexity"), "perplexity")

    @field_validator("large_model")
    @classmethod
    def _large_model(cls, value: str) -> str:
        return check_api_url(value) if is_api_url(value) else value
