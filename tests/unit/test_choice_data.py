"""Multiple-choice records: the schema, loading them from files, and the shipped multiple-choice sets."""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from fedtune.data.builtin import builtin_info, load_builtin
from fedtune.data.fingerprint import file_sha256, partition_sha256
from fedtune.data.loaders import load_records
from fedtune.data.records import NO_LABEL, DataError, Record

SPLITS = ("train", "validation", "test", "public")
CHOICE_SETS = ("wordnet-wic", "wordnet-defchoice", "wordnet-hypernym-yn", "arith-choice")
YES_NO = ("no", "yes")
POS = ["adjective", "adverb", "noun", "verb"]
# sha256 over each set's files (``file_sha256`` of its directory); test_builtin_data.py regenerates
# them byte for byte (the WordNet ones where the WordNet files are installed).
SHIPPED_SHA256 = {
    "wordnet-wic": "3be9bbd4a7e7c52a8e8bc4ea647aecb79bf3ce9eecc5639ec2ca25a0f2671275",
    "wordnet-defchoice": "52b27332e6993d07642fc1545a3e17f9bbfdeec4033b587625f7d0eef70e7529",
    "wordnet-hypernym-yn": "d44f9d22912dfab4dc749aeed24f5a21ac9df6be8576c7d178c74669155a573a",
    "arith-choice": "f6f7dc7674519adce071887407f2eefbace315bd6c6ce728c49d61c6d95eb15b",
}


@cache
def records(name: str, split: str) -> tuple[Record, ...]:
    return tuple(load_builtin(name, split))


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


# --------------------------------------------------------------------------- schema


def test_a_record_round_trips_through_its_dict() -> None:
    # Prepare
    record = Record("Pick.", "yes", "context", "wic", "7", ("no", "yes"), 1)

    # Execute
    fields = record.to_dict()

    # Assert
    assert fields["choices"] == ["no", "yes"] and fields["label"] == 1
    assert Record.from_dict(json.loads(json.dumps(fields))) == record


def test_a_record_without_choices_keeps_its_old_dict_and_partition_hash() -> None:
    # Prepare: the hash as runs pinned it before records had choice fields
    record = Record("Define 'cat'.", "a small feline", "", "definition", "wni-1")
    old_fields = {
        "instruction": "Define 'cat'.",
        "output": "a small feline",
        "input": "",
        "category": "definition",
    }
    old_fields["id"] = "wni-1"
    old_hash = hashlib.sha256(b"c0" + json.dumps(old_fields, sort_keys=True).encode()).hexdigest()

    # Execute / Assert
    assert record.to_dict() == old_fields
    assert Record.from_dict(old_fields) == record
    assert not record.is_multiple_choice and record.label == NO_LABEL
    assert partition_sha256({"c0": [record]}) == old_hash


@pytest.mark.parametrize(
    ("choices", "label", "message"),
    [
        (("yes",), 0, "two or more distinct"),
        (("yes", "yes"), 0, "two or more distinct"),
        (("no", "yes"), 2, "label 2 is not an index"),
        ((), 0, "label 0 without choices"),
    ],
)
def test_a_record_refuses_inconsistent_choices(choices: tuple[str, ...], label: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Record("Q?", "yes", choices=choices, label=label)


# --------------------------------------------------------------------------- loading


def test_jsonl_choice_rows_load_with_an_index_a_text_or_only_an_output(tmp_path: Path) -> None:
    # Prepare
    rows = [
        {"instruction": "Same sense?", "choices": ["no", "yes"], "label": 1, "category": "wic"},
        {"instruction": "2+2?", "output": "4", "choices": ["3", "4", "5"], "label": "4"},
        {"instruction": "Capital of France?", "output": "Paris", "choices": ["Rome", "Paris"]},
        {"instruction": "Plain row.", "output": "ok", "label": 3},
    ]
    path = write_jsonl(tmp_path / "mc.jsonl", rows)

    # Execute
    loaded = load_records(path)

    # Assert: without choices a label field is ignored, as before
    assert loaded == [
        Record("Same sense?", "yes", "", "wic", "0", ("no", "yes"), 1),
        Record("2+2?", "4", "", "general", "1", ("3", "4", "5"), 1),
        Record("Capital of France?", "Paris", "", "general", "2", ("Rome", "Paris"), 1),
        Record("Plain row.", "ok", "", "general", "3"),
    ]


def test_parquet_and_dolly_choice_rows(tmp_path: Path) -> None:
    import pyarrow
    import pyarrow.parquet

    # Prepare: a Dolly row may leave its response out too
    rows = [
        {"instruction": "Q?", "context": "c", "response": "b", "choices": ["a", "b"], "label": 1},
        {"instruction": "R?", "context": "d", "response": None, "choices": ["a", "b"], "label": 0},
    ]
    path = tmp_path / "mc.parquet"
    pyarrow.parquet.write_table(pyarrow.Table.from_pylist(rows), path)
    without_response = write_jsonl(
        tmp_path / "dolly.jsonl", [{k: v for k, v in rows[1].items() if v is not None}]
    )

    # Execute / Assert
    assert load_records(path) == [
        Record("Q?", "b", "c", "general", "0", ("a", "b"), 1),
        Record("R?", "a", "d", "general", "1", ("a", "b"), 0),
    ]
    assert load_records(without_response) == [Record("R?", "a", "d", "general", "0", ("a", "b"), 0)]


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"choices": "no, yes", "label": 0}, "field 'choices' must be a list of strings, got 'no, yes'"),
        ({"choices": ["no", 1], "label": 0}, r"field 'choices' must be a list of strings, got \['no', 1\]"),
        ({"choices": {"a": 1}, "label": 0}, "field 'choices' must be a list of strings, got dict"),
        ({"choices": ["yes"], "label": 0}, "field 'choices' needs at least 2 choices, got 1"),
        ({"choices": ["no", " "], "label": 0}, "field 'choices' has an empty choice"),
        ({"choices": ["no", "yes", "no"], "label": 0}, "field 'choices' has 'no' twice"),
        ({"choices": ["no", "yes"], "label": 2}, "field 'label' 2 is out of range for 2 choices"),
        ({"choices": ["no", "yes"], "label": -1}, "field 'label' -1 is out of range for 2 choices"),
        (
            {"choices": ["no", "yes"], "label": True},
            "field 'label' must be an index or a choice's text, got bool",
        ),
        (
            {"choices": ["no", "yes"], "label": 1.0},
            "field 'label' must be an index or a choice's text, got float",
        ),
        (
            {"choices": ["no", "yes"], "label": "maybe"},
            r"field 'label' 'maybe' is not one of the choices \['no', 'yes'\]",
        ),
        ({"choices": ["no", "yes"]}, "missing field 'label'"),
        ({"choices": ["no", "yes"], "output": "maybe"}, "missing field 'label'"),
        (
            {"choices": ["no", "yes"], "label": 0, "output": "yes"},
            "field 'output' is 'yes', but the labelled choice is 'no'",
        ),
        ({"choices": ["no", "yes"], "label": 0, "output": 3}, "field 'output' must be a string, got int"),
    ],
)
def test_bad_choice_rows_name_file_line_and_field(tmp_path: Path, row: dict[str, Any], message: str) -> None:
    path = write_jsonl(
        tmp_path / "bad.jsonl", [{"instruction": "ok", "output": "fine"}, {"instruction": "Q?", **row}]
    )

    with pytest.raises(DataError, match=message) as caught:
        load_records(path)
    assert str(caught.value).startswith(f"{path} line 2: ")


# --------------------------------------------------------------------------- shipped sets


@pytest.mark.parametrize("name", CHOICE_SETS)
def test_shipped_files_are_the_pinned_generated_ones(name: str) -> None:
    assert file_sha256(builtin_info(name).path) == SHIPPED_SHA256[name], (
        f"{name} changed: regenerate it with scripts/make_datasets.py --only {name}, then update the pin"
    )


@pytest.mark.parametrize("name", CHOICE_SETS)
def test_every_row_is_a_consistent_multiple_choice_record(name: str) -> None:
    info = builtin_info(name)
    num_choices = json.loads((info.path / "meta.json").read_text())["num_choices"]

    assert info.task == "multiple_choice"
    for split in SPLITS:
        for row in records(name, split):
            assert len(row.choices) == num_choices and row.output == row.choices[row.label]
            # No choice starts another: it would win the summed log-likelihood for free.
            assert not any(a != b and b.startswith(a) for a in row.choices for b in row.choices), row


@pytest.mark.parametrize("name", ["wordnet-wic", "wordnet-hypernym-yn"])
def test_yes_no_sets_are_balanced_in_every_split_and_category(name: str) -> None:
    for split in SPLITS:
        counts = Counter((row.category, row.output) for row in records(name, split))
        assert all(row.choices == YES_NO for row in records(name, split))
        categories = {category for category, _ in counts}
        assert all(counts[category, "yes"] == counts[category, "no"] for category in categories), split


@pytest.mark.parametrize("name", ["wordnet-defchoice", "arith-choice"])
def test_four_way_sets_put_the_answer_in_every_position_equally(name: str) -> None:
    for split in SPLITS:
        positions = Counter(row.label for row in records(name, split))
        assert sorted(positions) == [0, 1, 2, 3]
        assert max(positions.values()) - min(positions.values()) <= 8, split


@pytest.mark.parametrize(
    ("name", "categories"),
    [
        ("wordnet-wic", POS),
        ("wordnet-defchoice", POS),
        ("arith-choice", sorted(set(row.category for row in load_builtin("arith-word-problems", "test")))),
    ],
)
def test_categories_and_sizes(name: str, categories: list[str]) -> None:
    info = builtin_info(name)

    assert list(info.categories) == categories
    assert info.splits["train"] >= 4000
    assert all(500 <= info.splits[split] <= 1000 for split in SPLITS[1:])


def test_hypernym_categories_are_lexicographer_files_of_nouns() -> None:
    info = builtin_info("wordnet-hypernym-yn")

    assert len(info.categories) >= 20 and all(category.startswith("noun.") for category in info.categories)
    assert info.splits == {"train": 5000, "validation": 500, "test": 500, "public": 500}


def test_the_questions_make_sense_as_prompts() -> None:
    wic = records("wordnet-wic", "test")[0]
    hypernym = records("wordnet-hypernym-yn", "test")[0]
    definition = records("wordnet-defchoice", "test")[0]

    assert wic.instruction.endswith("Answer yes or no.") and re.fullmatch(r"1\. .+\n2\. .+", wic.input)
    assert re.fullmatch(r"Is '.+' a kind of .+\? Answer yes or no\.", hypernym.instruction)
    assert hypernym.input.startswith(hypernym.instruction.split(" a kind of ")[1].split("?")[0] + ": ")
    assert re.search(r"the (noun|verb|adjective|adverb) '.+'", definition.instruction)


@pytest.mark.parametrize("split", SPLITS)
def test_arith_choice_asks_the_arith_word_problems_of_the_same_split(split: str) -> None:
    worked = {row.instruction: row for row in records("arith-word-problems", split)}

    for row in records("arith-choice", split):
        question = row.instruction.removesuffix(" Answer with the number only.")
        assert worked[question].output.endswith(f"#### {row.output}")
        assert worked[question].category == row.category
