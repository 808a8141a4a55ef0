"""The sandbox's verdicts: a pass means the tests ran to their end; nothing the program starts survives it."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from fedtune.data.code import humaneval_problems
from fedtune.eval import code_exec
from fedtune.eval.code_exec import SandboxLimits, pass_at_1, run_programs, sandbox_isolation

WRONG = "def has_close_elements(numbers, threshold):\n    return False\n"
ESCAPES = {
    "sys.exit(0)": "import sys\nsys.exit(0)\n",
    "exit()": "exit()\n",
    "quit()": "quit()\n",
    "os._exit(0)": "import os\nos._exit(0)\n",
    "atexit hook": "import atexit, os\natexit.register(lambda: os._exit(0))\n",
    "raise SystemExit": "raise SystemExit(0)\n",
    "KeyboardInterrupt": "raise KeyboardInterrupt\n",
    "unittest.main block": (
        "import unittest\n"
        "class T(unittest.TestCase):\n"
        "    def test_nothing(self):\n"
        "        pass\n"
        "if __name__ == '__main__':\n"
        "    unittest.main()\n"
    ),
}
SHORT = SandboxLimits(timeout_s=2.0)


@pytest.mark.parametrize("escape", sorted(ESCAPES))
def test_a_wrong_solution_that_ends_the_process_early_fails(escape: str) -> None:
    assert pass_at_1([WRONG + ESCAPES[escape]], ["HumanEval/0"]) == [0.0]


def test_exiting_inside_the_solution_of_a_right_answer_fails_too() -> None:
    right = (
        humaneval_problems()["HumanEval/0"].prompt + humaneval_problems()["HumanEval/0"].canonical_solution
    )
    assert pass_at_1([right, right + "\nimport sys\nsys.exit(0)\n"], ["HumanEval/0"] * 2) == [1.0, 0.0]


def test_printing_a_token_like_line_does_not_pass() -> None:
    results = run_programs(["print('0' * 32)\nraise SystemExit(0)\n", "print('0' * 32)\n"], SHORT)
    assert [result.status for result in results] == ["failed", "passed"]


def test_the_program_is_not_run_as_main() -> None:
    results = run_programs(["assert __name__ != '__main__', __name__\n"], SHORT)
    assert results[0].passed, results[0].stderr_tail


@pytest.mark.parametrize("namespaces", [True, False], ids=["namespaces", "marker-sweep"])
def test_children_that_leave_the_session_die_with_the_program(
    namespaces: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if namespaces and not code_exec.sandbox_isolation():
        pytest.skip("no PID namespace here (unshare unavailable)")
    if not namespaces:
        monkeypatch.setattr(code_exec, "sandbox_isolation", lambda: ())
    pid_file = tmp_path / "pid"
    marker = tmp_path / "alive"
    child = f"import time, pathlib\ntime.sleep(1.5)\npathlib.Path({str(marker)!r}).write_text('escaped')\n"
    program = (
        "import subprocess, sys, pathlib\n"
        f"child = subprocess.Popen([sys.executable, '-c', {child!r}], start_new_session=True)\n"
        f"pathlib.Path({str(pid_file)!r}).write_text(str(child.pid))\n"
    )

    results = run_programs([program], SHORT)
    time.sleep(2.5)

    assert results[0].passed, results[0].stderr_tail
    assert pid_file.is_file()
    assert not marker.exists(), "a child in a new session outlived the sandboxed program"


@pytest.mark.skipif(not sandbox_isolation(), reason="no network namespace here (unshare unavailable)")
def test_the_program_cannot_reach_the_network() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        program = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1).close()\n"

        results = run_programs([program], SHORT)

    assert results[0].status == "failed"
    assert "Error" in results[0].stderr_tail
