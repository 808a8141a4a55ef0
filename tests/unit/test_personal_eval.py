"""Client-side evaluation pieces on fixed inputs: the held-out split and the aggregation."""

from __future__ import annotations

import pytest

from fedtune.config import load_config
from fedtune.data.partition import holdout_split, personal_split
from fedtune.data.records import Record
from fedtune.eval.evaluate import EvalResult, client_results, payload_result, result_payload
from fedtune.rundata import prepare_data


def records(n: int) -> list[Record]:
    return [Record(f"q{i}", f"a{i}") for i in range(n)]


@pytest.mark.parametrize(
    ("n", "fraction", "held"), [(10, 0.2, 2), (3, 0.2, 1), (2, 0.9, 1), (1, 0.5, 0), (7, 0.0, 0)]
)
def test_holdout_sizes(n: int, fraction: float, held: int) -> None:
    train, evaluation = holdout_split(records(n), fraction, seed=0, client="c00")
    assert len(evaluation) == held and len(train) == n - held
    assert sorted(r.instruction for r in train + evaluation) == sorted(r.instruction for r in records(n))


def test_holdout_is_seeded_by_seed_and_client() -> None:
    first = holdout_split(records(50), 0.2, seed=0, client="c00")[1]
    assert first == holdout_split(records(50), 0.2, seed=0, client="c00")[1]
    assert first != holdout_split(records(50), 0.2, seed=1, client="c00")[1]
    assert first != holdout_split(records(50), 0.2, seed=0, client="c01")[1]


def test_personal_validation_is_carved_from_training_records() -> None:
    """``validation`` sets the test records aside unread and holds out again from the rest; ``test`` is
    the plain held-out split."""
    data = records(50)
    train, test = holdout_split(data, 0.2, seed=3, client="c02")
    assert personal_split(data, 0.2, seed=3, client="c02") == (train, test)
    fit, validation = personal_split(data, 0.2, seed=3, client="c02", split="validation")
    assert len(validation) == 8 and len(fit) == 32
    assert not {r.instruction for r in validation} & {r.instruction for r in test}
    assert sorted(r.instruction for r in fit + validation) == sorted(r.instruction for r in train)
    with pytest.raises(ValueError, match="'dev'"):
        personal_split(data, 0.2, seed=3, client="c02", split="dev")


def test_a_validation_run_never_evaluates_or_trains_on_the_clients_test_records() -> None:
    """With ``data.eval_split=validation`` a personal run's clients hold neither their test records in
    what they train on nor in what they are scored on (before, the split named nothing for clients: they
    were scored on their test records)."""
    path = "configs/test/perfit-tiny.yaml"
    test_run, validation_run = (
        prepare_data(load_config(path, [f"data.eval_split={split}"])) for split in ("test", "validation")
    )

    def texts(held: list[Record]) -> set[tuple[str, str, str]]:
        return {(r.instruction, r.input, r.output) for r in held}

    for cid, held in test_run.client_eval.items():
        assert held and validation_run.client_eval[cid]
        seen = validation_run.client_eval[cid] + validation_run.clients[cid]
        assert not texts(held) & texts(seen), cid


def test_a_personal_run_refuses_another_split() -> None:
    with pytest.raises(ValueError, match=r"data\.eval_split 'dev'"):
        load_config("configs/test/perfit-tiny.yaml", ["data.eval_split=dev"])


def test_client_results_plain_and_weighted_means() -> None:
    results = {
        "c0": EvalResult({"perplexity": 10.0, "rougeL": 0.2}),
        "c1": EvalResult({"perplexity": 20.0}),
    }
    merged = client_results(results, {"c0": 1, "c1": 3})
    assert merged.metrics == {"personal/perplexity": 15.0, "personal/perplexity_weighted": 17.5}
    assert merged.by_client == {"c0": {"perplexity": 10.0, "rougeL": 0.2}, "c1": {"perplexity": 20.0}}
    assert client_results({}, {}).metrics == {}


def test_result_payload_round_trip() -> None:
    result = EvalResult({"rougeL": 0.5}, {"rougeL": {"nouns": 0.25, "verbs": 0.75}})
    back = payload_result(result_payload(result))
    assert back.metrics == result.metrics and back.by_category == result.by_category
