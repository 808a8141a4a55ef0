"""The shipped datasets: sizes, categories, split hygiene, solution arithmetic, reproducibility."""

from __future__ import annotations

import ast
import importlib.util
import operator
import os
import random
import re
import sys
from collections import Counter
from collections.abc import Callable
from fractions import Fraction
from functools import cache
from pathlib import Path
from types import ModuleType

import pytest

from fedtune.data.builtin import builtin_info, list_builtin, load_builtin
from fedtune.data.records import DataError, Record

REPO_ROOT = Path(__file__).resolve().parents[2]
# WORDNET_DIR points the WordNet regeneration test at WordNet files outside the Debian location.
WORDNET_DIR = Path(os.environ.get("WORDNET_DIR", "/usr/share/wordnet"))
WORDNET_SETS = (
    "wordnet-instruct",
    "wordnet-lexclass",
    "wordnet-wic",
    "wordnet-defchoice",
    "wordnet-hypernym-yn",
)
DATASETS = (
    "wordnet-instruct",
    "arith-word-problems",
    "wordnet-lexclass",
    "wordnet-wic",
    "wordnet-defchoice",
    "wordnet-hypernym-yn",
    "arith-choice",
)
SPLITS = ("train", "validation", "test", "public")
ANNOTATION = re.compile(r"<<([^=<>]+)=(\d+)>>(\d+)")
OPERATORS: dict[type[ast.operator], Callable[[Fraction, Fraction], Fraction]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


@cache
def records(name: str, split: str) -> tuple[Record, ...]:
    return tuple(load_builtin(name, split))


def exact_value(expression: str) -> Fraction:
    def walk(node: ast.expr) -> Fraction:
        if isinstance(node, ast.BinOp):
            return OPERATORS[type(node.op)](walk(node.left), walk(node.right))
        assert isinstance(node, ast.Constant) and isinstance(node.value, int), expression
        return Fraction(node.value)

    return walk(ast.parse(expression, mode="eval").body)


@pytest.fixture
def generator(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """scripts/make_datasets.py as a module (it is a script, not part of the package)."""
    monkeypatch.syspath_prepend(REPO_ROOT / "scripts")  # where it finds its datagen package
    spec = importlib.util.spec_from_file_location("make_datasets", REPO_ROOT / "scripts" / "make_datasets.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


def assert_same_files(generated: Path, shipped: Path) -> None:
    names = sorted(path.name for path in shipped.iterdir())
    assert sorted(path.name for path in generated.iterdir()) == names
    for name in names:
        assert (generated / name).read_bytes() == (shipped / name).read_bytes(), name


def test_list_builtin_describes_every_shipped_dataset() -> None:
    infos = {info.name: info for info in list_builtin()}

    assert set(DATASETS) <= set(infos)
    assert infos["wordnet-instruct"].task == "generation"
    assert infos["arith-word-problems"].task == "math"
    assert infos["wordnet-lexclass"].task == "classification"
    assert {infos[name].task for name in DATASETS[3:]} == {"multiple_choice"}
    for info in infos.values():
        assert tuple(info.splits) == SPLITS
        assert (info.path / "NOTICE").is_file() and info.licence


@pytest.mark.parametrize("name", DATASETS)
def test_split_sizes_and_categories_match_meta(name: str) -> None:
    info = builtin_info(name)

    for split, count in info.splits.items():
        rows = records(name, split)
        assert len(rows) == count
        assert {row.category for row in rows} <= set(info.categories)
        assert all(row.instruction and row.output and row.id for row in rows)


def test_wordnet_instruct_is_large_varied_and_balanced() -> None:
    train = records("wordnet-instruct", "train")
    per_category = Counter(row.category for row in train)

    assert len(train) >= 10_000
    assert len(per_category) >= 8
    assert min(per_category.values()) >= len(train) / len(per_category) / 2


@pytest.mark.parametrize("name", DATASETS)
def test_splits_share_no_ids_and_no_questions(name: str) -> None:
    seen_ids: set[str] = set()
    seen_questions: set[tuple[str, str]] = set()

    for split in SPLITS:
        ids = {row.id for row in records(name, split)}
        questions = {(row.instruction, row.input) for row in records(name, split)}
        assert not ids & seen_ids, split
        assert not questions & seen_questions, split
        seen_ids |= ids
        seen_questions |= questions


@pytest.mark.parametrize("split", SPLITS)
def test_math_solutions_check_out_and_end_in_the_answer(split: str) -> None:
    sample = random.Random(0).sample(records("arith-word-problems", split), 100)

    for row in sample:
        *steps, final = row.output.splitlines()
        answer = int(final.removeprefix("#### "))
        assert final == f"#### {answer}"
        annotations = [ANNOTATION.search(step) for step in steps]
        assert 1 <= len(annotations) <= 4 and all(annotations), row.output
        for match in annotations:
            assert match is not None
            assert exact_value(match.group(1)) == int(match.group(2)) == int(match.group(3)), row.output
        assert annotations[-1] is not None and int(annotations[-1].group(2)) == answer


def test_lexclass_output_is_the_label() -> None:
    info = builtin_info("wordnet-lexclass")

    for split in SPLITS:
        assert all(row.output == row.category for row in records("wordnet-lexclass", split))
    test_counts = Counter(row.category for row in records("wordnet-lexclass", "test"))
    assert set(test_counts) == set(info.categories)
    assert len(set(test_counts.values())) == 1  # evaluation splits are class-balanced


def test_unknown_dataset_suggests_the_closest_name() -> None:
    with pytest.raises(DataError, match="did you mean 'wordnet-instruct'"):
        builtin_info("wordnet-instrct")


def test_unknown_split_names_the_valid_ones() -> None:
    with pytest.raises(DataError, match=r"no split 'dev' \(valid: train, validation, test, public\)"):
        load_builtin("arith-word-problems", "dev")


@pytest.mark.parametrize("name", ["arith-word-problems", "arith-choice"])
def test_math_generation_is_byte_identical(generator: ModuleType, tmp_path: Path, name: str) -> None:
    generator.main(["--out", str(tmp_path), "--only", name])

    assert_same_files(tmp_path / name, builtin_info(name).path)


@pytest.mark.skipif(
    not WORDNET_DIR.is_dir(), reason="WordNet 3.0 not installed (apt-get install wordnet-base)"
)
@pytest.mark.slow
def test_wordnet_generation_is_byte_identical(generator: ModuleType, tmp_path: Path) -> None:
    generator.main(["--out", str(tmp_path), "--only", *WORDNET_SETS, "--wordnet-dir", str(WORDNET_DIR)])

    for name in WORDNET_SETS:
        assert_same_files(tmp_path / name, builtin_info(name).path)


def test_generator_says_how_to_install_missing_wordnet(generator: ModuleType, tmp_path: Path) -> None:
    arguments = [
        "--out",
        str(tmp_path),
        "--only",
        "wordnet-lexclass",
        "--wordnet-dir",
        str(tmp_path / "none"),
    ]

    with pytest.raises(SystemExit, match="apt-get install wordnet-base"):
        generator.main(arguments)
