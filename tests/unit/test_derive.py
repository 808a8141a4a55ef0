"""Deriving a smaller same-vocabulary model: layer choice, truncation, distillation, saving and loading."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

from fedtune.data.builtin import list_builtin
from fedtune.data.loaders import load_dataset_records
from fedtune.data.records import Record
from fedtune.data.tokenize import collate
from fedtune.models.derived import default_derived_name, derived_table
from fedtune.models.layers import decoder_layers, keep_layer_indices, truncate_layers
from fedtune.models.loading import ModelError, load_causal_lm
from fedtune.models.tiny import tiny_model
from fedtune.train.distill import (
    derive_model,
    distill,
    encode_texts,
    position_logits,
    public_texts,
    split_held_out,
)
from fedtune.train.losses import distillation_kl

TEXTS = [f"Item {i} costs {i * 3} coins, so {i + 1} of them cost {(i + 1) * i * 3}." for i in range(24)]


def _tiny_mistral() -> PreTrainedModel:
    config = AutoConfig.for_model(
        "mistral", vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
    )  # fmt: skip
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval()


def _kl_per_position(
    student: torch.nn.Module, teacher: torch.nn.Module, batch: dict[str, torch.Tensor]
) -> float:
    with torch.no_grad():
        kl = distillation_kl(position_logits(student, batch), position_logits(teacher, batch))
    return float(kl) / int(batch["attention_mask"].sum())


@pytest.mark.parametrize(
    ("num_layers", "keep", "expected"),
    [
        (30, 10, [0, 3, 6, 10, 13, 16, 19, 23, 26, 29]),
        (4, 2, [0, 3]),
        (5, 5, [0, 1, 2, 3, 4]),
        (6, 1, [5]),
    ],
)
def test_keep_layer_indices_spreads_evenly_from_first_to_last(
    num_layers: int, keep: int, expected: list[int]
) -> None:
    assert keep_layer_indices(num_layers, keep) == expected


@pytest.mark.parametrize(("num_layers", "keep"), [(30, 0), (30, 31), (0, 1), (4, -1)])
def test_keep_layer_indices_rejects_impossible_counts(num_layers: int, keep: int) -> None:
    with pytest.raises(ValueError, match="layer"):
        keep_layer_indices(num_layers, keep)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_truncated_model_decodes_the_same_with_and_without_kv_cache(arch: str) -> None:
    teacher, tok = tiny_model(arch, num_layers=4)
    student = truncate_layers(teacher, [0, 3])
    prompt = tok(["The cat sat on"], return_tensors="pt")["input_ids"]

    cached = student.generate(prompt, max_new_tokens=10, do_sample=False, use_cache=True)
    uncached = student.generate(prompt, max_new_tokens=10, do_sample=False, use_cache=False)

    assert torch.equal(cached, uncached)
    assert student.config.num_hidden_layers == 2
    assert [module.layer_idx for module in student.modules() if hasattr(module, "layer_idx")] == [0, 1]


def test_truncation_copies_the_kept_layers_and_leaves_the_source_alone() -> None:
    teacher, _ = tiny_model("qwen2", num_layers=4)
    before = {key: value.clone() for key, value in teacher.state_dict().items()}

    student = truncate_layers(teacher, [1, 3])

    teacher_layers, student_layers = decoder_layers(teacher), decoder_layers(student)
    assert len(teacher_layers) == 4 and teacher.config.num_hidden_layers == 4
    assert teacher_layers[3].self_attn.layer_idx == 3
    for new, old in ((0, 1), (1, 3)):
        for (_, kept), (_, source) in zip(
            student_layers[new].state_dict().items(), teacher_layers[old].state_dict().items(), strict=True
        ):
            assert torch.equal(kept, source)
    assert student.config.layer_types == [teacher.config.layer_types[1], teacher.config.layer_types[3]]
    assert student.model.embed_tokens.weight.data_ptr() != teacher.model.embed_tokens.weight.data_ptr()
    assert all(torch.equal(value, teacher.state_dict()[key]) for key, value in before.items())


def test_keeping_every_layer_reproduces_the_model() -> None:
    teacher = _tiny_mistral()
    input_ids = torch.randint(0, 64, (2, 7))

    student = truncate_layers(teacher, [0, 1, 2, 3])

    with torch.no_grad():
        assert torch.allclose(student(input_ids).logits, teacher(input_ids).logits)


def test_truncate_names_an_unsupported_architecture() -> None:
    class Seq2Seq(torch.nn.Module):
        config = SimpleNamespace(model_type="t5")

    with pytest.raises(ValueError, match="'t5'"):
        truncate_layers(Seq2Seq(), [0])  # type: ignore[arg-type]


def test_truncate_keeps_bert_layers_for_the_layer_drop_baseline() -> None:
    encoder, _ = tiny_model("bert", num_layers=4)
    batch = {"input_ids": torch.tensor([[5, 6, 7]]), "attention_mask": torch.ones(1, 3, dtype=torch.long)}

    student = truncate_layers(encoder, [0, 3])

    assert student.config.num_hidden_layers == 2 and len(student.bert.encoder.layer) == 2
    assert student(**batch).logits.shape == encoder(**batch).logits.shape


@pytest.mark.parametrize("indices", [[], [2, 1], [0, 0], [0, 4]])
def test_truncate_rejects_bad_indices(indices: list[int]) -> None:
    teacher, _ = tiny_model("llama", num_layers=4)
    with pytest.raises(ValueError, match="increasing"):
        truncate_layers(teacher, indices)


def test_the_distillation_loss_is_zero_for_equal_logits_and_matches_the_definition() -> None:
    student_logits, teacher_logits = torch.randn(5, 11), torch.randn(5, 11)
    teacher_probs = teacher_logits.softmax(-1)
    manual = (teacher_probs * (teacher_probs.log() - student_logits.log_softmax(-1))).sum()

    assert torch.allclose(distillation_kl(student_logits, teacher_logits), manual, atol=1e-5)
    assert float(distillation_kl(teacher_logits, teacher_logits)) == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_distillation_reduces_the_kl_to_the_teacher(arch: str) -> None:
    teacher, tok = tiny_model(arch, num_layers=4)
    batch = collate(encode_texts(TEXTS[:8], tok, 48), tok.pad_token_id)
    student = truncate_layers(teacher, [0, 3])
    kl_before = _kl_per_position(student, teacher, batch)

    losses = distill(student, teacher, [batch], steps=6, lr=1e-3)

    assert len(losses) == 6
    assert _kl_per_position(student, teacher, batch) < 0.5 * kl_before
    assert not student.training


def test_micro_batches_give_the_same_steps_as_whole_batches() -> None:
    teacher, tok = tiny_model("llama", num_layers=4)
    batch = collate(encode_texts(TEXTS[:6], tok, 48), tok.pad_token_id)

    whole = distill(truncate_layers(teacher, [0, 3]), teacher, [batch], steps=3, lr=1e-3)
    micro = distill(truncate_layers(teacher, [0, 3]), teacher, [batch], steps=3, lr=1e-3, micro_batch_size=4)

    assert micro == pytest.approx(whole, rel=1e-4)


def test_public_texts_read_only_public_splits_rendered_with_the_alpaca_template(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    splits_read: list[str] = []

    def recording_loader(spec: str, split: str) -> list[Record]:
        splits_read.append(split)
        return load_dataset_records(spec, split)

    monkeypatch.setattr("fedtune.train.distill.load_dataset_records", recording_loader)

    texts = public_texts()

    assert len(texts) == sum(info.splits["public"] for info in list_builtin())
    assert set(splits_read) == {"public"}
    assert all(text.startswith("Below is an instruction") for text in texts)


def test_held_out_texts_are_fixed_and_disjoint_from_training_texts() -> None:
    train, held = split_held_out(TEXTS, 5)
    assert len(held) == 5 and not set(held) & set(train) and len(train) == len(TEXTS) - 5
    assert split_held_out(TEXTS, 5) == (train, held)
    with pytest.raises(ValueError, match="texts"):
        split_held_out(TEXTS[:3], 3)


def test_derive_model_saves_a_model_that_loads_by_name(tmp_path: Path) -> None:
    result = derive_model(
        "tiny-llama-L4-H32", keep_layers=2, steps=3, name="small-llama", cache_dir=tmp_path,
        batch_size=4, max_length=48, lr=1e-3, texts=TEXTS, held_out=4, progress=False,
    )  # fmt: skip

    model, tokenizer = load_causal_lm("small-llama", cache_dir=tmp_path)
    record = json.loads((tmp_path / "derived" / "small-llama" / "derive.json").read_text())
    assert model.config.num_hidden_layers == 2 and len(tokenizer) == model.config.vocab_size
    assert result.kept_layers == record["kept_layers"] == [0, 3]
    assert record["student_ppl_after"] == result.student_ppl_after
    assert record["train_texts"] == 20 and record["held_out_texts"] == 4 and len(record["losses"]) == 3
    assert list((tmp_path / "tmp").iterdir()) == []  # no staging leftovers
    assert [row["name"] for row in derived_table(tmp_path)] == ["small-llama"]
    with pytest.raises(FileExistsError, match="--force"):
        derive_model("tiny-llama-L4-H32", keep_layers=2, steps=1, name="small-llama", cache_dir=tmp_path)


def test_an_underived_default_name_says_how_to_derive_it(tmp_path: Path) -> None:
    name = default_derived_name("smollm2-135m-instruct", 10)
    assert name == "smollm2-135m-instruct-l10"
    with pytest.raises(ModelError, match="fedtune models derive smollm2-135m-instruct --layers 10"):
        load_causal_lm(name, cache_dir=tmp_path)


@pytest.mark.parametrize("name", ["tiny-llama-small", "smollm2-135m-instruct", "../escape", "a/b"])
def test_derive_model_refuses_names_that_would_not_load_as_derived(name: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="name"):
        derive_model("tiny-llama", keep_layers=1, steps=1, name=name, cache_dir=tmp_path, texts=TEXTS)


def test_truncating_gemma3_keeps_each_layer_its_own_attention_pattern() -> None:
    from tests.unit.test_train import tiny_gemma

    layer_types = ["sliding_attention", "full_attention"] * 2
    teacher, _ = tiny_gemma(None, sliding_window=3, num_layers=4, layer_types=layer_types)
    teacher.eval()
    input_ids = torch.randint(0, teacher.config.vocab_size, (2, 9))  # longer than the sliding window

    every = truncate_layers(teacher, [0, 1, 2, 3])
    student = truncate_layers(teacher, [1, 2])
    # The same weights in a model built from the student's config: its layer types must agree with the layers.
    rebuilt = AutoModelForCausalLM.from_config(student.config).eval()
    rebuilt.load_state_dict(student.state_dict())

    assert student.config.layer_types == ["full_attention", "sliding_attention"]
    with torch.no_grad():
        assert torch.allclose(every(input_ids).logits, teacher(input_ids).logits)
        assert torch.allclose(student(input_ids).logits, rebuilt(input_ids).logits, atol=1e-6)
    cached = student.generate(input_ids[:1], max_new_tokens=6, do_sample=False, use_cache=True)
    uncached = student.generate(input_ids[:1], max_new_tokens=6, do_sample=False, use_cache=False)
    assert torch.equal(cached, uncached)


def test_derive_reports_distillation_progress_in_a_log_that_is_no_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    derive_model(
        "tiny-llama-L4-H32", keep_layers=2, steps=20, name="logged", cache_dir=tmp_path,
        batch_size=4, max_length=32, lr=1e-3, texts=TEXTS, held_out=4,
    )  # fmt: skip

    lines = [line for line in capsys.readouterr().err.splitlines() if ": KL " in line]
    # a line every tenth of the steps, each with its step and loss
    assert [line.split("distil ")[1].split(":")[0] for line in lines] == [f"{k}/20" for k in range(2, 21, 2)]
