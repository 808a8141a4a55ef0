import math

import pytest

from fedtune.eval.metrics import (
    by_category,
    commonest_answer,
    dist_n,
    exact_match,
    extract_number,
    mean,
    mean_std,
    numeric_accuracy,
    perplexity_from_nll,
    rouge_l,
)


def test_rouge_l_is_lcs_f_measure_with_stemming() -> None:
    # Prepare: "the cat" vs "the cat sat": LCS 2, precision 2/2, recall 2/3, F = 0.8
    predictions = ["the cat", "the cats running", "", "dogs"]
    references = ["the cat sat", "the cat run", "anything", "the cat"]

    # Execute
    scores = rouge_l(predictions, references)

    # Assert
    assert scores == pytest.approx([0.8, 1.0, 0.0, 0.0])


def test_rouge_l_rejects_lists_of_different_length() -> None:
    with pytest.raises(ValueError):
        rouge_l(["a", "b"], ["a"])


def test_dist_n_counts_distinct_ngrams_within_texts() -> None:
    # Prepare: bigrams (a,b) (b,a) (a,b) | (a,b): 2 distinct of 4; unigrams 2 distinct of 6
    texts = ["a b a b", "a b"]

    # Execute / Assert
    assert dist_n(texts, 2) == 0.5
    assert dist_n(texts, 1) == pytest.approx(1 / 3)
    assert dist_n(["one two"], 3) == 0.0
    assert dist_n([], 3) == 0.0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The answer is 42.", 42.0),
        ("She pays 3 then 5 #### 1,234", 1234.0),
        ("first 7 then #### 12 and 99", 12.0),
        ("It costs $5.50 in total", 5.5),
        ("The temperature fell to -3 degrees", -3.0),
        ("She lost -$20", -20.0),
        ("3-4 apples", 4.0),
        ("a total of 3,000,000", 3_000_000.0),
        ("half is .5", 0.5),
        ("5 apples #### none", 5.0),
        ("no digits here", None),
    ],
)
def test_extract_number_gsm8k_style(text: str, expected: float | None) -> None:
    assert extract_number(text) == expected


def test_numeric_accuracy_compares_extracted_numbers() -> None:
    # Prepare
    predictions = ["so the result is 42", "41", "I do not know", "2.50"]
    references = ["#### 42", "#### 42.0", "#### 1", "#### 2.5"]

    # Execute
    scores = numeric_accuracy(predictions, references)

    # Assert
    assert scores == [1.0, 0.0, 0.0, 1.0]


def test_exact_match_normalises_case_space_and_final_punctuation() -> None:
    # Prepare
    predictions = ["  Paris. ", "New   York!", "paris france"]
    references = ["paris", "new york", "Paris"]

    # Execute
    scores = exact_match(predictions, references)

    # Assert
    assert scores == [1.0, 1.0, 0.0]


def test_perplexity_from_nll() -> None:
    # Two tokens with total NLL 4 ln 2: exp(2 ln 2) = 4
    assert perplexity_from_nll(4 * math.log(2), 2) == pytest.approx(4.0)
    assert perplexity_from_nll(1e6, 1) == math.inf
    with pytest.raises(ValueError):
        perplexity_from_nll(1.0, 0)


def test_by_category_averages_each_category() -> None:
    # Execute
    means = by_category([1.0, 0.0, 1.0, 0.5], ["qa", "math", "qa", "math"])

    # Assert: keys sorted
    assert means == {"math": 0.25, "qa": 1.0}
    assert list(means) == ["math", "qa"]


def test_mean_and_mean_std() -> None:
    assert mean([1.0, 2.0, 4.0]) == pytest.approx(7 / 3)
    assert mean_std([1.0, 2.0, 3.0]) == pytest.approx((2.0, 1.0))
    assert mean_std([0.7]) == (0.7, 0.0)
    with pytest.raises(ValueError):
        mean([])


def test_commonest_answer_is_the_share_one_answer_to_every_question_scores() -> None:
    yes_no = [("no", "yes")] * 5
    assert commonest_answer(yes_no, [1, 1, 0, 1, 0]) == ("yes", 0.6)
    assert commonest_answer(yes_no, [0, 0, 0, 1, 1]) == ("no", 0.6)
    assert commonest_answer(yes_no[:2], [1, 0]) == ("no", 0.5)  # a tie: the first choice


def test_commonest_answer_is_none_where_questions_offer_different_choices_or_none() -> None:
    assert commonest_answer([("a", "b"), ("c", "d")], [0, 0]) is None
    assert commonest_answer([], []) is None
    with pytest.raises(ValueError, match="answer 2 is not a choice"):
        commonest_answer([("no", "yes")], [2])
    with pytest.raises(ValueError, match="1 questions' choices for 2 answers"):
        commonest_answer([("no", "yes")], [0, 1])
