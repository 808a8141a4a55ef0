"""vLLM's OpenAI-compatible server started on a free loopback port for a test, from the Python of a
virtual environment with vLLM installed (``$FEDTUNE_VLLM_PYTHON``; vLLM's pins clash with Flower's)."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

PYTHON_ENV = "FEDTUNE_VLLM_PYTHON"
START_TIMEOUT = 900


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def vllm_server(python: str, arguments: list[str], log: Path) -> Iterator[str]:
    """``python -m vllm.entrypoints.openai.api_server ARGUMENTS`` until the block ends; yields its
    ``/v1`` URL once ``/health`` answers (the test fails with the log's tail if it never does)."""
    port = free_port()
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"))
    command = [
        python, "-m", "vllm.entrypoints.openai.api_server", *arguments,
        "--port", str(port), "--host", "127.0.0.1",
    ]  # fmt: skip
    with open(log, "w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if process.poll() is not None:
                pytest.fail(f"vLLM exited with {process.returncode}:\n{log.read_text()[-4000:]}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(2)
        else:
            pytest.fail(f"vLLM did not start in {START_TIMEOUT} s:\n{log.read_text()[-4000:]}")
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        process.terminate()
        process.wait(60)
