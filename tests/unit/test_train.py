from __future__ import annotations

import math

import pytest
import torch

from fedtune.data.records import Record
from fedtune.data.tokenize import IGNORE_INDEX, batch_indices, collate, encode_example, encode_records
from fedtune.models.lora import adapter_arrays, attach_lora, load_adapter
from fedtune.models.tiny import tiny_model
from fedtune.train.loop import train_local
from fedtune.train.losses import causal_lm_nll, head_at_positions, proximal_term, response_nll
from fedtune.train.optim import build_optimizer, schedule_factor


def test_labels_cover_only_the_response() -> None:
    _, tok = tiny_model("llama")
    ex = encode_example("Q: hi\nA: ", "ok", tok, max_length=64)
    prompt_len = len(tok("Q: hi\nA: ")["input_ids"])
    assert ex.labels[:prompt_len] == [IGNORE_INDEX] * prompt_len
    assert ex.labels[prompt_len:] == ex.input_ids[prompt_len:]
    assert ex.input_ids[-1] == tok.eos_token_id


def test_truncation_keeps_response_and_prompt_end() -> None:
    _, tok = tiny_model("llama")
    ex = encode_example("x" * 100 + "END", "y" * 100, tok, max_length=40)
    assert len(ex.input_ids) == 40
    assert ex.num_target_tokens >= 20
    assert tok.decode(
        [i for i, lab in zip(ex.input_ids, ex.labels, strict=True) if lab == IGNORE_INDEX]
    ).endswith("END")


def test_collate_pads_right_and_masks_labels() -> None:
    _, tok = tiny_model("llama")
    examples = encode_records([Record("a", "b"), Record("a longer one", "bb")], tok, "alpaca", 128)
    batch = collate(examples, tok.pad_token_id)
    short = len(examples[0].input_ids)
    assert batch["attention_mask"][0, short:].sum() == 0
    assert (batch["labels"][0, short:] == IGNORE_INDEX).all()


def test_bucketing_groups_similar_lengths_and_covers_all() -> None:
    lengths = [i % 50 for i in range(400)]
    batches = batch_indices(lengths, 8, seed=0, bucketing=True)
    assert sorted(i for b in batches for i in b) == list(range(400))
    spread = sum(max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in batches) / len(batches)
    plain = batch_indices(lengths, 8, seed=0, bucketing=False)
    plain_spread = sum(max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in plain) / len(plain)
    assert spread < plain_spread / 3


def test_causal_lm_nll_matches_manual() -> None:
    logits = torch.randn(2, 5, 7)
    labels = torch.tensor([[-100, 1, 2, -100, 3], [-100, -100, 4, 5, 6]])
    nll, count = causal_lm_nll(logits, labels)
    manual, n = 0.0, 0
    for b in range(2):
        for t in range(4):
            if labels[b, t + 1] != -100:
                manual -= torch.log_softmax(logits[b, t], -1)[labels[b, t + 1]].item()
                n += 1
    assert count == n
    assert math.isclose(nll.item(), manual, rel_tol=1e-5)


def test_proximal_term() -> None:
    params = {"w": torch.tensor([1.0, 2.0])}
    assert proximal_term(params, {"w": torch.tensor([0.0, 0.0])}).item() == pytest.approx(5.0)


def test_schedules() -> None:
    assert schedule_factor("constant", 5, 10) == 1.0
    assert schedule_factor("cosine", 0, 10) == pytest.approx(1.0)
    assert schedule_factor("cosine", 10, 10) == pytest.approx(0.0)
    assert schedule_factor("linear", 5, 10) == pytest.approx(0.5)
    assert schedule_factor("linear", 0, 10, warmup=4) == pytest.approx(0.25)
    assert schedule_factor("cosine", 10, 10, min_ratio=0.1) == pytest.approx(0.1)


@pytest.mark.parametrize("name", ["adamw", "sgd", "prodigy"])
def test_optimizers_build(name: str) -> None:
    param = torch.nn.Parameter(torch.zeros(3))
    opt = build_optimizer([param], name, lr=1.0 if name == "prodigy" else 0.1)
    assert opt.param_groups


def lora_setup() -> tuple[torch.nn.Module, list[dict[str, torch.Tensor]]]:
    model, tok = tiny_model("llama", seed=0)
    peft_model = attach_lora(model, r=4, alpha=8, dropout=0.0, seed=0)
    examples = encode_records([Record(f"say {i}", f"word {i}") for i in range(8)], tok, "alpaca", 64)
    batches = [collate(examples[i : i + 4], tok.pad_token_id) for i in range(0, 8, 4)]
    return peft_model, batches


def test_training_reduces_loss_and_changes_only_the_adapter() -> None:
    model, batches = lora_setup()
    base_before = {n: p.clone() for n, p in model.named_parameters() if not p.requires_grad}
    opt = build_optimizer(model.parameters(), "adamw", lr=0.05)
    first = train_local(model, batches, opt, None, steps=1)
    later = train_local(model, batches, opt, None, steps=10)
    assert later.loss < first.loss
    assert all(torch.equal(p, base_before[n]) for n, p in model.named_parameters() if not p.requires_grad)
    assert later.tokens == sum(int(b["attention_mask"].sum()) for b in batches) * 5


def test_grad_accumulation_equals_one_big_batch() -> None:
    model_a, batches = lora_setup()
    model_b, _ = lora_setup()
    big = collate_concat(batches)
    opt_a = build_optimizer(model_a.parameters(), "sgd", lr=0.5)
    opt_b = build_optimizer(model_b.parameters(), "sgd", lr=0.5)
    train_local(model_a, batches, opt_a, None, steps=1, grad_accum=2)
    train_local(model_b, [big], opt_b, None, steps=1)
    for (_, pa), (_, pb) in zip(
        adapter_arrays(model_a).items(), adapter_arrays(model_b).items(), strict=True
    ):
        assert torch.allclose(torch.from_numpy(pa), torch.from_numpy(pb), atol=1e-5)


def collate_concat(batches: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    width = max(b["input_ids"].shape[1] for b in batches)
    out = {}
    for key, fill in (("input_ids", 0), ("attention_mask", 0), ("labels", -100)):
        padded = [torch.nn.functional.pad(b[key], (0, width - b[key].shape[1]), value=fill) for b in batches]
        out[key] = torch.cat(padded)
    return out


def test_adapter_state_round_trip_and_shape_check() -> None:
    model, _ = lora_setup()
    state = adapter_arrays(model)
    changed = {k: v + 1.0 for k, v in state.items()}
    load_adapter(model, changed)
    for key, value in adapter_arrays(model).items():
        assert (value == changed[key]).all()
    bad = dict(changed)
    first = next(iter(bad))
    bad[first] = bad[first][:1]
    with pytest.raises(ValueError, match="shape"):
        load_adapter(model, bad)
    with pytest.raises(KeyError, match="lacks"):
        load_adapter(model, {})


def tiny_gemma(
    cap: float | None,
    family: str = "gemma3_text",
    sliding_window: int = 4096,
    num_layers: int = 2,
    layer_types: list[str] | None = None,
) -> tuple[torch.nn.Module, object]:
    """A tiny random Gemma (2 or 3) causal LM on the tiny llama tokenizer; ``cap``: its logit soft-capping,
    ``layer_types``: each layer's sliding or full attention (default: the family's own pattern)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    _, tok = tiny_model("llama")
    config = AutoConfig.for_model(
        family,
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=num_layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=256,
        final_logit_softcapping=cap,
        sliding_window=sliding_window,
        pad_token_id=tok.pad_token_id,
        **({} if layer_types is None else {"layer_types": layer_types}),
    )
    torch.manual_seed(1)
    return AutoModelForCausalLM.from_config(config), tok


TARGETS = {"gemma2-capped": ["q_proj", "v_proj"]}


@pytest.mark.parametrize(
    "arch", ["llama", "qwen2", "gpt2", "gemma3-uncapped", "gemma3-capped", "gemma2-capped"]
)
def test_response_nll_equals_the_full_logits_loss(arch: str) -> None:
    if arch.startswith("gemma"):
        family, capping = arch.split("-")
        model, tok = tiny_gemma(0.5 if capping == "capped" else None, family.replace("3", "3_text"))
        assert head_at_positions(model) is not None  # the fast path, not the fallback
    else:
        model, tok = tiny_model(arch, seed=1)
    peft_model = attach_lora(model, r=4, alpha=8, dropout=0.0, seed=0, target_modules=TARGETS.get(arch))
    examples = encode_records(
        [Record("define x", "a letter"), Record("q", "longer answer here")], tok, "alpaca", 96
    )
    batch = collate(examples, tok.pad_token_id)
    fast, count = response_nll(peft_model, batch)
    logits = peft_model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    full, full_count = causal_lm_nll(logits, batch["labels"])
    assert count == full_count
    assert torch.allclose(fast, full, rtol=1e-5)
    fast.backward()
    grads = [p.grad for p in peft_model.parameters() if p.requires_grad]
    assert all(g is not None for g in grads) and any(float(g.abs().sum()) > 0 for g in grads)


def test_adapter_io_matches_peft_public_api() -> None:
    from peft import get_peft_model_state_dict

    model, _ = lora_setup()
    changed = {k: v + 0.5 for k, v in adapter_arrays(model).items()}
    load_adapter(model, changed)
    via_peft = get_peft_model_state_dict(model)
    assert via_peft.keys() == changed.keys()
    for key, value in via_peft.items():
        assert torch.equal(value, torch.from_numpy(changed[key]))


def test_masked_entries_never_move_even_with_weight_decay_and_momentum() -> None:
    model, batches = lora_setup()
    named = {n: p for n, p in model.named_parameters() if p.requires_grad}
    with torch.no_grad():  # non-zero everywhere, so decoupled weight decay would move any entry
        for p in named.values():
            p.add_(0.05)
    generator = torch.Generator().manual_seed(0)
    masks = {n: torch.rand(p.shape, generator=generator) > 0.5 for n, p in named.items()}
    before = {n: p.detach().clone() for n, p in named.items()}
    opt = build_optimizer(model.parameters(), "adamw", lr=0.05, weight_decay=0.1)
    train_local(model, batches, opt, None, steps=4, grad_masks=masks, prox_mu=0.1, prox_reference=before)
    for name, p in named.items():
        assert torch.equal(p[~masks[name]], before[name][~masks[name]]), name
        assert not torch.equal(p[masks[name]], before[name][masks[name]]), name


def test_a_mask_for_a_frozen_parameter_is_an_error() -> None:
    model, batches = lora_setup()
    frozen = next(n for n, p in model.named_parameters() if not p.requires_grad)
    opt = build_optimizer(model.parameters(), "sgd", lr=0.1)
    with pytest.raises(KeyError, match="does not train"):
        train_local(model, batches, opt, None, steps=1, grad_masks={frozen: torch.ones(1, dtype=torch.bool)})


def test_only_trainable_selects_and_restores_flags() -> None:
    from fedtune.train.sft import only_trainable

    model, _ = lora_setup()
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    head = dict(model.named_parameters())
    chosen = {n: p for n, p in head.items() if "lm_head" in n or "embed" in n}
    with only_trainable(model, chosen):
        assert {n for n, p in model.named_parameters() if p.requires_grad} == set(chosen)
    assert {n: p.requires_grad for n, p in model.named_parameters()} == flags


def _layer_training(dtype: torch.dtype, master: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight before, weight after) of one MLP projection trained with tiny SGD steps."""
    from fedtune.train.loop import FP32Master

    model, tok = tiny_model("llama", seed=0)
    model = model.to(dtype)
    examples = encode_records([Record(f"say {i}", f"word {i}") for i in range(8)], tok, "alpaca", 64)
    batches = [collate(examples[i : i + 4], tok.pad_token_id) for i in range(0, 8, 4)]
    name, weight = next((n, p) for n, p in model.named_parameters() if "layers.0.mlp.down_proj" in n)
    for p in model.parameters():
        p.requires_grad_(p is weight)
    helper = FP32Master.needed({name: weight}) if master else None
    params = helper.optimizer_parameters() if helper is not None else [weight]
    before = weight.detach().float().clone()
    opt = build_optimizer(params, "sgd", lr=2e-3)
    train_local(model, batches, opt, None, steps=30, master=helper)
    return before, weight.detach().float()


def test_bf16_full_layers_train_through_fp32_master_copies() -> None:
    ref_before, ref_after = _layer_training(torch.float32, master=False)
    before, with_master = _layer_training(torch.bfloat16, master=True)
    _, without = _layer_training(torch.bfloat16, master=False)
    reference = ref_after - ref_before
    # Pure bf16 rounds most of these small steps away; the fp32 copies keep them.
    kept = torch.nn.functional.cosine_similarity((with_master - before).ravel(), reference.ravel(), dim=0)
    lost = torch.nn.functional.cosine_similarity((without - before).ravel(), reference.ravel(), dim=0)
    assert kept > 0.9 and kept > lost + 0.2, (float(kept), float(lost))
