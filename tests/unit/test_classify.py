"""Sequence-classification data: class names, ids, encoding, batches, loss and metrics."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import PreTrainedTokenizerFast

from fedtune.data.classify import (
    CLASS_LABELS,
    ClassExample,
    class_id,
    class_names,
    classification_batches,
    classification_loss,
    classification_metrics,
    encode_classification,
    macro_f1,
    predict_classes,
)
from fedtune.data.records import DataError, Record
from fedtune.models.tiny import tiny_tokenizer
from fedtune.train.loop import batch_targets


def choice(label: int) -> Record:
    return Record("same sense?", ["no", "yes"][label], input="a / b", choices=("no", "yes"), label=label)


def test_class_names_come_from_labels_choices_or_the_builtin_meta() -> None:
    plain = [Record("x", "noun.act", category="noun.act")]

    assert class_names("anything", plain, ["b", "a"]) == ["b", "a"]
    assert class_names("wordnet-wic", [choice(0), choice(1)]) == ["no", "yes"]
    assert class_names("wordnet-lexclass", plain)[:2] == ["noun.act", "noun.animal"]
    with pytest.raises(DataError, match="class names"):
        class_names("my.jsonl", plain)


def test_different_choices_are_refused() -> None:
    other = Record("q", "b", choices=("a", "b"), label=1)

    with pytest.raises(DataError, match="different choices"):
        class_names("pairs", [choice(0), other])


def test_class_id_is_the_label_or_the_output_position() -> None:
    assert class_id(choice(1), ["no", "yes"]) == 1
    assert class_id(Record("x", "c"), ["a", "b", "c"]) == 2
    with pytest.raises(DataError, match="'z' is not one of the 3 class names"):
        class_id(Record("x", "z", id="r7"), ["a", "b", "c"])


def test_pair_records_are_encoded_as_two_segments() -> None:
    tokenizer = tiny_tokenizer()
    single, pair = encode_classification(
        [Record("ab", "b"), Record("ab", "b", input="cd")], tokenizer, ["a", "b"], 64
    )

    assert single.label == pair.label == 1
    assert len(pair.input_ids) > len(single.input_ids)
    assert len(encode_classification([Record("x" * 100, "a")], tokenizer, ["a"], 16)[0].input_ids) == 16


def test_batches_cover_every_example_once_per_epoch_and_count_examples() -> None:
    examples = [ClassExample([1] * (i + 1), i % 3) for i in range(5)]

    batches = classification_batches(examples, 2, 0, seed=3, epochs=2)

    assert len(batches) == 6
    labels = torch.cat([b[CLASS_LABELS] for b in batches[:3]]).tolist()
    assert sorted(labels) == sorted(ex.label for ex in examples)
    widths = [len(ex.input_ids) for ex in examples]
    assert sorted(int(n) for b in batches[:3] for n in b["attention_mask"].sum(1)) == sorted(widths)
    assert batch_targets(batches[0]) == batches[0][CLASS_LABELS].numel()
    in_order = classification_batches(examples, 2, 0, seed=None)
    assert torch.cat([b[CLASS_LABELS] for b in in_order]).tolist() == [0, 1, 2, 0, 1]


class Fixed(nn.Module):
    """A classifier whose logits are the first input id's one-hot over 3 classes."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(1.0))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> object:
        logits = torch.nn.functional.one_hot(input_ids[:, 0], 3).float() * self.scale

        class Out:
            pass

        out = Out()
        out.logits = logits
        return out


def test_loss_is_the_summed_cross_entropy() -> None:
    batch = {
        "input_ids": torch.tensor([[0], [2]]),
        "attention_mask": torch.ones(2, 1),
        CLASS_LABELS: torch.tensor([0, 1]),
    }

    loss, count = classification_loss(Fixed(), batch)

    expected = torch.nn.functional.cross_entropy(torch.eye(3)[[0, 2]], torch.tensor([0, 1]), reduction="sum")
    assert count == 2
    torch.testing.assert_close(loss, expected)


def test_predictions_and_metrics() -> None:
    batch = {
        "input_ids": torch.tensor([[0], [2], [1]]),
        "attention_mask": torch.ones(3, 1),
        CLASS_LABELS: torch.tensor([0, 1, 1]),
    }

    predicted, gold = predict_classes(Fixed(), [batch])

    assert predicted == [0, 2, 1] and gold == [0, 1, 1]
    metrics = classification_metrics(predicted, gold, 3)
    assert metrics["accuracy"] == pytest.approx(2 / 3)
    # class 0: F1 1; class 1: tp 1, fn 1 -> 2/3; class 2: fp 1 -> 0
    assert metrics["macro_f1"] == pytest.approx((1 + 2 / 3 + 0) / 3)
    assert macro_f1([], [], 2) == 0.0


def pair_tokenizer() -> PreTrainedTokenizerFast:
    """The tiny byte tokenizer made BERT-like: ``[CLS] a [SEP] b [SEP]`` with segment ids 0 / 1."""
    from tokenizers import processors

    tokenizer = tiny_tokenizer()
    specials = [(t, tokenizer.convert_tokens_to_ids(t)) for t in ("[CLS]", "[SEP]")]
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=specials
    )
    tokenizer.model_input_names = ["input_ids", "token_type_ids", "attention_mask"]
    return tokenizer


def test_a_pair_keeps_its_segment_ids_through_batches_and_the_classifier() -> None:
    """A BERT-family encoder embeds segment B with its own token-type embedding: the classifier must
    see the ids the tokenizer gave, not all zeros (which embeds B as if it were A)."""
    from fedtune.data.classify import class_logits
    from fedtune.models.tiny import tiny_model

    tokenizer = pair_tokenizer()
    model, _ = tiny_model("bert", tokenizer=tokenizer, num_labels=2)
    records = [Record("ab", "yes", input="cde"), Record("abcd", "no", input="e")]
    pad = int(tokenizer.pad_token_id)

    examples = encode_classification(records, tokenizer, ["no", "yes"], 64)
    (batch,) = classification_batches(examples, 2, pad, seed=None)

    direct = tokenizer(
        [r.instruction for r in records], [r.input for r in records], padding=True, return_tensors="pt"
    )
    assert direct["token_type_ids"].max() == 1
    torch.testing.assert_close(batch["token_type_ids"], direct["token_type_ids"])
    with torch.no_grad():
        torch.testing.assert_close(class_logits(model, batch), model(**direct).logits)
        plain = model(input_ids=direct["input_ids"], attention_mask=direct["attention_mask"]).logits
    assert not torch.allclose(plain, model(**direct).logits)  # the segment ids matter to this model


def test_single_segment_tokenizers_add_no_segment_ids() -> None:
    tokenizer = tiny_tokenizer()
    (example,) = encode_classification([Record("ab", "b", input="cd")], tokenizer, ["a", "b"], 64)

    (batch,) = classification_batches([example], 1, 0, seed=None)

    assert "token_type_ids" not in batch
