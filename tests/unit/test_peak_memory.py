"""peak_rss_mb is this process's own peak, not its parent's (ru_maxrss survives fork and exec)."""

from __future__ import annotations

import subprocess
import sys

from fedtune.train.loop import peak_rss_mb


def test_a_child_process_reports_its_own_peak_not_its_parents() -> None:
    held = bytearray(1024 * 2**20)
    for offset in range(0, len(held), 4096):  # touch every page: it must be resident
        held[offset] = 1
    assert peak_rss_mb() > 1024
    code = "from fedtune.train.loop import peak_rss_mb; print(peak_rss_mb())"
    child = float(
        subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    )
    del held
    # the child imports torch (a few hundred MB) and never held the parent's gigabyte
    assert 0 < child < 900
