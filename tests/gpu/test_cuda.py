"""The CUDA path: runs that must work on a GPU as they do on the CPU.

Every test here is marked ``gpu``; ``tests/conftest.py`` skips them with "needs a CUDA device" where
torch sees none, so they import and collect on any machine. ``scripts/gpu_check.sh`` runs them when a
GPU is at hand (``pytest -m gpu tests/gpu``).
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from fedtune.algorithms.registry import algorithm_names
from fedtune.models.loading import load_causal_lm
from fedtune.models.lora import adapter_parameters, attach_lora
from tests.integration.helpers import quiet_runner, tiny_config

pytestmark = pytest.mark.gpu

# CPU and CUDA runs of the same seeded job differ only in the order of float sums (cuBLAS vs the CPU's
# GEMM, atomics in some backward kernels), at fp32 and with TF32 off (torch's default for matmul). Over
# two rounds of three steps at lr 0.01 those last-digit differences grow, but stay far under 1e-3 of the
# perplexity, while a wrong device placement, a dtype mix-up or a lost gradient moves it by percents.
PERPLEXITY_REL = 1e-3


def _finite(history: list[dict[str, Any]]) -> bool:
    return all(math.isfinite(v) for row in history for v in row.get("eval", {}).values())


def test_a_tiny_fedit_run_on_cuda_matches_the_cpu_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prepare: the same job on either device, fp32 on both (``auto`` would pick bf16 on the GPU), and
    # TF32 off whatever the environment set (it would round matmul inputs to 10 mantissa bits)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    common = ("model.dtype=fp32", "eval.metrics=[perplexity]", "eval.every=1", "eval.before=true")
    cpu = tiny_config("fedit", "model.device=cpu", *common)
    cuda = tiny_config("fedit", "model.device=cuda", *common)
    # Execute
    on_cpu = quiet_runner(cpu, tmp_path / "cpu").run()
    on_cuda = quiet_runner(cuda, tmp_path / "cuda").run()
    # Assert: as many rows; each evaluated round's perplexity and train loss within the tolerance
    assert len(on_cuda) == len(on_cpu)
    evaluated = 0
    for row_cpu, row_cuda in zip(on_cpu, on_cuda, strict=True):
        if "eval" in row_cpu:
            expected = row_cpu["eval"]["perplexity"]
            assert row_cuda["eval"]["perplexity"] == pytest.approx(expected, rel=PERPLEXITY_REL)
            evaluated += 1
        if "train_loss" in row_cpu:
            assert row_cuda["train_loss"] == pytest.approx(row_cpu["train_loss"], rel=PERPLEXITY_REL)
    assert evaluated >= 2  # before training and after the last round at least


@pytest.mark.parametrize("algorithm", algorithm_names())
def test_every_method_runs_a_round_on_cuda(algorithm: str, tmp_path: Path) -> None:
    cfg = tiny_config(algorithm, "model.device=cuda", "fed.rounds=1")
    history = quiet_runner(cfg, tmp_path / algorithm).run()
    assert history and _finite(history)


def test_a_bf16_lora_step_on_cuda_trains_the_adapter() -> None:
    """``model.dtype: bf16`` (the key the config has for precision; ``auto`` also picks bf16 on a GPU
    that supports it): the base in bf16 on the GPU, one AdamW step moves the adapter and the loss is
    finite."""
    if not torch.cuda.is_bf16_supported():
        pytest.skip("this CUDA device has no bf16")
    model, tokenizer = load_causal_lm("tiny-llama-L2-H64", dtype="bf16", device="cuda")
    peft_model = attach_lora(model, r=4, alpha=8, dropout=0.0)
    params = adapter_parameters(peft_model)
    assert params and all(p.device.type == "cuda" for p in params.values())
    assert {p.dtype for p in peft_model.parameters() if not p.requires_grad} == {torch.bfloat16}
    assert {p.dtype for p in params.values()} == {torch.float32}  # peft keeps adapters fp32 (as on CPU)
    before = {name: p.detach().clone() for name, p in params.items()}
    ids = tokenizer(["federated fine-tuning on a gpu"] * 2, return_tensors="pt").input_ids.cuda()
    optimizer = torch.optim.AdamW(params.values(), lr=1e-2)
    loss = peft_model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    assert torch.isfinite(loss)
    assert any(not torch.equal(before[name], p.detach()) for name, p in params.items())


def test_a_bf16_fedit_round_on_cuda(tmp_path: Path) -> None:
    cfg = tiny_config("fedit", "model.device=cuda", "model.dtype=bf16", "fed.rounds=1")
    history = quiet_runner(cfg, tmp_path / "bf16").run()
    assert history and _finite(history)


@pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is None, reason="needs bitsandbytes")
def test_a_4bit_fedit_run_on_cuda_learns(tmp_path: Path) -> None:
    """QLoRA on the GPU: bitsandbytes NF4 on a tiny random Llama (the path tests/integration/
    test_quantization.py runs on the CPU; hidden size 64 so every layer is at least one 64-value
    block wide)."""
    import bitsandbytes as bnb

    cfg = tiny_config(
        "fedit",
        "model.device=cuda",
        "model.quantization=4",
        "model.name=tiny-llama-L2-H64",
        "fed.rounds=3",
        "eval.metrics=[perplexity]",
    )
    runner = quiet_runner(cfg, tmp_path / "q4")
    history = runner.run()
    assert _finite(history)
    assert history[-1]["eval"]["perplexity"] < history[0]["eval"]["perplexity"]
    model, _ = load_causal_lm("tiny-llama-L2-H64", device="cuda", quantization=4)
    layers = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert layers and all(m.weight.device.type == "cuda" for m in layers)


def test_fedbiots_adamw_alignment_checkpoints_a_bf16_emulator_on_cuda(tmp_path: Path) -> None:
    """``model.dtype: auto`` is bf16 on the GPU: the server's AdamW alignment state is bf16 and must go
    into the checkpoint after each round (numpy has no bf16)."""
    if not torch.cuda.is_bf16_supported():
        pytest.skip("this CUDA device has no bf16")
    adamw = ("fedbiot.align_optimizer=adamw", "fedbiot.align_steps=2")
    cfg = tiny_config("fedbiot", "model.device=cuda", *adamw, "fed.rounds=2")
    history = quiet_runner(cfg, tmp_path / "fedbiot").run()
    assert history and _finite(history)


def test_fedkseed_on_cuda_tunes_in_fp32_and_its_final_model_replays(tmp_path: Path) -> None:
    from fedtune.algorithms.fedkseed.client import tuned_lm
    from fedtune.algorithms.fedkseed.server import FedKSeed
    from fedtune.algorithms.final import FinalRun
    from fedtune.resources import Resources

    cfg = tiny_config("fedkseed", "model.device=cuda", "fed.rounds=2")
    model, _ = tuned_lm(Resources(cfg))
    assert {(p.device.type, p.dtype) for p in model.parameters()} == {("cuda", torch.float32)}
    quiet_runner(cfg, tmp_path / "run").run()
    final = FedKSeed.final_model(FinalRun(cfg, tmp_path / "run", None, {}))
    assert next(final.model.parameters()).device.type == "cuda"
