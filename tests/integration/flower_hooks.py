"""Client hooks for the Flower tests, loaded by a SuperNode's worker from environment variables.

They mirror the in-process backend's ``before_task`` / ``after_task`` test hooks: a node started
with ``FEDTUNE_FLOWER_BEFORE_TASK=tests.integration.flower_hooks:mark_and_stall`` marks every task
it starts in ``FEDTUNE_TEST_DIR`` and hangs in round ``FEDTUNE_TEST_STALL_ROUND`` (so a test can
kill it mid-round); ``...AFTER_TASK=...:poison`` fills its reply with NaN in round
``FEDTUNE_TEST_POISON_ROUND``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from fedtune.fl.payload import Payload


def mark_and_stall(client: str, task: str, rnd: int) -> None:
    (Path(os.environ["FEDTUNE_TEST_DIR"]) / f"{client}.{task}.r{rnd}").touch()
    if str(rnd) == os.environ.get("FEDTUNE_TEST_STALL_ROUND"):
        time.sleep(600)


def poison(client: str, task: str, rnd: int, reply: Payload) -> Payload:
    if str(rnd) != os.environ.get("FEDTUNE_TEST_POISON_ROUND"):
        return reply
    return {k: np.full_like(v, np.nan) if isinstance(v, np.ndarray) else v for k, v in reply.items()}


def poison_in_process(client: str, task: str, rnd: int, reply: Payload) -> Payload:
    """The same tampering in the in-process backend: client c01, round 1."""
    if client != "c01" or rnd != 1:
        return reply
    return {k: np.full_like(v, np.nan) if isinstance(v, np.ndarray) else v for k, v in reply.items()}
