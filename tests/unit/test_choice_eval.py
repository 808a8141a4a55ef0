"""acc / acc_norm: the choice rules, batched likelihoods, and evaluate_lm on multiple-choice records."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from fedtune.config import ConfigError, EvalConfig, validate_config
from fedtune.data.records import Record
from fedtune.data.templates import build_prompt
from fedtune.eval.evaluate import evaluate_lm
from fedtune.eval.metrics import choice_hits, choice_predictions
from fedtune.eval.scoring import choice_example, choice_log_likelihoods, multiple_choice_scores
from fedtune.models.tiny import tiny_model, tiny_tokenizer

SHORT, LONG = "a", "bbb"


class UnigramLM(nn.Module):
    """The same next-token logits at every position: a choice's log-likelihood is the sum of its
    tokens' log-probabilities, whatever the prompt."""

    def __init__(self, logits: Tensor) -> None:
        super().__init__()
        self.logits = nn.Parameter(logits)

    def forward(self, input_ids: Tensor, **_: Any) -> SimpleNamespace:
        return SimpleNamespace(logits=self.logits.expand(*input_ids.shape, -1))


def short_beats_long_on_the_sum_only() -> UnigramLM:
    """log p("a") ~ -3 and log p("b") ~ -1.5: "a" wins on the sum (-3 vs -4.5), "bbb" per character
    (-1.5 vs -3). The prompt's trailing newline, scored with every choice, gets log p ~ 0 so that
    it does not shift the per-character comparison."""
    tokenizer = tiny_tokenizer()
    logits = torch.zeros(len(tokenizer))
    (newline,) = tokenizer("\n", add_special_tokens=False)["input_ids"]
    logits[newline] = 20.0
    logits[tokenizer(SHORT)["input_ids"][0]] = 17.0
    logits[tokenizer(LONG)["input_ids"][0]] = 18.5
    return UnigramLM(logits)


def settings(*metrics: str, batch_size: int = 3) -> Any:
    return EvalConfig(metrics=list(metrics), batch_size=batch_size)


def choice_record(index: int, label: int, category: str) -> Record:
    choices = (SHORT, LONG)
    return Record(f"Pick one ({index}).", choices[label], "", category, f"q{index}", choices, label)


def test_choice_predictions_compare_sums_or_per_character_means() -> None:
    # Prepare
    scores = [[-3.0, -4.5], [-2.0, -1.0], [-1.0, -1.0]]
    choices = [[SHORT, LONG], [SHORT, LONG], ["x", "y"]]

    # Execute
    by_sum = choice_predictions(scores, choices)
    per_character = choice_predictions(scores, choices, normalize=True)

    # Assert: the tie goes to the first choice
    assert by_sum == [0, 1, 0]
    assert per_character == [1, 1, 0]
    assert choice_hits(per_character, [1, 0, 0]) == [1.0, 0.0, 1.0]


def test_choice_predictions_refuse_scores_that_do_not_match_the_choices() -> None:
    with pytest.raises(ValueError, match="1 scores for 2 choices"):
        choice_predictions([[-1.0]], [["x", "y"]])


def test_one_pass_gives_acc_and_acc_norm() -> None:
    # Prepare
    model, tokenizer = short_beats_long_on_the_sum_only(), tiny_tokenizer()
    prompts = ["Q1:\n", "Q2:\n"]
    choices = [[SHORT, LONG], [LONG, SHORT]]

    # Execute: the right answer is the short choice in Q1, the long one in Q2
    scores = multiple_choice_scores(model, tokenizer, prompts, choices, [0, 0], batch_size=3)

    # Assert
    assert scores.predicted == [0, 1]
    assert scores.hits == {"acc": [1.0, 0.0], "acc_norm": [0.0, 1.0]}


def test_batched_likelihoods_keep_the_input_order_whatever_the_batch_size() -> None:
    # Prepare: choices of different lengths, so sorting by length reorders them
    model, tokenizer = tiny_model("llama")
    prompts = ["Is it?\n", "A longer question, is it?\n"]
    choices = [["no", "yes", "maybe not"], ["it is not at all", "yes"]]

    # Execute
    one_at_a_time = choice_log_likelihoods(model, tokenizer, prompts, choices, batch_size=1)
    batched = choice_log_likelihoods(model, tokenizer, prompts, choices, batch_size=4)

    # Assert
    assert [len(row) for row in batched] == [3, 2]
    for single, together in zip(one_at_a_time, batched, strict=True):
        assert together == pytest.approx(single, rel=1e-5, abs=1e-5)


def test_max_length_cuts_the_prompt_from_the_left() -> None:
    # Prepare
    tokenizer = tiny_tokenizer()
    full_ids, full_labels = choice_example(tokenizer, "Q: what?\n", "yes")

    # Execute
    ids, labels = choice_example(tokenizer, "Q: what?\n", "yes", max_length=5)

    # Assert: the choice (newline + 3 bytes) stays whole after one prompt token
    assert ids == full_ids[-5:]
    assert labels == full_labels[-5:]
    assert labels[1:] == ids[1:]


def test_evaluate_lm_reports_acc_and_acc_norm_overall_and_per_category() -> None:
    # Prepare: "short" questions are right on the sum only, "long" ones per character only
    model, tokenizer = short_beats_long_on_the_sum_only(), tiny_tokenizer()
    records = [choice_record(i, 0, "short") for i in range(3)] + [choice_record(3, 1, "long")]

    # Execute
    result = evaluate_lm(
        model, tokenizer, records, settings("acc", "acc_norm"), template="alpaca", max_length=64, seed=0
    )

    # Assert
    assert result.metrics == {"acc": 0.75, "acc_norm": 0.25}
    assert result.by_category == {
        "acc": {"long": 0.0, "short": 1.0},
        "acc_norm": {"long": 1.0, "short": 0.0},
    }
    assert result.samples[0] == {
        "prompt": build_prompt(records[0], "alpaca"),
        "prediction": SHORT,
        "reference": SHORT,
    }


class MarkerLM(nn.Module):
    """Prefers "bbb", unless a "#" came earlier in the sequence: then "a" by far."""

    def __init__(self) -> None:
        super().__init__()
        tokenizer = tiny_tokenizer()
        self.marker = tokenizer("#")["input_ids"][0]
        self.short, self.long = tokenizer(SHORT)["input_ids"][0], tokenizer(LONG)["input_ids"][0]
        self.logits = nn.Parameter(torch.zeros(len(tokenizer)))

    def forward(self, input_ids: Tensor, **_: Any) -> SimpleNamespace:
        logits = self.logits.expand(*input_ids.shape, -1).clone()
        logits[..., self.long] += 5.0
        logits[..., self.short] += 50.0 * ((input_ids == self.marker).cumsum(dim=-1) > 0)
        return SimpleNamespace(logits=logits)


def test_choices_are_scored_after_the_runs_template() -> None:
    # Prepare: the Alpaca prompt has "### Response:", the plain one no "#"
    record = choice_record(0, 0, "short")

    # Execute
    def accuracy(template: Any) -> float:
        result = evaluate_lm(
            MarkerLM(), tiny_tokenizer(), [record], settings("acc"), template=template, max_length=256, seed=0
        )
        return result.metrics["acc"]

    # Assert
    assert accuracy("alpaca") == 1.0
    assert accuracy("plain") == 0.0


def test_evaluate_lm_names_the_record_without_choices() -> None:
    # Prepare
    model, tokenizer = short_beats_long_on_the_sum_only(), tiny_tokenizer()
    records = [
        choice_record(0, 0, "short"),
        Record("Define 'cat'.", "a small feline", category="def", id="wni-7"),
    ]

    # Execute / Assert
    with pytest.raises(
        ValueError, match=r"metric 'acc_norm': record 'wni-7' \(example 1, category 'def'\) has no choices"
    ):
        evaluate_lm(model, tokenizer, records, settings("acc_norm"), template="alpaca", max_length=64, seed=0)


def test_choice_metrics_leave_other_results_alone() -> None:
    # Prepare
    model, tokenizer = tiny_model("gpt2")
    records = [choice_record(0, 0, "short"), choice_record(1, 1, "long")]

    # Execute
    result = evaluate_lm(
        model, tokenizer, records, settings("perplexity", "acc"), template="alpaca", max_length=64, seed=0
    )

    # Assert
    assert sorted(result.metrics) == ["acc", "perplexity"]
    assert sorted(result.by_category) == ["acc"]


def test_config_accepts_the_choice_metrics_on_a_multiple_choice_dataset() -> None:
    cfg = validate_config(
        {"data": {"dataset": "wordnet-wic"}, "eval": {"metrics": ["acc", "acc_norm", "rougeL"]}}
    )

    assert cfg.eval.metrics == ["acc", "acc_norm", "rougeL"]


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({"data": {"dataset": "wordnet-instruct"}}, "data.dataset is 'wordnet-instruct', a generation"),
        (
            {"data": {"dataset": "wordnet-wic", "eval_dataset": "arith-word-problems"}},
            "data.eval_dataset is 'arith-word-problems', a math",
        ),
        (
            {"data": {"dataset": "wordnet-wic"}, "eval_extra": ["stdlib-code"]},
            r"eval.extra_datasets\[0\] is 'stdlib-code', a code",
        ),
    ],
)
def test_config_names_the_dataset_that_has_no_choices(raw: dict[str, Any], key: str) -> None:
    extra = raw.pop("eval_extra", [])
    raw["eval"] = {"metrics": ["rougeL", "acc"], "extra_datasets": extra}

    with pytest.raises(ConfigError, match=f"'acc' scores multiple-choice records, but {key} dataset"):
        validate_config(raw)


def test_scoring_only_the_choice_positions_equals_the_full_logits() -> None:
    from fedtune.data.tokenize import IGNORE_INDEX
    from fedtune.eval.scoring import batch_log_likelihoods, scored_log_likelihoods
    from fedtune.models.lora import attach_lora
    from fedtune.models.tiny import tiny_model

    model, _ = tiny_model("llama", seed=3)
    torch.manual_seed(0)
    input_ids = torch.randint(0, 200, (3, 12))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 9:] = 0
    labels = torch.full_like(input_ids, IGNORE_INDEX)
    labels[0, 10:] = input_ids[0, 10:]
    labels[1, 7:9] = input_ids[1, 7:9]
    labels[2, 4] = input_ids[2, 4]
    batch = {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}
    for scored in (model, attach_lora(model, r=2, alpha=4, dropout=0.0)):
        with torch.no_grad():
            full = batch_log_likelihoods(scored, batch)[0]
            kept = scored_log_likelihoods(scored, batch)
        assert torch.allclose(kept, full, atol=1e-5)


def test_shared_prefix_stops_before_the_last_common_unscored_token() -> None:
    from fedtune.data.tokenize import IGNORE_INDEX as N
    from fedtune.eval.scoring import shared_prefix

    # prompt 1 2 3, choices 4 5 / 6: the choices keep token 3, whose logits predict their first token
    assert shared_prefix([([1, 2, 3, 4, 5], [N, N, N, 4, 5]), ([1, 2, 3, 6], [N, N, N, 6])]) == 2
    # the sequences part before the prompt ends (a merge across the boundary): share up to there
    assert shared_prefix([([1, 2, 3, 4], [N, N, N, 4]), ([1, 2, 7, 6], [N, N, N, 6])]) == 1
    # a prompt cut from the left by max_length differs per choice: nothing to share
    assert shared_prefix([([2, 3, 4, 5], [N, N, 4, 5]), ([1, 2, 3, 6], [N, N, N, 6])]) == 0
    assert shared_prefix([([1, 4], [N, 4])]) == 0


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2", "gemma3", "gemma3-window", "llama-lora"])
@pytest.mark.parametrize("max_length", [None, 14])
def test_reading_each_prompt_once_scores_as_the_whole_sequences(arch: str, max_length: int | None) -> None:
    from fedtune.eval.scoring import batch_log_likelihoods
    from fedtune.models.lora import attach_lora

    tokenizer = tiny_tokenizer()
    if arch.startswith("gemma3"):
        from tests.unit.test_train import tiny_gemma

        model = tiny_gemma(None, sliding_window=4 if arch.endswith("window") else 512)[0].eval()
    else:
        model = tiny_model(arch.removesuffix("-lora"), seed=2)[0]
    if arch.endswith("lora"):
        model = attach_lora(model, r=2, alpha=4, dropout=0.0)
    prompts = [
        "Is a cat an animal?\n",
        "Q: ",
        "Define 'x'.\n",
        "A much longer prompt with many words.\n",
        "hi\n",
        "ok?\n",  # at max_length 14 in a batch with prompts cut per choice (nothing shared there)
    ]
    choices = [
        ["yes", "no"],
        [" a", " abc", " b"],
        ["a letter", "to cross out"],
        ["no", "yes"],
        ["x", "y", "z"],
        ["yes", "no"],
    ]
    scores = choice_log_likelihoods(model, tokenizer, prompts, choices, batch_size=4, max_length=max_length)
    with torch.no_grad():
        for prompt, options, got in zip(prompts, choices, scores, strict=True):
            for choice, value in zip(options, got, strict=True):
                ids, labels = choice_example(tokenizer, prompt, choice, max_length)
                batch = {"input_ids": torch.tensor([ids]), "labels": torch.tensor([labels])}
                whole = float(batch_log_likelihoods(model, batch)[0])
                assert value == pytest.approx(whole, abs=1e-4), (prompt, choice)


def test_a_question_reads_its_prompt_once_for_all_its_choices() -> None:
    model, tokenizer = tiny_model("llama", seed=2)
    seen: list[int] = []
    hook = model.get_input_embeddings().register_forward_hook(
        lambda _m, args, _o: seen.append(args[0].numel())
    )
    prompt = "A prompt long enough to matter, read only once.\n"
    choice_log_likelihoods(model, tokenizer, [prompt], [["yes", "no", "maybe"]], batch_size=8)
    hook.remove()
    prompt_tokens = len(tokenizer(prompt)["input_ids"])
    # the prompt once (less its newline, which goes with the choices, and its last token, which the
    # choices keep), then the three short rows: not three whole sequences
    assert seen[0] == prompt_tokens - 2 and len(seen) == 2
    assert sum(seen) < 1.5 * prompt_tokens
