import math
from types import SimpleNamespace
from typing import Any, Literal

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedtune.decode.generate import pad_sequences
from fedtune.eval.scoring import (
    IGNORE_INDEX,
    choice_example,
    choice_log_likelihoods,
    classification_accuracy,
    evaluate_generation,
    multiple_choice_accuracy,
    perplexity,
    score_generations,
    sequence_nll,
)
from fedtune.models.tiny import tiny_model, tiny_tokenizer


class BigramLM(nn.Module):
    """Next-token logits are a row of ``table`` picked by the current token: fully controlled scores."""

    def __init__(self, table: Tensor) -> None:
        super().__init__()
        self.table = nn.Parameter(table)

    def forward(self, input_ids: Tensor, **_: Any) -> SimpleNamespace:
        return SimpleNamespace(logits=self.table[input_ids])


class FirstTokenClassifier(nn.Module):
    """Predicts class ``input_ids[:, 0]``."""

    def __init__(self) -> None:
        super().__init__()
        self.anchor = nn.Parameter(torch.zeros(1))

    def forward(self, input_ids: Tensor, attention_mask: Tensor, **_: Any) -> SimpleNamespace:
        return SimpleNamespace(logits=F.one_hot(input_ids[:, 0], 2).float())


class ConstantAnswerLM(nn.Module):
    """Writes ``answer`` then EOS whatever the prompt; its "cache" is the number of steps taken."""

    def __init__(self, answer: list[int], vocab_size: int, eos_id: int) -> None:
        super().__init__()
        self.answer, self.vocab_size, self.eos_id = answer, vocab_size, eos_id
        self.anchor = nn.Parameter(torch.zeros(1))

    def forward(self, input_ids: Tensor, past_key_values: int | None = None, **_: Any) -> SimpleNamespace:
        step = past_key_values or 0
        token = self.answer[step] if step < len(self.answer) else self.eos_id
        logits = torch.zeros(*input_ids.shape, self.vocab_size)
        logits[..., token] = 1.0
        return SimpleNamespace(logits=logits, past_key_values=step + 1)


def lm_batch(sequences: list[list[int]], side: Literal["left", "right"]) -> dict[str, Tensor]:
    """Every real token but the first labelled: the first has no context in either padding layout."""
    input_ids, attention_mask = pad_sequences(sequences, 0, side=side)
    first_token = attention_mask.cumsum(dim=-1) == 1
    labels = input_ids.masked_fill((attention_mask == 0) | first_token, IGNORE_INDEX)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def test_sequence_nll_matches_manual_cross_entropy() -> None:
    # Prepare: prompt tokens (first three) and row 1's last token unscored: 4 + 3 scored targets
    model, _ = tiny_model("llama")
    input_ids = torch.randint(0, 256, (2, 7), generator=torch.Generator().manual_seed(0))
    labels = input_ids.clone()
    labels[:, :3] = IGNORE_INDEX
    labels[1, -1] = IGNORE_INDEX
    with torch.no_grad():
        logits = model(input_ids=input_ids).logits
    expected = F.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), reduction="sum"
    )

    # Execute
    nll, num_tokens = sequence_nll(model, {"input_ids": input_ids, "labels": labels})

    # Assert
    assert num_tokens == 7
    assert nll == pytest.approx(float(expected), rel=1e-5)


def test_sequence_nll_does_not_depend_on_padding_side() -> None:
    # Prepare
    model, _ = tiny_model("qwen2")
    sequences = [[10, 20, 30, 40, 50], [60, 70, 80]]

    # Execute
    right = sequence_nll(model, lm_batch(sequences, "right"))
    left = sequence_nll(model, lm_batch(sequences, "left"))

    # Assert
    assert right[1] == left[1] == 6
    assert right[0] == pytest.approx(left[0], rel=1e-5)


def test_perplexity_weighs_every_token_equally_across_batches() -> None:
    # Prepare
    model, _ = tiny_model("gpt2")
    batches = [lm_batch([[1, 2, 3, 4]], "right"), lm_batch([[5, 6], [7, 8, 9]], "right")]
    parts = [sequence_nll(model, batch) for batch in batches]

    # Execute
    value = perplexity(model, batches)

    # Assert: (3 + 1 + 2) scored tokens in total
    assert sum(count for _, count in parts) == 6
    assert value == pytest.approx(math.exp(sum(nll for nll, _ in parts) / 6), rel=1e-6)


def test_choice_example_moves_trailing_space_to_the_choice() -> None:
    # Prepare
    tokenizer = tiny_tokenizer()

    # Execute
    input_ids, labels = choice_example(tokenizer, "Q: ", "ab")

    # Assert: byte-level tokens "Q", ":", " ", "a", "b"; the space is scored with the choice
    assert input_ids == tokenizer("Q: ab")["input_ids"]
    assert labels == [IGNORE_INDEX, IGNORE_INDEX, *input_ids[2:]]


def bigram_model_and_questions() -> tuple[BigramLM, Any, dict[str, Any]]:
    """Q1: " a" vs " abc" where a->b and b->c are likely; Q2: "b" vs "c" after a space, c likelier."""
    tokenizer = tiny_tokenizer()
    space, a, b, c = tokenizer(" abc")["input_ids"]
    table = torch.zeros(len(tokenizer), len(tokenizer))
    table[a, b] = 10.0
    table[b, c] = 10.0
    table[space, c] = 3.0
    questions = {"prompts": ["Q:", "Q: "], "choices": [[" a", " abc"], ["b", "c"]], "answers": [1, 1]}
    return BigramLM(table), tokenizer, questions


def test_choice_log_likelihoods_sum_continuation_log_probs() -> None:
    # Prepare: a row of logits with one entry x and the rest 0 gives that entry x - log(e^x + V - 1)
    model, tokenizer, questions = bigram_model_and_questions()
    vocab_size = len(tokenizer)

    def log_prob(x: float, boost: float) -> float:
        return x - math.log(math.exp(boost) + vocab_size - 1)

    uniform, space_to_c, likely = -math.log(vocab_size), log_prob(3.0, 3.0), log_prob(10.0, 10.0)
    space_to_other = log_prob(0.0, 3.0)

    # Execute
    scores = choice_log_likelihoods(
        model, tokenizer, questions["prompts"], questions["choices"], batch_size=3
    )

    # Assert
    assert scores[0] == pytest.approx(
        [uniform + space_to_other, uniform + space_to_other + 2 * likely], rel=1e-5
    )
    assert scores[1] == pytest.approx([uniform + space_to_other, uniform + space_to_c], rel=1e-5)


def test_multiple_choice_accuracy_and_length_normalised_accuracy() -> None:
    # Prepare: Q1's long choice loses on the sum but wins per character; Q2's answer wins either way
    model, tokenizer, questions = bigram_model_and_questions()

    # Execute
    acc = multiple_choice_accuracy(model, tokenizer, **questions, batch_size=3)
    acc_norm = multiple_choice_accuracy(model, tokenizer, **questions, normalize=True, batch_size=3)

    # Assert
    assert acc == 0.5
    assert acc_norm == 1.0


def test_classification_accuracy_counts_correct_argmax() -> None:
    # Prepare
    batches = [
        {
            "input_ids": torch.tensor([[0, 5], [1, 5]]),
            "attention_mask": torch.ones(2, 2),
            "labels": torch.tensor([0, 0]),
        },
        {
            "input_ids": torch.tensor([[1, 7]]),
            "attention_mask": torch.ones(1, 2),
            "labels": torch.tensor([1]),
        },
    ]

    # Execute
    accuracy = classification_accuracy(FirstTokenClassifier(), batches)

    # Assert
    assert accuracy == pytest.approx(2 / 3)


def test_classification_accuracy_runs_a_tiny_encoder_and_restores_training_mode() -> None:
    # Prepare
    model, tokenizer = tiny_model("bert")
    model.train()
    batch = dict(tokenizer(["good film", "bad film"], padding=True, return_tensors="pt"))
    batch["labels"] = torch.tensor([1, 0])

    # Execute
    accuracy = classification_accuracy(model, [batch])

    # Assert
    assert accuracy in (0.0, 0.5, 1.0)
    assert model.training


def test_evaluate_generation_scores_every_requested_metric() -> None:
    # Prepare: the model always answers "42"
    tokenizer = tiny_tokenizer()
    model = ConstantAnswerLM(tokenizer("42")["input_ids"], len(tokenizer), tokenizer.eos_token_id)
    prompts = ["Q1", "Q2", "Q3"]
    references = ["#### 42", "42", "the answer is 7"]

    # Execute
    report = evaluate_generation(
        model,
        tokenizer,
        prompts,
        references,
        ["math", "math", "qa"],
        metrics=["rougeL", "exact_match", "numeric_accuracy", "dist3"],
        max_new_tokens=8,
    )

    # Assert: rouge-score's tokenizer drops "####", so "42" vs "#### 42" is a full match
    assert report["rougeL"] == pytest.approx(2 / 3)
    assert report["exact_match"] == pytest.approx(1 / 3)
    assert report["numeric_accuracy"] == pytest.approx(2 / 3)
    assert report["dist3"] == 0.0
    assert report["by_category"]["rougeL"] == {"math": 1.0, "qa": 0.0}
    assert report["by_category"]["numeric_accuracy"] == {"math": 1.0, "qa": 0.0}
    assert "dist3" not in report["by_category"]
    assert report["samples"][0] == ("Q1", "42", "#### 42")


def test_score_generations_dist_n_and_sample_cap() -> None:
    # Prepare: trigrams abc, bcd, abc, bce -> 3 of 4 distinct; 4-grams 2 of 2
    predictions = ["a b c d", "a b c e"] + ["x"] * 5
    prompts = [f"p{index}" for index in range(7)]

    # Execute
    report = score_generations(prompts, predictions, predictions, ["general"] * 7, ["dist3", "dist4"])

    # Assert
    assert report["dist3"] == 0.75
    assert report["dist4"] == 1.0
    assert report["by_category"] == {}
    assert len(report["samples"]) == 5


def test_unknown_metric_is_an_error_with_a_suggestion() -> None:
    with pytest.raises(ValueError, match="did you mean 'rougeL'"):
        score_generations(["p"], ["a"], ["a"], ["general"], ["rougel"])


def test_sequence_nll_runs_the_head_only_where_a_token_is_scored() -> None:
    # Prepare: 7 scored targets in a 2 x 7 batch; the head would see 14 positions with the full logits
    model, _ = tiny_model("llama")
    input_ids = torch.randint(0, 256, (2, 7), generator=torch.Generator().manual_seed(0))
    labels = input_ids.clone()
    labels[:, :3] = IGNORE_INDEX
    labels[1, -1] = IGNORE_INDEX
    rows: list[int] = []
    head = model.get_output_embeddings()
    handle = head.register_forward_hook(lambda module, args, output: rows.append(output[..., 0].numel()))

    # Execute
    sequence_nll(model, {"input_ids": input_ids, "labels": labels})
    handle.remove()

    # Assert
    assert rows == [7]
