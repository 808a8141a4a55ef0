"""``train.gradient_checkpointing``: the same training, recomputed instead of stored, only while training."""

from __future__ import annotations

import pytest
import torch

from fedtune.data.records import Record
from fedtune.data.tokenize import encode_records, make_batches
from fedtune.models.lora import adapter_arrays, attach_lora
from fedtune.models.tiny import tiny_model
from fedtune.train.loop import TrainResult, activation_checkpointing, train_local
from fedtune.train.optim import build_optimizer

RECORDS = [Record(f"Define word number {i}.", f"Word {i} means the number {i}.") for i in range(8)]


def _train(checkpointing: bool) -> tuple[TrainResult, dict[str, torch.Tensor], int, torch.nn.Module]:
    """Four LoRA steps (dropout on: its masks must replay in the recompute) on a 2-layer tiny Llama;
    also how often the first decoder layer's attention started a forward."""
    model, tokenizer = tiny_model("llama", num_layers=2, hidden=32, seed=0)
    lora = attach_lora(model, r=4, alpha=8, dropout=0.1, seed=0)
    examples = encode_records(RECORDS, tokenizer, "alpaca", 64)
    batches = make_batches(examples, 4, int(tokenizer.pad_token_id), seed=0)
    optimizer = build_optimizer([p for p in lora.parameters() if p.requires_grad], "adamw", lr=1e-2)
    calls = []
    # Inside the layer (transformers checkpoints the layer's forward: hooks on the layer itself run once),
    # and a pre-hook (the recompute stops as soon as it has what the backward needs).
    attention = model.model.layers[0].self_attn
    hook = attention.register_forward_pre_hook(lambda *_: calls.append(1))
    torch.manual_seed(0)
    result = train_local(lora, batches, optimizer, None, steps=4, gradient_checkpointing=checkpointing)
    hook.remove()
    state = {k: torch.from_numpy(v) for k, v in adapter_arrays(lora).items()}
    return result, state, len(calls), lora


def test_checkpointing_gives_the_same_loss_and_adapter_and_recomputes_each_layer() -> None:
    # Execute
    plain, plain_state, plain_calls, _ = _train(False)
    checked, checked_state, checked_calls, model = _train(True)

    # Assert
    assert checked.loss == pytest.approx(plain.loss, rel=1e-5)
    for key, value in plain_state.items():
        torch.testing.assert_close(checked_state[key], value, rtol=1e-4, atol=1e-6)
    # Every step's forward ran the layer once more in its backward pass: the recompute happened.
    assert plain_calls == 4 and checked_calls == 8
    # Switched off after training: no layer still checkpoints, no hook left on the embeddings.
    base = model.get_base_model()
    assert not any(getattr(m, "gradient_checkpointing", False) for m in base.modules())
    assert not base.get_input_embeddings()._forward_hooks


def test_a_model_without_checkpointing_support_names_the_key() -> None:
    with (
        pytest.raises(ValueError, match=r"train\.gradient_checkpointing"),
        activation_checkpointing(torch.nn.Linear(2, 2), True),
    ):
        pass
