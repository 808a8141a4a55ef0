"""FedPFT's distillations (eq. 13, 14): hidden MSE, FFN product gap, APoZ, neuron freezing, the loop."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fedtune.models.ffn import FFN, build_submodel, ffn_layers, ffn_parameter_names, select_neurons
from fedtune.models.loading import load_causal_lm, load_encoder_classifier
from fedtune.models.lora import attach_lora
from fedtune.train.ffn_distill import (
    aggregate_apoz,
    apoz_counts,
    distill_ffns,
    ffn_grad_masks,
    ffn_product_gap,
    hidden_mse,
    layer_distill_loss,
    neurons_to_freeze,
)


def llama() -> nn.Module:
    return load_causal_lm("tiny-llama", device="cpu")[0]


def bert() -> nn.Module:
    return load_encoder_classifier("tiny-bert", 2, device="cpu")[0]


def batches(count: int = 2, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        attention_mask = torch.ones(3, 8, dtype=torch.long)
        attention_mask[0, 6:] = 0
        out.append(
            {
                "input_ids": torch.randint(0, 250, (3, 8), generator=generator),
                "attention_mask": attention_mask,
                "labels": torch.tensor([0, 1, 0]),
            }
        )
    return out


def linear(weight: list[list[float]]) -> nn.Linear:
    tensor = torch.tensor(weight)
    layer = nn.Linear(tensor.shape[1], tensor.shape[0], bias=False)
    with torch.no_grad():
        layer.weight.copy_(tensor)
    return layer


def hand_ffn(w_in: list[list[float]], w_out: list[list[float]]) -> FFN:
    return FFN(0, [linear(w_in)], linear(w_out), ["up"], "down")


def hidden(model: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    out = model.base_model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_hidden_states=True
    )
    return tuple(out.hidden_states)


def test_hidden_mse_skips_embeddings_and_padding() -> None:
    # Prepare: [B=1, T=2, H=2]; position 1 is padding, index 0 (embeddings) differs wildly.
    teacher = [torch.full((1, 2, 2), 100.0), torch.zeros(1, 2, 2), torch.ones(1, 2, 2)]
    student = [
        torch.zeros(1, 2, 2),
        torch.tensor([[[1.0, 2.0], [9.0, 9.0]]]),
        torch.tensor([[[4.0, 1.0], [-9.0, 9.0]]]),
    ]
    mask = torch.tensor([[1, 0]])
    # Assert: layer 1 (1 + 4) / 2, layer 2 (9 + 0) / 2.
    assert hidden_mse(teacher, student, mask).item() == pytest.approx(2.5 + 4.5)


def test_token_relative_divides_each_position_by_the_teachers_norm() -> None:
    # Prepare: [B=1, T=3, H=2]; position 0 carries a huge teacher activation, position 2 is padding.
    teacher = [
        torch.zeros(1, 3, 2),
        torch.tensor([[[1000.0, 0.0], [3.0, 4.0], [1.0, 1.0]]]),
    ]
    student = [
        torch.zeros(1, 3, 2),
        torch.tensor([[[900.0, 0.0], [3.0, 0.0], [50.0, 50.0]]]),
    ]
    mask = torch.tensor([[1, 1, 0]])
    # Assert: position 0 (100^2) / 1000^2 = 0.01, position 1 4^2 / 5^2 = 0.64, averaged.
    assert hidden_mse(teacher, student, mask, "token_relative").item() == pytest.approx((0.01 + 0.64) / 2)
    # Plain MSE is the first position's: (10000 + 16) / 4.
    assert hidden_mse(teacher, student, mask).item() == pytest.approx((10000 + 16) / 4)
    with pytest.raises(ValueError, match="unknown hidden-state loss"):
        hidden_mse(teacher, student, mask, "cosine")  # type: ignore[arg-type]


def test_product_gap_and_its_gradient_match_the_closed_form() -> None:
    # Prepare: H = 2, full I = 3, sub I = 2.
    full = hand_ffn([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]], [[1.0, 0.0, 2.0], [0.0, 1.0, -1.0]])
    sub = hand_ffn([[1.0, 0.5], [0.0, 2.0]], [[1.0, 0.0], [0.5, 1.0]])
    w_in, w_out = sub.inputs[0].weight, sub.output.weight
    # Execute
    gap = ffn_product_gap(full, sub)
    gap.backward()
    # Assert
    difference = (full.output.weight @ full.inputs[0].weight - w_out @ w_in).detach()
    assert gap.item() == pytest.approx(float(difference.pow(2).sum()))
    torch.testing.assert_close(w_in.grad, -2 * w_out.detach().T @ difference)
    torch.testing.assert_close(w_out.grad, -2 * difference @ w_in.detach().T)
    assert full.inputs[0].weight.grad is None and full.output.weight.grad is None


def test_product_gap_sums_over_gate_and_up() -> None:
    model = llama()
    sub = build_submodel(model, select_neurons(model, 0.5, ()))
    full_ffn, sub_ffn = ffn_layers(model)[0], ffn_layers(sub)[0]
    expected = sum(
        float((full_ffn.output.weight @ f.weight - sub_ffn.output.weight @ s.weight).pow(2).sum().detach())
        for f, s in zip(full_ffn.inputs, sub_ffn.inputs, strict=True)
    )
    assert ffn_product_gap(full_ffn, sub_ffn).item() == pytest.approx(expected, rel=1e-5)


def test_loss_is_zero_for_a_keep_ratio_one_sub_model() -> None:
    model = llama()
    sub = build_submodel(model, select_neurons(model, 1.0, ()))
    batch = batches(1)[0]
    with torch.no_grad():
        loss, parts = layer_distill_loss(
            hidden(model, batch),
            hidden(sub, batch),
            batch["attention_mask"],
            ffn_layers(model),
            ffn_layers(sub),
            mu=1.0,
        )
    assert loss.item() == 0.0 and parts == {"hidden_mse": 0.0, "product_gap": 0.0, "loss": 0.0}


def test_apoz_counts_known_signs_and_skips_padding() -> None:
    # Prepare: BERT layer 0 with W_in = 0 and a bias of known signs: GELU(+1) > 0, GELU(0) = 0,
    # GELU(-1) < 0, whatever the input.
    model = bert()
    ffn = ffn_layers(model)[0]
    signs = torch.tensor([1.0, 0.0, -1.0]).repeat(ffn.width // 3 + 1)[: ffn.width]
    with torch.no_grad():
        ffn.inputs[0].weight.zero_()
        ffn.inputs[0].bias.copy_(signs)
    data = batches(2)
    model.train()
    # Execute
    counts = apoz_counts(model, data)
    # Assert: 2 batches of 3 x 8 tokens, one row padded after 6 tokens.
    positions = 2 * (3 * 8 - 2)
    zeros, counted = counts[0]
    assert counted == positions and counts[1][1] == positions
    assert zeros.tolist() == [0 if s > 0 else positions for s in signs.tolist()]
    assert counts[1][0].shape == (ffn.width,) and model.training
    assert not ffn.output._forward_pre_hooks


def test_apoz_of_a_gated_ffn_with_zero_gate_is_all_zero_and_hooks_go_on_error() -> None:
    model = attach_lora(llama(), r=2, alpha=4, dropout=0.0)
    ffn = ffn_layers(model)[1]
    with torch.no_grad():
        ffn.inputs[0].weight.zero_()  # SiLU(0) * up = 0
    zeros, counted = apoz_counts(model, batches(1))[1]
    assert counted == 22 and zeros.tolist() == [22] * ffn.width
    with pytest.raises(KeyError):
        apoz_counts(model, [{"input_ids": torch.zeros(1, 2, dtype=torch.long)}])
    assert not ffn.output._forward_pre_hooks


def test_aggregate_apoz_weights_clients_by_tokens() -> None:
    counts = [{0: (np.array([2, 0]), 4)}, {0: (np.array([0, 6]), 6)}]
    np.testing.assert_allclose(aggregate_apoz(counts)[0], [0.2, 0.6])
    with pytest.raises(ValueError, match="different layers"):
        aggregate_apoz([{0: (np.array([1]), 1)}, {1: (np.array([1]), 1)}])


def test_neurons_to_freeze_takes_the_most_active_with_ties_to_lower_index() -> None:
    apoz = {0: np.array([0.5, 0.1, 0.1, 0.9]), 1: np.array([0.2, 0.2, 0.2, 0.2])}
    frozen = neurons_to_freeze(apoz, 0.5)
    assert frozen[0].tolist() == [1, 2] and frozen[1].tolist() == [0, 1]
    assert neurons_to_freeze(apoz, 0.0)[0].size == 0
    assert neurons_to_freeze(apoz, 0.75)[0].tolist() == [0, 1, 2]


def test_grad_masks_zero_rows_and_columns_of_frozen_neurons() -> None:
    model = bert()
    masks = ffn_grad_masks(model, {0: np.array([1, 3])})
    params = dict(model.named_parameters())
    assert set(masks) == ffn_parameter_names(model)
    for name, mask in masks.items():
        torch.broadcast_to(mask, params[name].shape)
    rows = masks["bert.encoder.layer.0.intermediate.dense.weight"][:, 0]
    assert rows[:5].tolist() == [1, 0, 1, 0, 1] and rows.sum() == 128 - 2
    assert masks["bert.encoder.layer.0.intermediate.dense.bias"][:4].tolist() == [1, 0, 1, 0]
    assert masks["bert.encoder.layer.0.output.dense.weight"][0, :4].tolist() == [1, 0, 1, 0]
    assert masks["bert.encoder.layer.0.output.dense.bias"].tolist() == [1]
    assert masks["bert.encoder.layer.1.output.dense.weight"].sum() == 128


def snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("arch", ["llama", "bert"])
def test_distill_lowers_the_loss_and_moves_only_unfrozen_ffn_weights(arch: str) -> None:
    # Prepare: a keep-ratio 0.5 sub-model with LoRA on attention; neuron 0..3 of layer 0 frozen.
    teacher = llama() if arch == "llama" else bert()
    task = "CAUSAL_LM" if arch == "llama" else "SEQ_CLS"
    student = attach_lora(
        build_submodel(teacher, select_neurons(teacher, 0.5, ())), r=2, alpha=4, dropout=0.0, task_type=task
    )
    flags = {n: p.requires_grad for n, p in student.named_parameters()}
    modes = (teacher.training, student.training)
    before = snapshot(student)
    frozen = {0: np.arange(4)}
    # Execute
    stats = distill_ffns(
        teacher, student, batches(2), steps=20, lr=3e-3, mu=0.1, grad_masks=ffn_grad_masks(student, frozen)
    )
    # Assert
    assert stats.steps == 20 and stats.last_loss < 0.5 * stats.first_loss
    after = snapshot(student)
    ffn_names = {n for n in after if any(n.endswith(f) for f in ffn_parameter_names(student))}
    assert all(torch.equal(before[n], after[n]) for n in after if n not in ffn_names)
    assert any(not torch.equal(before[n], after[n]) for n in ffn_names)
    first = ffn_layers(student)[0]
    for name in first.input_names:
        key = next(n for n in after if n.endswith(f"{name}.weight"))
        assert torch.equal(before[key][:4], after[key][:4]) and not torch.equal(before[key], after[key])
    key = next(n for n in after if n.endswith(f"{first.output_name}.weight"))
    assert torch.equal(before[key][:, :4], after[key][:, :4])
    assert {n: p.requires_grad for n, p in student.named_parameters()} == flags
    assert (teacher.training, student.training) == modes


def test_distill_restores_modes_and_rejects_bad_masks() -> None:
    teacher = llama()
    student = build_submodel(teacher, select_neurons(teacher, 0.5, ()))
    student.train()
    with pytest.raises(ValueError, match="not an FFN parameter"):
        distill_ffns(
            teacher,
            student,
            batches(1),
            steps=1,
            lr=1e-3,
            mu=0.0,
            grad_masks={"lm_head.weight": torch.ones(1)},
        )
    assert student.training and all(p.requires_grad for p in student.parameters())


def test_eq13_adds_mu_times_the_product_gap_to_the_hidden_error() -> None:
    # Prepare: one layer's hidden states [B=1, T=2, H=2] (position 1 padding) and one FFN pair.
    teacher = [torch.zeros(1, 2, 2), torch.tensor([[[1.0, 2.0], [5.0, 5.0]]])]
    student = [torch.zeros(1, 2, 2), torch.tensor([[[0.0, 4.0], [0.0, 0.0]]], requires_grad=True)]
    full = hand_ffn([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]], [[1.0, 0.0, 2.0], [0.0, 1.0, -1.0]])
    sub = hand_ffn([[1.0, 0.5], [0.0, 2.0]], [[1.0, 0.0], [0.5, 1.0]])
    mask = torch.tensor([[1, 0]])
    # W_out W_in: full [[3, 2], [-1, 1]], sub [[1, 0.5], [0.5, 2.25]]; gap 4 + 2.25 + 2.25 + 1.5625.
    gap = 4.0 + 2.25 + 2.25 + 1.5625
    # Execute
    loss, parts = layer_distill_loss(teacher, student, mask, [full], [sub], mu=0.5)
    loss.backward()
    # Assert: hidden error (1 + 4) / 2 at the one real position; the sub-FFN gets the mu term's gradient.
    assert parts["hidden_mse"] == pytest.approx(2.5) and parts["product_gap"] == pytest.approx(gap)
    assert loss.item() == pytest.approx(2.5 + 0.5 * gap)
    difference = (
        full.output.weight @ full.inputs[0].weight - sub.output.weight @ sub.inputs[0].weight
    ).detach()
    torch.testing.assert_close(
        sub.inputs[0].weight.grad, 0.5 * -2 * sub.output.weight.detach().T @ difference
    )
    assert student[1].grad is not None and student[1].grad[0, 1].abs().sum() == 0


def test_apoz_of_a_gated_ffn_reads_the_activation_not_its_product_with_up() -> None:
    # Prepare: up = 0, so SiLU(gate) * up is 0 at every neuron; the activation SiLU(gate) is <= 0
    # exactly where the gate's output is <= 0 (about half the entries of a random gate).
    model = llama()
    ffn = ffn_layers(model)[1]
    with torch.no_grad():
        ffn.inputs[1].weight.zero_()
    gates: list[torch.Tensor] = []
    handle = ffn.inputs[0].register_forward_hook(lambda module, args, out: gates.append(out))
    data = batches(1)
    # Execute
    zeros, counted = apoz_counts(model, data)[1]
    handle.remove()
    # Assert
    mask = data[0]["attention_mask"].bool().unsqueeze(-1)
    expected = ((gates[0] <= 0) & mask).sum(dim=(0, 1))
    assert zeros.tolist() == expected.tolist()
    assert 0 < zeros.sum() < counted * ffn.width
    assert not ffn.inputs[0]._forward_hooks


def test_layer_relative_divides_each_layers_error_by_the_teachers_scale() -> None:
    """``layer_relative`` (the authors' code): per layer, the squared error over non-pad positions over
    the teacher's squared norm there, summed over layers; so it does not change with the scale."""
    teacher = [
        torch.zeros(1, 3, 2),
        torch.tensor([[[3.0, 4.0], [0.0, 5.0], [9.0, 9.0]]]),
        torch.tensor([[[100.0, 0.0], [0.0, 0.0], [1.0, 1.0]]]),
    ]
    student = [
        torch.zeros(1, 3, 2),
        torch.tensor([[[3.0, 0.0], [0.0, 2.0], [0.0, 0.0]]]),
        torch.tensor([[[90.0, 0.0], [0.0, 10.0], [7.0, 7.0]]]),
    ]
    mask = torch.tensor([[1, 1, 0]])
    # layer 1: (16 + 9) / (25 + 25); layer 2: (100 + 100) / 10000
    expected = 25 / 50 + 200 / 10000
    assert hidden_mse(teacher, student, mask, "layer_relative").item() == pytest.approx(expected)
    scaled = hidden_mse([7 * t for t in teacher], [7 * s for s in student], mask, "layer_relative")
    assert scaled.item() == pytest.approx(expected)


def test_the_distillation_lr_warms_up_then_follows_a_cosine(monkeypatch: pytest.MonkeyPatch) -> None:
    from fedtune.train.optim import schedule_factor

    teacher = bert()
    student = build_submodel(teacher, select_neurons(teacher, 0.5, ()))
    seen: list[float] = []
    step = torch.optim.SGD.step

    def recording(self: torch.optim.SGD, *args: object, **kwargs: object) -> object:
        seen.append(self.param_groups[0]["lr"])
        return step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.SGD, "step", recording)

    distill_ffns(
        teacher,
        student,
        batches(2),
        steps=8,
        lr=0.1,
        mu=0.0,
        optimizer="sgd",
        schedule="cosine",
        warmup_ratio=0.25,
    )

    expected = [0.1 * schedule_factor("cosine", s, 8, warmup=2) for s in range(8)]
    assert seen == pytest.approx(expected)
    assert seen[0] == pytest.approx(0.05) and seen[1] == pytest.approx(0.1) and seen[-1] < 0.01


@pytest.mark.parametrize("arch", ["llama", "bert"])
def test_an_emulator_distils_its_middle_layers_on_the_middle_blocks_output(arch: str) -> None:
    """Offsite-tuning's distillation of a layer-dropped emulator: only the given layer's weights move,
    and the loss is the error of the one compared pair of hidden states."""
    from fedtune.models.layers import truncate_layers

    # Prepare: layers 0, 1, 3 of 4 (layer 2 dropped); layer 1 is the emulator's middle.
    if arch == "llama":
        teacher = load_causal_lm("tiny-llama-L4-H32", device="cpu")[0]
    else:
        teacher = load_encoder_classifier("tiny-bert-L4-H32", 2, device="cpu")[0]
    student = truncate_layers(teacher, [0, 1, 3])
    middle = {n: p for n, p in student.named_parameters() if ".layers.1." in n or ".layer.1." in n}
    assert middle
    before = snapshot(student)
    batch = batches(1)[0]
    mask = batch["attention_mask"]

    def gap() -> float:  # the input of the top layer: full hidden_states[3], the emulator's [2]
        with torch.no_grad():
            full = teacher.base_model(batch["input_ids"], attention_mask=mask, output_hidden_states=True)
            emu = student.base_model(batch["input_ids"], attention_mask=mask, output_hidden_states=True)
        pair = ((full.hidden_states[0], full.hidden_states[3]), (emu.hidden_states[0], emu.hidden_states[2]))
        return float(hidden_mse(pair[0], pair[1], mask))

    first = gap()
    # Execute
    stats = distill_ffns(teacher, student, [batch], steps=30, lr=3e-3, mu=0.0, params=middle, compare=(3, 2))
    # Assert: the first step's loss is the compared pair's error, and it falls
    assert stats.first_loss == pytest.approx(first, rel=1e-5)
    assert gap() < 0.5 * first and stats.last_loss < stats.first_loss
    after = snapshot(student)
    assert all(torch.equal(before[n], after[n]) for n in after if n not in middle)
    weights = [n for n in middle if n.endswith("weight") and "norm" not in n]
    assert weights and all(not torch.equal(before[n], after[n]) for n in weights)
    with pytest.raises(ValueError, match="mu pairs"):
        distill_ffns(teacher, student, [batch], steps=1, lr=1e-3, mu=0.1, params=middle, compare=(3, 2))
    with pytest.raises(ValueError, match="no parameter to train"):
        distill_ffns(teacher, student, [batch], steps=1, lr=1e-3, mu=0.0, params={}, compare=(3, 2))
