"""Layer surgery for offsite tuning: LayerExtract indices, emulator building, plug-in round trips."""

from __future__ import annotations

import pytest
import torch

from fedtune.models.layers import decoder_layers
from fedtune.models.lora import attach_lora
from fedtune.models.surgery import (
    SplitError,
    build_emulator,
    layer_extract,
    layer_parameters,
    layer_state,
    load_layer_state,
    lora_params,
    lora_target_regex,
    offsite_split,
    uniform_drop,
)
from fedtune.models.tiny import tiny_model
from fedtune.train.losses import emulator_alignment_loss, normalised_hidden_mse


def test_paper_examples() -> None:
    # n = 32, s = 2, d = 0.2 -> 24 emulator layers out of the 30 of E*.
    split = layer_extract(32, 2, 0.2)
    assert split.adapter == (30, 31)
    assert split.emulator_full == tuple(range(30))
    assert len(split.emulator) == 24
    assert split.emulator[0] == 0 and split.emulator[-1] == 29
    assert split.emulator == tuple((j * 29) // 23 for j in range(24))
    # n = 32, s = 4 -> 22 of 28.
    four = layer_extract(32, 4, 0.2)
    assert four.adapter == (28, 29, 30, 31) and len(four.emulator) == 22
    assert len(layer_extract(32, 2, 0.5).emulator) == 15 and len(layer_extract(32, 4, 0.5).emulator) == 14


def test_figure_1_nine_decoders() -> None:
    # The paper's Figure 1: decoders {1, 3, 5, 7} (1-based) form the emulator, {8, 9} the adapter.
    split = layer_extract(9, 2, 0.4)
    assert split.emulator == (0, 2, 4, 6)
    assert split.adapter == (7, 8)
    assert split.dropped == (1, 3, 5)
    assert split.kept == (0, 2, 4, 6, 7, 8)


def test_offsite_split_first_two_and_last_two() -> None:
    split = offsite_split(32, 0.2)
    assert split.adapter_bottom == (0, 1) and split.adapter_top == (30, 31)
    assert split.emulator_full == tuple(range(2, 30))
    assert len(split.emulator) == 22 and split.emulator[0] == 2 and split.emulator[-1] == 29
    assert split.kept[:2] == (0, 1) and split.kept[-2:] == (30, 31)


def test_uniform_drop_edges_and_errors() -> None:
    assert uniform_drop(range(10), 0.0) == tuple(range(10))
    assert uniform_drop([5, 6, 7], 0.5) == (5,)
    with pytest.raises(SplitError, match="leaves no layer"):
        uniform_drop([0, 1], 0.9)
    with pytest.raises(SplitError, match="adapter size"):
        layer_extract(4, 4, 0.2)
    with pytest.raises(SplitError, match="offsite split"):
        offsite_split(4, 0.2)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
@pytest.mark.parametrize("kind", ["last", "first_last"])
def test_undropped_emulator_is_the_full_model(arch: str, kind: str) -> None:
    model, _ = tiny_model(arch, num_layers=6)
    split = layer_extract(6, 2, 0.0) if kind == "last" else offsite_split(6, 0.0)
    emulator = build_emulator(model, split)
    assert len(decoder_layers(emulator)) == 6
    ids = torch.randint(3, 200, (2, 9))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    with torch.no_grad():
        torch.testing.assert_close(
            emulator(input_ids=ids, attention_mask=mask).logits,
            model(input_ids=ids, attention_mask=mask).logits,
        )
        # KV-cached greedy decoding works through the renumbered layers.
        kwargs = {"max_new_tokens": 5, "do_sample": False, "pad_token_id": 0}
        assert torch.equal(emulator.generate(ids[1:], **kwargs), model.generate(ids[1:], **kwargs))


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_adapter_round_trip_between_emulator_and_full_model(arch: str) -> None:
    model, _ = tiny_model(arch, num_layers=8)
    split = offsite_split(8, 0.5)
    emulator = build_emulator(model, split)
    positions = split.emulator_positions()
    # Keys carry original indices, whichever model they come from.
    from_full = layer_state(model, split.adapter)
    from_emulator = layer_state(emulator, split.adapter, positions)
    assert from_full.keys() == from_emulator.keys()
    for key in from_full:
        assert torch.equal(torch.from_numpy(from_full[key]), torch.from_numpy(from_emulator[key]))
    # Train the adapter in the emulator (AdapEmu), plug it into the full model (AdapFu).
    with torch.no_grad():
        for p in layer_parameters(emulator, split.adapter, positions).values():
            p.add_(0.1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    load_layer_state(model, layer_state(emulator, split.adapter, positions), split.adapter)
    changed = {k for k, v in model.state_dict().items() if not torch.equal(v, before[k])}
    adapter_keys = set(layer_state(model, split.adapter))
    assert changed == adapter_keys
    for key, value in layer_state(model, split.adapter).items():
        assert torch.equal(torch.from_numpy(value), torch.from_numpy(from_full[key]) + 0.1)


def test_emulator_layers_keep_their_original_labels() -> None:
    model, _ = tiny_model("llama", num_layers=9)
    split = layer_extract(9, 2, 0.4)
    emulator = build_emulator(model, split)
    state = layer_state(emulator, split.emulator, split.emulator_positions())
    indices = {int(key.split(".")[2]) for key in state}
    assert indices == {0, 2, 4, 6}
    original = layer_state(model, split.emulator)
    assert all((state[k] == original[k]).all() for k in state)


def test_lora_regex_targets_only_adapter_layers() -> None:
    model, _ = tiny_model("llama", num_layers=6)
    split = layer_extract(6, 2, 0.5)
    peft_model = attach_lora(
        model,
        r=2,
        alpha=4,
        dropout=0.0,
        target_modules=lora_target_regex(model, split.adapter, ["q_proj", "v_proj"]),
    )
    lora = layer_parameters(peft_model, split.adapter, keep=lora_params)
    assert lora and all("lora_" in key for key in lora)
    assert {int(key.split("layers.")[1].split(".")[0]) for key in lora} == {4, 5}
    everywhere = [name for name, _ in peft_model.named_parameters() if "lora_" in name]
    assert len(everywhere) == len(lora)


def test_alignment_loss_on_fixed_tensors() -> None:
    teacher = torch.tensor([[1.0, 1.0], [0.0, 2.0]])
    student = torch.tensor([[1.0, 2.0], [0.0, 2.0]])
    # ||s - t||^2 = 1, ||t||^2 = 6.
    assert normalised_hidden_mse(student, teacher).item() == pytest.approx(1 / 6)
    logits_t = torch.tensor([[0.0, 0.0], [0.0, 0.0]])
    logits_s = torch.tensor([[0.0, 0.0], [0.0, float(torch.log(torch.tensor(3.0)))]])
    # Row 2: KL([.5, .5] || [.25, .75]) = .5 ln 2 + .5 ln(2/3); row 1: 0; mean over the 2 rows.
    kl_row = 0.5 * torch.log(torch.tensor(2.0)) + 0.5 * torch.log(torch.tensor(2 / 3))
    loss, _, kl = emulator_alignment_loss(
        student, teacher, logits_s, logits_t, lam=2.0, kl_order="full_first"
    )
    assert kl.item() == pytest.approx(kl_row.item() / 2, rel=1e-5)
    assert loss.item() == pytest.approx(1 / 6 + 2.0 * kl_row.item() / 2, rel=1e-5)
    for kl_order in ("emulator_first", "full_first"):
        zero_lam, _, kl_off = emulator_alignment_loss(
            student, teacher, logits_s, logits_t, lam=0.0, kl_order=kl_order
        )
        assert zero_lam.item() == pytest.approx(1 / 6) and kl_off.item() == 0.0


@pytest.mark.parametrize("kl_order", ["emulator_first", "full_first"])
def test_alignment_kl_is_taken_in_the_configured_order(kl_order: str) -> None:
    hidden = torch.ones(2, 2)
    full_logits = torch.tensor([[0.0, 0.0], [0.0, 0.0]])  # the teacher, M(x; A, E*)
    three = float(torch.log(torch.tensor(3.0)))
    emulator_logits = torch.tensor([[0.0, 0.0], [0.0, three]])  # the student, M(x; A, E)
    p_full, p_emulator = torch.tensor([0.5, 0.5]), torch.tensor([0.25, 0.75])
    # Row 1 is 0 in both orders; the mean over the 2 rows is half of row 2's KL.
    by_order = {
        "emulator_first": (p_emulator * (p_emulator / p_full).log()).sum(),  # eq. 2: KL(p_E || p_E*)
        "full_first": (p_full * (p_full / p_emulator).log()).sum(),
    }
    assert by_order["emulator_first"].item() != pytest.approx(by_order["full_first"].item(), rel=1e-2)
    loss, _, kl = emulator_alignment_loss(
        hidden, hidden, emulator_logits, full_logits, lam=2.0, kl_order=kl_order
    )
    assert kl.item() == pytest.approx(by_order[kl_order].item() / 2, rel=1e-5)
    assert loss.item() == pytest.approx(by_order[kl_order].item(), rel=1e-5)


def test_the_emulator_first_kl_trains_the_emulator_towards_the_full_model() -> None:
    full_logits = torch.tensor([[0.0, 2.0]])
    emulator_logits = torch.tensor([[1.0, 0.0]], requires_grad=True)
    hidden = torch.ones(1, 2)
    loss, _, _ = emulator_alignment_loss(
        hidden, hidden, emulator_logits, full_logits, lam=1.0, kl_order="emulator_first"
    )
    loss.backward()
    assert emulator_logits.grad is not None
    # d KL(p_E || p_E*) / d z_E pushes z_E towards the full model's token 2.
    assert emulator_logits.grad[0, 1] < 0 < emulator_logits.grad[0, 0]
