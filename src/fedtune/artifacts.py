"""Load what a run produced (base model + final adapter) for evaluation and generation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedtune.config import ExperimentConfig, load_run_config
from fedtune.data.records import Record
from fedtune.data.templates import build_prompt
from fedtune.eval.evaluate import EvalResult, evaluate_lm
from fedtune.resources import model_spec

if TYPE_CHECKING:
    from fedtune.proxy.decode import ProxyTunedLM

FEDBIOT_MODELS = ("full", "emulator")
"""FedBiOT's two final models: the adapter on the full model (AdapFu) or on the emulator (AdapEmu)."""


def load_base_model(cfg: ExperimentConfig) -> tuple[Any, Any]:
    """The run's base model and tokenizer, from where the run loaded them (cache dir, GGUF file)."""
    return model_spec(cfg.model, cfg.seed).load_causal_lm()


def load_final_model(run_dir: Path, fedbiot_model: str = "full") -> tuple[Any, Any, ExperimentConfig]:
    """(model with the final adapter, tokenizer, run config); a clear error if the run has none.

    For a FedBiOT run ``fedbiot_model`` picks the adapter on the full model (``full``, AdapFu) or on
    the emulator (``emulator``, AdapEmu).
    """
    from peft import PeftModel

    cfg = load_run_config(run_dir)
    if fedbiot_model not in FEDBIOT_MODELS:
        raise ValueError(f"unknown FedBiOT model {fedbiot_model!r}; choose {' or '.join(FEDBIOT_MODELS)}")
    if cfg.algorithm == "fedbiot":
        from fedtune.algorithms.fedbiot import load_final_fedbiot

        model, tokenizer = load_base_model(cfg)
        return load_final_fedbiot(cfg, model, run_dir, fedbiot_model == "emulator"), tokenizer, cfg
    if fedbiot_model != "full":
        raise ValueError("the emulator model exists for FedBiOT runs only")
    adapter_dir = run_dir / "artifacts" / "adapter"
    if not (adapter_dir / "adapter_config.json").is_file():
        raise FileNotFoundError(
            f"{adapter_dir} has no adapter: did the run finish? (`fedtune resume {run_dir}`)"
        )
    model, tokenizer = load_base_model(cfg)
    tuned = PeftModel.from_pretrained(model, str(adapter_dir)).eval()
    return tuned, tokenizer, cfg


def evaluate_run(
    run_dir: Path, split: str | None = None, max_examples: int | None = None, fedbiot_model: str = "full"
) -> EvalResult:
    from fedtune.data.rundata import prepare_data

    cfg = load_run_config(run_dir)
    if split:
        cfg.data.eval_split = split
    if max_examples:
        cfg.eval.max_examples = max_examples
    data = prepare_data(cfg)
    if cfg.algorithm == "fedpft":  # a sequence classifier: accuracy and macro-F1
        from fedtune.algorithms.fedpft.final import evaluate_final_fedpft

        result = evaluate_final_fedpft(cfg, run_dir, data.eval_records)
    else:
        model, tokenizer, _ = load_final_model(run_dir, fedbiot_model)
        result = evaluate_lm(
            model,
            tokenizer,
            data.eval_records,
            cfg.eval,
            template=cfg.data.template,
            max_length=cfg.data.max_length,
            seed=cfg.seed,
        )
    summary = {
        "split": cfg.data.eval_split,
        "examples": len(data.eval_records),
        "metrics": result.metrics,
        "by_category": result.by_category,
        "samples": result.samples,
    }
    (run_dir / "eval.json").write_text(json.dumps(summary, indent=1))
    return result


def _templated(prompts: list[str], cfg: ExperimentConfig, tokenizer: Any) -> list[str]:
    return [build_prompt(Record(p, "-"), cfg.data.template, tokenizer) for p in prompts]


def generate_from_run(
    run_dir: Path,
    prompts: list[str],
    *,
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int = 0,
    raw: bool = False,
    alpha: float | None = None,
    fedbiot_model: str = "full",
) -> list[str]:
    """Generate with a run's final model: for FedPT runs the proxy-tuned large LM (``alpha``
    overrides the run's choice), else the small model with its adapter."""
    from fedtune.decode.generate import generate_texts

    if load_run_config(run_dir).algorithm == "fedpt":
        proxy, cfg = load_proxy_model(run_dir, alpha)
        texts = prompts if raw else _templated(prompts, cfg, proxy.tokenizer)
        return proxy.generate(
            texts, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed
        )
    if alpha is not None:
        raise ValueError("alpha applies to FedPT runs only (proxy-tuned decoding)")
    if load_run_config(run_dir).algorithm == "fedpft":
        raise ValueError(
            f"{run_dir} is a FedPFT run: its model classifies, it does not generate (`fedtune eval`)"
        )
    model, tokenizer, cfg = load_final_model(run_dir, fedbiot_model)
    texts = prompts if raw else _templated(prompts, cfg, tokenizer)
    return generate_texts(
        model,
        tokenizer,
        texts,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        seed=seed,
    )


def load_proxy_model(run_dir: Path, alpha: float | None = None) -> tuple[ProxyTunedLM, ExperimentConfig]:
    """The proxy-tuned LM of a finished FedPT run, and the run's config.

    ``alpha``: the explicit argument, else the one the run chose (``artifacts/proxy.json``), else
    the config's ``fedpt.alpha``.
    """
    from fedtune.proxy.decode import ProxyTunedLM
    from fedtune.proxy.source import LocalLogitSource

    small, tokenizer, cfg = load_final_model(run_dir)
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
    return ProxyTunedLM(large, small, tokenizer, section.alpha if alpha is None else alpha), cfg


def _saved_alpha(path: Path, large_model: str) -> float | None:
    if not path.is_file():
        return None
    saved = json.loads(path.read_text())
    if saved.get("large_model", large_model) != large_model:
        raise ValueError(
            f"{path} was written for large model {saved['large_model']!r}, but the run's config "
            f"names {large_model!r}"
        )
    return float(saved["alpha"])
