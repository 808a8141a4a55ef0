"""QLoRA on CPU: runs on a 4- and 8-bit base learn, every LoRA method's client model is quantised, the
final model is loaded as trained, and the adapter merges into the unquantised base only."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from safetensors import safe_open

import fedtune
from fedtune.algorithms.final import load_base_model
from fedtune.models import loading
from fedtune.models.lora import merge_lora
from fedtune.rundata import prepare_data
from tests.integration.helpers import ROOT, quiet_runner, tiny_config

bnb = pytest.importorskip("bitsandbytes")

CONFIG = ROOT / "configs" / "test" / "fedit-tiny.yaml"


def _quantised_layers(model: Any, bits: int) -> int:
    layer = bnb.nn.Linear4bit if bits == 4 else bnb.nn.Linear8bitLt
    return sum(isinstance(module, layer) for module in model.modules())


@pytest.mark.parametrize("bits", [4, 8])
def test_a_quantised_fedit_run_learns_and_its_final_model_is_the_one_evaluated(
    tmp_path: Path, bits: int
) -> None:
    # Execute: evaluation before round 1 runs the quantised layers without gradients first, which
    # bitsandbytes' CPU backend would otherwise turn into an inference-only layout that gradients do not
    # pass (on layers at least one 64-value block wide: hidden size 64; the loss would stay flat).
    history = fedtune.run(
        CONFIG,
        output_dir=tmp_path / "run",
        quiet=True,
        model={"quantization": bits, "name": "tiny-llama-L2-H64"},
        fed={"rounds": 3},
        eval={"metrics": ["perplexity"]},
    )
    final = fedtune.load(tmp_path / "run")
    records = prepare_data(tiny_config("fedit")).eval_records

    # Assert: the loss falls round after round, and so does the test perplexity.
    losses = [row["train_loss"] for row in history[1:]]
    assert all(later < earlier for earlier, later in itertools.pairwise(losses)), losses
    assert history[-1]["eval"]["perplexity"] < history[0]["eval"]["perplexity"]
    # The final model is the run's quantised base + adapter: the same perplexity as the last round.
    assert _quantised_layers(final.model, bits) > 0  # type: ignore[attr-defined]
    assert final.evaluate(records).metrics["perplexity"] == pytest.approx(
        history[-1]["eval"]["perplexity"], rel=1e-5
    )
    # The adapter stays in fp32 on the quantised base (it travels as fp32 arrays).
    with safe_open(str(tmp_path / "run" / "artifacts" / "adapter" / "adapter_model.safetensors"), "pt") as f:
        assert {str(f.get_tensor(key).dtype) for key in f.keys()}  # noqa: SIM118 == {"torch.float32"}
    if bits == 4:
        _check_merge(tmp_path / "run", final, records)


def _check_merge(run_dir: Path, final: Any, records: list[Any]) -> None:
    """Merging into the 4-bit base is refused (it would round the update to 4 bits); into the
    unquantised base it gives a plain model about as good as the quantised one it was trained on."""
    from peft import PeftModel

    with pytest.raises(ValueError, match=r"model\.quantization 4: the LoRA cannot be merged"):
        merge_lora(final.model)
    base, _ = load_base_model(final.cfg, quantized=False)
    assert _quantised_layers(base, 4) == 0
    merged = merge_lora(PeftModel.from_pretrained(base, str(run_dir / "artifacts" / "adapter")))
    assert not any("lora_" in name for name, _ in merged.named_parameters())
    final.model = merged
    assert final.evaluate(records).metrics["perplexity"] == pytest.approx(
        fedtune.load(run_dir).evaluate(records).metrics["perplexity"], rel=0.05
    )


@pytest.mark.parametrize("algorithm", ["fedavgm", "fedpt", "perfit", "fedmkt"])
def test_every_lora_method_trains_on_quantised_client_models(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, algorithm: str
) -> None:
    loads: list[tuple[str, int | None]] = []
    real = loading.load_causal_lm

    def recording(name: str, **kwargs: Any) -> Any:
        loads.append((name, kwargs.get("quantization")))
        return real(name, **kwargs)

    monkeypatch.setattr(loading, "load_causal_lm", recording)
    cfg = tiny_config(algorithm, "model.quantization=4", "fed.rounds=1", "eval.before=false")

    # Execute
    history = quiet_runner(cfg, tmp_path / "run").run()

    # Assert: the round trained; every model loaded is 4-bit except FedPT's server-side large model.
    assert history[-1]["train_loss"] > 0
    large = cfg.section("fedpt").large_model if algorithm == "fedpt" else None
    assert loads and all((bits is None) == (name == large) for name, bits in loads), loads


def test_qlora_with_gradient_checkpointing_trains_the_same(tmp_path: Path) -> None:
    """FlowerTune's client default (4-bit base + checkpointing): the same round as without it."""
    losses = []
    for checkpointing in (False, True):
        cfg = tiny_config(
            "fedit",
            "model.quantization=4",
            f"train.gradient_checkpointing={str(checkpointing).lower()}",
            "fed.rounds=1",
            "eval.before=false",
        )
        losses.append(quiet_runner(cfg, tmp_path / str(checkpointing)).run()[-1]["train_loss"])
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)
