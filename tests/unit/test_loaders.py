"""Loaders over small fixture files in the real Alpaca and Dolly layouts, and every error path."""

from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from fedtune.data.loaders import load_dataset_records, load_records
from fedtune.data.records import DataError, Record

ALPACA_ROWS = [
    {"instruction": "Give three tips for staying healthy.", "input": "", "output": "Eat well, sleep, move."},
    {
        "instruction": "Translate to French.",
        "input": "Good morning",
        "output": "Bonjour",
        "category": "translate",
    },
]
DOLLY_ROWS = [
    {
        "instruction": "When did Virgin Australia start operating?",
        "context": "Virgin Australia commenced services on 31 August 2000.",
        "response": "On 31 August 2000.",
        "category": "closed_qa",
    },
    {"instruction": "Name a primary colour.", "context": "", "response": "Red.", "category": "open_qa"},
]
# Columnar formats have a value (maybe null) for every column in every row.
ALPACA_COLUMNS = [{**row, "category": row.get("category")} for row in ALPACA_ROWS]
ALPACA_RECORDS = [
    Record("Give three tips for staying healthy.", "Eat well, sleep, move.", "", "general", "0"),
    Record("Translate to French.", "Bonjour", "Good morning", "translate", "1"),
]
DOLLY_RECORDS = [
    Record(
        "When did Virgin Australia start operating?",
        "On 31 August 2000.",
        "Virgin Australia commenced services on 31 August 2000.",
        "closed_qa",
        "0",
    ),
    Record("Name a primary colour.", "Red.", "", "open_qa", "1"),
]


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def write_csv(path: Path, header: list[str], rows: list[list[str]]) -> Path:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def write_parquet(path: Path, rows: list[dict[str, Any]]) -> Path:
    import pyarrow
    import pyarrow.parquet

    pyarrow.parquet.write_table(pyarrow.Table.from_pylist(rows), path)
    return path


def test_jsonl_alpaca_rows_become_records(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "alpaca.jsonl", ALPACA_ROWS)

    assert load_records(path) == ALPACA_RECORDS


def test_gzipped_jsonl_dolly_maps_context_and_response(tmp_path: Path) -> None:
    path = tmp_path / "dolly.jsonl.gz"
    path.write_bytes(gzip.compress("".join(json.dumps(row) + "\n" for row in DOLLY_ROWS).encode()))

    assert load_records(path) == DOLLY_RECORDS


@pytest.mark.parametrize("wrap", [False, True], ids=["list", "data-key"])
def test_json_list_or_data_wrapper(tmp_path: Path, wrap: bool) -> None:
    path = tmp_path / "alpaca.json"
    path.write_text(json.dumps({"data": ALPACA_ROWS} if wrap else ALPACA_ROWS))

    assert load_records(path) == ALPACA_RECORDS


def test_csv_in_the_dolly_layout(tmp_path: Path) -> None:
    header = ["instruction", "context", "response", "category"]
    path = write_csv(tmp_path / "dolly.csv", header, [[row[key] for key in header] for row in DOLLY_ROWS])

    assert load_records(path) == DOLLY_RECORDS


def test_parquet_in_the_alpaca_layout(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "alpaca.parquet", ALPACA_COLUMNS)

    assert load_records(path) == ALPACA_RECORDS


def test_hf_save_to_disk_directory_picks_the_split(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    splits = {
        "train": datasets.Dataset.from_list(DOLLY_ROWS),
        "test": datasets.Dataset.from_list(DOLLY_ROWS[:1]),
    }
    datasets.DatasetDict(splits).save_to_disk(str(tmp_path / "dolly"))

    assert load_records(tmp_path / "dolly", split="test") == DOLLY_RECORDS[:1]
    with pytest.raises(DataError, match="no split 'validation' \\(valid: train, test\\)"):
        load_records(tmp_path / "dolly", split="validation")


def test_hf_dataset_id_goes_to_load_dataset(monkeypatch: pytest.MonkeyPatch) -> None:
    datasets = pytest.importorskip("datasets")
    calls: list[tuple[str, str]] = []

    def fake_load_dataset(path: str, split: str) -> Any:
        calls.append((path, split))
        return datasets.Dataset.from_list(ALPACA_COLUMNS)

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)

    assert load_records("tatsu-lab/alpaca", format="hf", split="train") == ALPACA_RECORDS
    assert calls == [("tatsu-lab/alpaca", "train")]


def test_field_map_renames_before_the_schema_applies(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "qa.jsonl", [{"question": "2+2?", "answer": "4", "topic": "math", "id": 7}])

    records = load_records(
        path, field_map={"question": "instruction", "answer": "output", "topic": "category"}
    )

    assert records == [Record("2+2?", "4", "", "math", "7")]


def test_explicit_schema_overrides_detection(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "alpaca.jsonl", ALPACA_ROWS)

    with pytest.raises(DataError, match="line 1: missing field 'response'"):
        load_records(path, schema="dolly")


def test_load_dataset_records_prefers_builtin_names(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "alpaca.jsonl", ALPACA_ROWS)

    assert load_dataset_records(str(path), "train") == ALPACA_RECORDS
    assert len(load_dataset_records("arith-word-problems", "validation")) == 500
    assert load_dataset_records("wordnet-wic", "test")[0].choices == ("no", "yes")


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (['{"instruction": "a", "output": "b"}', "", '{"instruction": "a"'], "line 3: invalid JSON"),
        (['{"instruction": "a", "output": "b"}', '{"instruction": "a"}'], "line 2: missing field 'output'"),
        (['{"instruction": 5, "output": "b"}'], "line 1: field 'instruction' must be a string, got int"),
        (['{"instruction": "a", "output": "  "}'], "line 1: field 'output' is empty"),
        (['{"instruction": "", "output": "b"}'], "line 1: field 'instruction' is empty"),
        (['{"instruction": "a", "output": "b", "input": null, "category": 3}'], "field 'category' must be a"),
        (
            ['{"instruction": "a", "output": "b", "id": 1.5}'],
            "line 1: field 'id' must be a string or an integer",
        ),
        (['["a", "b"]'], "line 1: expected an object with named fields, got list"),
        (['{"prompt": "a", "completion": "b"}'], "line 1: cannot detect the schema from fields"),
        ([""], "no records found"),
    ],
)
def test_jsonl_errors_name_file_line_and_field(tmp_path: Path, lines: list[str], message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")

    with pytest.raises(DataError, match=message) as caught:
        load_records(path)
    assert str(caught.value).startswith(str(path))


def test_json_errors_name_the_index(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps([ALPACA_ROWS[0], {"instruction": "a"}]))

    with pytest.raises(DataError, match=r"bad\.json index 1: missing field 'output'"):
        load_records(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"data": 3}', 'expected a list of objects or {"data": \\[...\\]}, got dict'),
        ("[1,\n", "line 2: invalid JSON"),
    ],
)
def test_json_file_level_errors(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)

    with pytest.raises(DataError, match=message):
        load_records(path)


def test_csv_errors_name_the_line(tmp_path: Path) -> None:
    short = write_csv(tmp_path / "short.csv", ["instruction", "output"], [["a", "b"], ["c"]])
    long = write_csv(tmp_path / "long.csv", ["instruction", "output"], [["a", "b", "extra"]])

    with pytest.raises(DataError, match=r"short\.csv line 3: missing field 'output'"):
        load_records(short)
    with pytest.raises(DataError, match=r"long\.csv line 2: more values than the header has fields"):
        load_records(long)


def test_parquet_errors_name_the_index(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "bad.parquet", [ALPACA_ROWS[0], {**ALPACA_ROWS[0], "output": None}])
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"not parquet")

    with pytest.raises(DataError, match=r"bad\.parquet index 1: missing field 'output'"):
        load_records(path)
    with pytest.raises(DataError, match="not a readable Parquet file"):
        load_records(broken)


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"nope\.jsonl: file not found"):
        load_records(tmp_path / "nope.jsonl")


@pytest.mark.parametrize(
    ("data_format", "schema", "message"),
    [
        ("xml", "auto", r"unknown format 'xml' \(valid: auto, jsonl, json, csv, parquet, hf\)"),
        ("auto", "sharegpt", r"unknown schema 'sharegpt' \(valid: auto, alpaca, dolly\)"),
    ],
)
def test_unknown_options_list_the_valid_ones(
    tmp_path: Path, data_format: str, schema: str, message: str
) -> None:
    path = write_jsonl(tmp_path / "alpaca.jsonl", ALPACA_ROWS)

    with pytest.raises(DataError, match=message):
        load_records(path, format=data_format, schema=schema)


def test_unknown_extension_asks_for_a_format(tmp_path: Path) -> None:
    path = tmp_path / "data.txt"
    path.write_text(json.dumps(ALPACA_ROWS[0]) + "\n")

    with pytest.raises(DataError, match="cannot tell the format from the extension"):
        load_records(path)
    assert load_records(path, format="jsonl") == ALPACA_RECORDS[:1]


@pytest.mark.parametrize("suffix", ["jsonl", "json", "csv"])
def test_a_file_that_is_not_utf8_names_the_file_and_line(suffix: str, tmp_path: Path) -> None:
    path = tmp_path / f"data.{suffix}"
    good = {
        "jsonl": '{"instruction": "a", "output": "b"}\n{"instruction": "c", "output": "d"}\n',
        "json": '[{"instruction": "a",\n "output": "b"},\n',
        "csv": "instruction,output\na,b\n",
    }[suffix]
    path.write_bytes(good.encode() + b"caf\xe9\n")

    with pytest.raises(DataError, match=rf"data.{suffix} line 3: not UTF-8"):
        load_records(path)


@pytest.mark.parametrize("suffix", ["jsonl", "json"])
def test_json_with_a_byte_order_mark_loads_like_csv(suffix: str, tmp_path: Path) -> None:
    row = '{"instruction": "Name it.", "output": "ok"}'
    text = row + "\n" if suffix == "jsonl" else f"[{row}]"
    path = tmp_path / f"data.{suffix}"
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())

    assert [r.output for r in load_records(path)] == ["ok"]


def test_an_unknown_dataset_name_lists_the_built_in_ones() -> None:
    with pytest.raises(DataError, match=r"did you mean 'wordnet-instruct'.*built-in: .*arith-word-problems"):
        load_dataset_records("wordnet-instrukt", "train")


def test_errors_name_the_config_keys_that_fix_them(tmp_path: Path) -> None:
    unknown = tmp_path / "rows.dat"
    unknown.write_text("{}")
    odd = tmp_path / "rows.jsonl"
    odd.write_text('{"question": "q", "answer": "a"}\n')

    with pytest.raises(DataError, match=r"set data\.format"):
        load_records(unknown)
    with pytest.raises(DataError, match=r"set data\.schema"):
        load_records(odd)
