"""FedBiOT's hidden-state index convention, pinned against a manual loop over the decoder layers."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from fedtune.algorithms.fedbiot.config import FedBiOTConfig
from fedtune.algorithms.fedbiot.emulator import hidden_and_logits, make_split
from fedtune.models.surgery import build_emulator
from fedtune.models.tiny import tiny_model

LAYERS = 6


def layer_outputs(causal: torch.nn.Module, input_ids: Tensor) -> list[Tensor]:
    """Each decoder layer's output [B, T, H], computed by calling the layers one after the other on the
    embeddings (rotary positions, a causal mask): what ``output of layer i`` means, independently of
    transformers' ``hidden_states`` bookkeeping. Right padding needs no mask of its own: a causal
    position never attends to the pads after it."""
    backbone = causal.model  # type: ignore[union-attr]
    hidden = backbone.embed_tokens(input_ids)
    length = input_ids.shape[1]
    positions = torch.arange(length).unsqueeze(0).expand(input_ids.shape[0], length)
    rotary = backbone.rotary_emb(hidden, positions)
    mask = torch.full((length, length), float("-inf")).triu(1)[None, None]
    outputs = []
    for layer in backbone.layers:
        out = layer(hidden, attention_mask=mask, position_ids=positions, position_embeddings=rotary)
        hidden = out[0] if isinstance(out, tuple) else out
        outputs.append(hidden)
    return outputs


@pytest.fixture(scope="module")
def model_and_batch() -> tuple[torch.nn.Module, dict[str, Tensor]]:
    model, tokenizer = tiny_model("llama", num_layers=LAYERS, hidden=32, seed=3)
    encoded = tokenizer(["The cat sat on the mat.", "A dog."], padding=True, return_tensors="pt")
    assert tokenizer.padding_side == "right" and not bool(encoded["attention_mask"].all())
    return model, {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}


def test_index_i_plus_1_is_the_output_of_layer_i(
    model_and_batch: tuple[torch.nn.Module, dict[str, Tensor]],
) -> None:
    model, batch = model_and_batch
    mask = batch["attention_mask"].bool()
    with torch.no_grad():
        manual = layer_outputs(model, batch["input_ids"])
        for layer in range(LAYERS - 1):  # the last index is after the final norm: never an E* output
            hidden, _ = hidden_and_logits(model, batch, layer + 1)
            torch.testing.assert_close(hidden, manual[layer][mask], msg=f"layer {layer}")
        last, _ = hidden_and_logits(model, batch, LAYERS)  # the final norm applied: no layer's output
        torch.testing.assert_close(last, model.model.norm(manual[-1])[mask])  # type: ignore[union-attr]
        embeddings, _ = hidden_and_logits(model, batch, 0)
        torch.testing.assert_close(embeddings, model.model.embed_tokens(batch["input_ids"])[mask])  # type: ignore[union-attr]


@pytest.mark.parametrize(("split", "adapter_layers"), [("last", 2), ("first_last", 2), ("first_last", 4)])
def test_teacher_and_student_indices_read_the_emulated_blocks_outputs(
    model_and_batch: tuple[torch.nn.Module, dict[str, Tensor]], split: str, adapter_layers: int
) -> None:
    """E*'s output (the full model's layer ``emulator_full[-1]``) and E's (the emulator model's layer
    at the position of ``emulator[-1]``) are what the alignment of eq. (2) compares."""
    model, batch = model_and_batch
    layers = make_split(FedBiOTConfig(split=split, adapter_layers=adapter_layers, dropout=0.5), LAYERS)  # type: ignore[arg-type]
    emulator = build_emulator(model, layers)  # type: ignore[arg-type]
    mask = batch["attention_mask"].bool()
    with torch.no_grad():
        teacher, _ = hidden_and_logits(model, batch, layers.teacher_hidden_index)
        student, _ = hidden_and_logits(emulator, batch, layers.student_hidden_index)
        full = layer_outputs(model, batch["input_ids"])
        kept = layer_outputs(emulator, batch["input_ids"])
    torch.testing.assert_close(teacher, full[layers.emulator_full[-1]][mask])
    last_emulated = layers.emulator_positions()[layers.emulator[-1]]
    assert last_emulated == layers.student_hidden_index - 1
    torch.testing.assert_close(student, kept[last_emulated][mask])
    # The top adapter's first layer reads exactly that state in both models.
    assert layers.kept[last_emulated + 1] == layers.adapter_top[0] == layers.emulator_full[-1] + 1


def test_the_lm_term_is_the_models_own_next_token_loss_on_a_padded_batch(
    model_and_batch: tuple[torch.nn.Module, dict[str, Tensor]],
) -> None:
    """Offsite-tuning's LM term, read off the logits at the non-pad positions, equals transformers' own
    causal-LM loss with the pads' labels masked."""
    from fedtune.algorithms.fedbiot.emulator import next_token_ce

    model, batch = model_and_batch
    with torch.no_grad():
        _, logits = hidden_and_logits(model, batch, 0)
        labels = batch["input_ids"].masked_fill(~batch["attention_mask"].bool(), -100)
        expected = model(**batch, labels=labels).loss
    assert float(next_token_ce(logits, batch)) == pytest.approx(float(expected), rel=1e-5)
    one_token = {k: v[:, :1] for k, v in batch.items()}  # no position has a next token
    assert float(next_token_ce(logits[:2], one_token)) == 0.0


def test_the_lm_weight_adds_the_lm_term_to_the_alignment_step(
    model_and_batch: tuple[torch.nn.Module, dict[str, Tensor]],
) -> None:
    from fedtune.algorithms.fedbiot.emulator import align_emulator, alignment_optimizer

    model, batch = model_and_batch
    layers = make_split(FedBiOTConfig(split="first_last", adapter_layers=2, dropout=0.5), LAYERS)

    def aligned(lm_weight: float) -> tuple[float, dict[str, Tensor]]:
        emulator = build_emulator(model, layers)  # type: ignore[arg-type]
        optimizer = alignment_optimizer(emulator, layers, "sgd", 1e-2)
        stats = align_emulator(
            model, emulator, layers, [batch], lam=0.0, kl_order="emulator_first", optimizer=optimizer,
            lm_weight=lm_weight,
        )  # fmt: skip
        return stats.loss, {n: p.detach().clone() for n, p in emulator.named_parameters()}

    plain, plain_state = aligned(0.0)
    with_lm, lm_state = aligned(0.5)
    assert with_lm > plain  # the same first step's MSE plus half a positive cross-entropy
    assert any(not torch.equal(plain_state[n], lm_state[n]) for n in plain_state)
