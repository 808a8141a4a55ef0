"""The code task: the stdlib-code dataset, HumanEval records, the sandbox and pass_at_1."""

from __future__ import annotations

import ast
import importlib.util
import json
import platform
import sys
import time
from collections import Counter
from functools import cache
from pathlib import Path
from types import ModuleType

import pytest

from fedtune.config import EvalConfig
from fedtune.data.builtin import builtin_info, load_builtin
from fedtune.data.code import humaneval_problems, humaneval_records
from fedtune.data.loaders import load_dataset_records
from fedtune.data.records import DataError, Record
from fedtune.eval.code_exec import (
    SandboxLimits,
    extract_code,
    humaneval_results,
    run_programs,
)
from fedtune.eval.evaluate import evaluate_generations
from fedtune.eval.scoring import score_generations

REPO_ROOT = Path(__file__).resolve().parents[2]
NAME = "stdlib-code"
SPLITS = ("train", "validation", "test", "public")
# Plain ones, and ones whose entry point calls a helper from the prompt (10, 38) or whose
# docstring is not the first statement (115).
TASKS = ("HumanEval/0", "HumanEval/10", "HumanEval/38", "HumanEval/115")
SHORT = SandboxLimits(timeout_s=1.0)


@cache
def records(split: str) -> tuple[Record, ...]:
    return tuple(load_builtin(NAME, split))


@cache
def references() -> dict[str, str]:
    return {record.id: record.output for record in humaneval_records()}


@pytest.fixture
def generator(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """scripts/make_code_dataset.py as a module (it is a script, not part of the package)."""
    monkeypatch.syspath_prepend(REPO_ROOT / "scripts")  # where it finds its datagen package
    path = REPO_ROOT / "scripts" / "make_code_dataset.py"
    spec = importlib.util.spec_from_file_location("make_code_dataset", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


def stub_of(instruction: str) -> ast.FunctionDef:
    """The function stub an instruction shows (the last top-level function in it)."""
    code = instruction.split("\n\n", 1)[1]
    functions = [node for node in ast.parse(code).body if isinstance(node, ast.FunctionDef)]
    return functions[-1]


def same_python_as_meta() -> bool:
    meta = json.loads((builtin_info(NAME).path / "meta.json").read_text())
    return bool(meta["python_version"] == platform.python_version())


# --------------------------------------------------------------------------- stdlib-code


def test_stdlib_code_splits_and_categories_match_meta() -> None:
    info = builtin_info(NAME)
    meta = json.loads((info.path / "meta.json").read_text())

    assert tuple(info.splits) == SPLITS and info.task == "code" and len(info.categories) == 9
    assert info.splits["train"] >= 1500
    for split in SPLITS:
        assert len(records(split)) == info.splits[split]
        assert dict(Counter(row.category for row in records(split))) == {
            category: count for category, count in meta["category_counts"][split].items() if count
        }
    assert "PSF" in (info.path / "NOTICE").read_text()


def test_outputs_are_whole_functions_without_their_docstring() -> None:
    for split in SPLITS:
        for row in records(split):
            function = ast.parse(row.output).body[0]
            stub = stub_of(row.instruction)
            docstring = ast.get_docstring(stub)

            assert isinstance(function, ast.FunctionDef) and function.name == stub.name, row.id
            assert ast.get_docstring(function) is None, row.id
            assert docstring is not None and docstring not in row.output, row.id
            assert row.instruction.startswith("Write a Python "), row.id


def test_stdlib_code_splits_share_no_ids_and_no_tasks() -> None:
    seen_ids: set[str] = set()
    seen_tasks: set[str] = set()

    for split in SPLITS:
        ids = {row.id for row in records(split)}
        tasks = {row.instruction for row in records(split)}
        assert len(ids) == len(tasks) == len(records(split))
        assert not ids & seen_ids and not tasks & seen_tasks, split
        seen_ids |= ids
        seen_tasks |= tasks


@pytest.mark.skipif(not same_python_as_meta(), reason="the shipped data came from another Python version")
def test_generator_rebuilds_the_shipped_rows_of_a_module(generator: ModuleType) -> None:
    stdlib = Path(generator.sysconfig.get_paths()["stdlib"])
    shipped = {row.id.split("-", 3)[3]: (split, row) for split in SPLITS for row in records(split)}

    rows = generator.module_rows("textwrap", stdlib / "textwrap.py")

    assert len(rows) >= 3
    for row in rows:
        split, record = shipped[row["id"]]
        assert generator.split_of(row["id"]) == split
        assert (row["instruction"], row["output"], row["category"]) == (
            record.instruction,
            record.output,
            "text",
        )


def test_generator_is_deterministic(generator: ModuleType, tmp_path: Path) -> None:
    # Prepare: a tiny stand-in standard library with a function, a method and filtered-out code.
    stdlib = tmp_path / "lib"
    (stdlib / "json").mkdir(parents=True)
    (stdlib / "test").mkdir()
    function = (
        'def {name}(a, b):\n    """Add the two numbers a and b together."""\n    c = a + b\n    return c\n'
    )
    (stdlib / "textwrap.py").write_text(function.format(name="add") + function.format(name="_hidden"))
    (stdlib / "json" / "__init__.py").write_text(
        'class Box:\n    def get(self, key):\n        """Return the value stored under the key."""\n'
        "        value = self.data[key]\n        return value\n"
    )
    (stdlib / "test" / "test_x.py").write_text(function.format(name="test_add"))

    # Execute
    for out in ("first", "second"):
        generator.main(["--out", str(tmp_path / out), "--stdlib", str(stdlib)])

    # Assert
    first, second = (tmp_path / out / NAME for out in ("first", "second"))
    for name in ("meta.json", "NOTICE", *(f"{split}.jsonl.gz" for split in SPLITS)):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    meta = json.loads((first / "meta.json").read_text())
    assert sum(meta["splits"].values()) == 2 and meta["categories"] == ["data_formats", "text"]
    assert meta["python_version"] == platform.python_version()


@pytest.mark.skipif(not same_python_as_meta(), reason="the shipped data came from another Python version")
@pytest.mark.slow
def test_stdlib_code_generation_is_byte_identical(generator: ModuleType, tmp_path: Path) -> None:
    generator.main(["--out", str(tmp_path)])

    shipped = builtin_info(NAME).path
    for path in sorted(shipped.iterdir()):
        assert (tmp_path / NAME / path.name).read_bytes() == path.read_bytes(), path.name


# --------------------------------------------------------------------------- HumanEval records


def test_humaneval_loads_like_a_builtin_and_reads_like_stdlib_code() -> None:
    loaded = load_dataset_records("humaneval", "test")
    problems = humaneval_problems()

    assert len(loaded) == len(problems) == 164
    assert [record.id for record in loaded] == list(problems)
    assert {record.category for record in loaded} == {"humaneval"}
    for record in loaded:
        entry_point = problems[record.id].entry_point
        assert record.instruction.startswith(f"Write a Python function `{entry_point}` that matches")
        assert stub_of(record.instruction).name == entry_point
        function = ast.parse(record.output).body[0]
        assert isinstance(function, ast.FunctionDef) and function.name == entry_point
        assert ast.get_docstring(function) is None
    with pytest.raises(DataError, match="no split 'train'"):
        load_dataset_records("humaneval", "train")


# --------------------------------------------------------------------------- sandbox


def test_canonical_solutions_pass_and_empty_or_wrong_ones_fail() -> None:
    wrong = "def {0}(*args):\n    return None\n"
    predictions = [references()[task] for task in TASKS]
    predictions += ["    pass\n"] * len(TASKS)
    predictions += [wrong.format(humaneval_problems()[task].entry_point) for task in TASKS]

    results = humaneval_results(predictions, list(TASKS) * 3)

    statuses = [result.status for result in results]
    assert statuses == ["passed"] * len(TASKS) + ["failed"] * 2 * len(TASKS)
    assert "AssertionError" in results[-1].stderr_tail


def test_endless_programs_are_stopped_at_the_timeout() -> None:
    programs = ["while True:\n    pass\n", "import time\ntime.sleep(60)\n"]

    started = time.monotonic()
    results = run_programs(programs, SHORT)

    assert [result.status for result in results] == ["timeout", "timeout"]
    assert time.monotonic() - started < 3 * SHORT.timeout_s


def test_big_files_and_big_allocations_fail_and_leave_nothing_behind() -> None:
    report_cwd = "import os, sys\nprint('cwd', os.getcwd(), file=sys.stderr, flush=True)\n"
    programs = [
        report_cwd + "open('big', 'wb').write(b'0' * (64 << 20))\n",
        report_cwd + "data = bytearray(4 << 30)\n",
        report_cwd + "print('x' * (1 << 20))\nprint('ok', file=sys.stderr)\n",
    ]

    results = run_programs(programs, SHORT)

    assert [result.status for result in results] == ["failed", "failed", "passed"]
    assert "MemoryError" in results[1].stderr_tail
    for result in results:
        workdir = Path(result.stderr_tail.split("cwd ", 1)[1].split("\n", 1)[0])
        assert workdir.name.startswith("fedtune-exec-") and not workdir.exists()


def test_code_is_extracted_from_markdown_fences() -> None:
    reply = "Sure:\n```python\ndef f(x):\n    return x\n```\nIt returns x.\n```\nf(1)\n```"

    assert extract_code(reply) == "def f(x):\n    return x\n"
    assert extract_code("```\nf(1)\n```\n```py\ndef f(x):\n    pass\n```", "f") == "def f(x):\n    pass\n"
    assert extract_code("    return x\n") == "    return x\n"


# --------------------------------------------------------------------------- pass_at_1


def test_pass_at_1_through_score_generations() -> None:
    tasks = list(TASKS[:3])
    fenced = [f"Here it is:\n```python\n{references()[task]}```\nDone." for task in tasks]
    fenced[1] = f"Here it is:\n{references()[tasks[1]]}\nIt checks every suffix."  # prose, no fence

    def score(predictions: list[str]) -> dict[str, object]:
        n = len(predictions)
        return score_generations(
            ["p"] * n, predictions, ["r"] * n, ["humaneval"] * n, ["pass_at_1"], record_ids=tasks
        )

    passing = score(fenced)
    assert passing["pass_at_1"] == 1.0
    assert passing["by_category"] == {"pass_at_1": {"humaneval": 1.0}}
    assert score(["    pass\n"] * 3)["pass_at_1"] == 0.0


def test_pass_at_1_refuses_records_without_tests() -> None:
    with pytest.raises(ValueError, match=r"'pass_at_1': record 'code-test-00001' .* no HumanEval test"):
        score_generations(["p"], ["x"], ["r"], ["c"], ["pass_at_1"], record_ids=["code-test-00001"])
    with pytest.raises(ValueError, match="needs the records' ids"):
        score_generations(["p"], ["x"], ["r"], ["c"], ["pass_at_1"])


def test_evaluate_generations_scores_pass_at_1_by_record_id() -> None:
    loaded = [record for record in humaneval_records() if record.id in TASKS[:2]]
    settings = EvalConfig(metrics=["pass_at_1", "rougeL"])

    def generate(prompts: object, seed: int) -> list[str]:
        return [record.output for record in loaded]

    result = evaluate_generations(generate, None, loaded, settings, template="alpaca", seed=0)  # type: ignore[arg-type]

    assert result.metrics == {"pass_at_1": 1.0, "rougeL": 1.0}
