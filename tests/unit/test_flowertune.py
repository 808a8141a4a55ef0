"""configs/flowertune/: the four leaderboard recipes validate offline, and their datasets load from local
copies in the hub datasets' own formats (tests/fixtures/flowertune: a few rows each, the real column names
and file types) as they would from the hub id."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fedtune.config import ConfigError, ExperimentConfig, load_config
from fedtune.data.loaders import is_hub_id, load_dataset_records
from fedtune.data.records import DataError, Record
from fedtune.rundata import prepare_data

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "configs" / "flowertune"
FIXTURES = ROOT / "tests" / "fixtures" / "flowertune"

# recipe -> (hub id, the local copy, clients, fraction fit), as FlowerTune's template sets them
DOMAINS: dict[str, tuple[str, str, int, float]] = {
    "general-nlp": ("vicgalle/alpaca-gpt4", "alpaca-gpt4.jsonl", 20, 0.1),
    "finance": ("FinGPT/fingpt-sentiment-train", "fingpt-sentiment-train.jsonl", 50, 0.1),
    "medical": (
        "medalpaca/medical_meadow_medical_flashcards",
        "medical-meadow-medical-flashcards.json",
        20,
        0.1,
    ),
    "code": ("flwrlabs/code-alpaca-20k", "code-alpaca-20k.json", 10, 0.2),
}


def recipe(name: str, *overrides: str) -> ExperimentConfig:
    return load_config(RECIPES / f"{name}.yaml", list(overrides))


def fixture_rows(name: str) -> list[dict[str, Any]]:
    text = (FIXTURES / DOMAINS[name][1]).read_text()
    if DOMAINS[name][1].endswith(".jsonl"):
        return [json.loads(line) for line in text.splitlines()]
    rows: list[dict[str, Any]] = json.loads(text)
    return rows


def local_records(name: str, path: Path | None = None) -> list[Record]:
    """The recipe's training records read from the local copy (2 clients: the fixture has 5 rows)."""
    source = path or FIXTURES / DOMAINS[name][1]
    cfg = recipe(name, f"data.dataset={source}", "data.partition.num_clients=2")
    data = prepare_data(cfg)
    return [*data.eval_records, *(r for records in data.clients.values() for r in records)]


def test_every_domain_has_a_recipe() -> None:
    assert sorted(p.stem for p in RECIPES.glob("*.yaml")) == sorted(DOMAINS)


@pytest.mark.parametrize("name", sorted(DOMAINS))
def test_the_recipe_validates_with_the_leaderboard_settings(name: str) -> None:
    hub_id, _, clients, fraction = DOMAINS[name]
    cfg = recipe(name)
    assert cfg.data.dataset == hub_id
    assert (cfg.data.partition.scheme, cfg.data.partition.num_clients, cfg.fed.fraction) == (
        "iid",
        clients,
        fraction,
    )
    assert (cfg.fed.rounds, cfg.fed.budget_mb) == (200, 200000)
    assert (cfg.model.name, cfg.model.quantization) == ("mistralai/Mistral-7B-v0.3", 4)
    assert (cfg.lora.r, cfg.lora.alpha) == (32, 64)
    assert "FlowerTune" in (RECIPES / f"{name}.yaml").read_text().splitlines()[0]


@pytest.mark.parametrize("name", sorted(DOMAINS))
def test_the_local_copy_loads_offline_with_every_row(name: str) -> None:
    # Prepare
    rows = fixture_rows(name)

    # Execute
    records = local_records(name)

    # Assert: each fixture row became one record, its output kept
    assert sorted(r.output for r in records) == sorted(row["output"] for row in rows)


def test_alpaca_gpt4_keeps_instruction_and_input_and_ignores_its_text_column() -> None:
    records = {r.instruction: r for r in local_records("general-nlp")}
    passive = records["Rewrite the sentence in the passive voice."]
    assert passive.input == "The committee approved the budget."
    assert passive.output == "The budget was approved by the committee."


def test_fingpt_sentiment_has_the_question_as_instruction_and_the_news_as_input() -> None:
    records = local_records("finance")
    assert {r.instruction for r in records} == {fixture_rows("finance")[0]["instruction"]}
    assert "Shares of the retailer rose 8% after quarterly sales beat forecasts." in {
        r.input for r in records
    }


def test_medical_flashcards_have_the_question_as_instruction_as_flowertune_does() -> None:
    records = local_records("medical")
    assert "Which vitamin deficiency causes scurvy?" in {r.instruction for r in records}
    assert all(r.input == "" for r in records)
    assert "Answer this question truthfully" not in {r.instruction for r in records}


def test_code_alpaca_keeps_the_input() -> None:
    records = {r.instruction: r for r in local_records("code")}
    assert records["Reverse the given list in Python."].input == "[1, 2, 3, 4]"


@pytest.mark.parametrize("name", ["general-nlp", "finance"])
def test_the_parquet_files_the_hub_serves_load_as_the_jsonl_copy(name: str, tmp_path: Path) -> None:
    # Prepare: the hub stores these two as Parquet; the fixture's rows written as one
    import pyarrow
    import pyarrow.parquet

    path = tmp_path / "train-00000-of-00001.parquet"
    pyarrow.parquet.write_table(pyarrow.Table.from_pylist(fixture_rows(name)), path)

    # Execute
    from_parquet = local_records(name, path)

    # Assert
    assert from_parquet == local_records(name)


def test_the_hub_id_loads_through_datasets_with_the_recipes_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: the hub answers with the medical fixture's rows
    import datasets

    requested: list[tuple[str, str]] = []

    def from_hub(path: str, split: str) -> datasets.Dataset:
        requested.append((path, split))
        return datasets.Dataset.from_list(fixture_rows("medical"))

    monkeypatch.setattr(datasets, "load_dataset", from_hub)
    cfg = recipe("medical")

    # Execute
    records = load_dataset_records(cfg.data.dataset, "train", columns=cfg.data.columns)

    # Assert
    assert requested == [("medalpaca/medical_meadow_medical_flashcards", "train")]
    assert [r.instruction for r in records] == [row["input"] for row in fixture_rows("medical")]


def test_a_hub_id_that_does_not_load_says_to_use_a_local_copy() -> None:
    # Offline (the tests' HF_HUB_OFFLINE=1) or unknown: either way the hub cannot answer.
    with pytest.raises(DataError, match=r"fedtune-tests/no-such-dataset: cannot load .*local copy"):
        load_dataset_records("fedtune-tests/no-such-dataset", "train")


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("vicgalle/alpaca-gpt4", True),
        ("FinGPT/fingpt-sentiment-train", True),
        ("medalpaca/medical_meadow_medical_flashcards", True),
        ("data/train.jsonl", False),
        ("/data/train", False),
        ("wordnet-instruct", False),
        ("a/b/c", False),
    ],
)
def test_what_reads_as_a_hub_id(spec: str, expected: bool) -> None:
    assert is_hub_id(spec) is expected


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        ("{input: instrution}", r"data\.columns.*'instrution'.*did you mean 'instruction'"),
        ("{a: output, b: output}", r"data\.columns.*two columns renamed to 'output'"),
        ("[input]", r"data\.columns"),
    ],
)
def test_bad_columns_name_the_key(columns: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        recipe("medical", f"data.columns={columns}")
