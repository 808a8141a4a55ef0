"""A run directory's guards: one process at a time, and writes a Ctrl-C must not split."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fedtune.errors import RunError


@contextlib.contextmanager
def deferred_interrupt() -> Iterator[None]:
    """Hold a Ctrl-C (SIGINT) until the block ends, then deliver it.

    A round's checkpoint and its metrics.jsonl row are written together: an interrupt between the two
    left a checkpoint whose row was missing (round 0's: no metrics.jsonl at all) until `fedtune resume`.
    Only the main thread can install a signal handler; elsewhere the block runs as is.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[tuple[int, Any]] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: held.append((signum, frame)))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if held:
        if callable(previous):
            previous(*held[0])
        elif previous != signal.SIG_IGN:
            os.kill(os.getpid(), signal.SIGINT)


class RunDirBusy(RunError):
    """Another process holds the run directory."""


LOCK_FILE = ".lock"


@contextlib.contextmanager
def run_dir_lock(run_dir: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``run_dir`` (one process per run directory); fail at once if taken.

    The kernel drops the lock when its holder dies, so a killed run never blocks the next one; the
    PID in the lock file only says who holds it.
    """
    with open(run_dir / LOCK_FILE, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            raise RunDirBusy(
                f"{run_dir} is in use by process {holder} (a run or resume of it is still going); "
                "wait for it to end or stop it first"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        yield


@contextlib.contextmanager
def waiting_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on the file ``path`` (created if missing), waiting for it while another
    process or thread holds it; as `run_dir_lock`, a holder that dies releases it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
