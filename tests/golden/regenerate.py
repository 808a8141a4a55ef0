"""Rerun every golden case and rewrite ``tests/golden/metrics.json``; prints which cases moved.

.venv/bin/python -m tests.golden.regenerate [CASE ...]   # (one thread, CPU, as in CI)
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main(names: list[str]) -> None:
    import torch

    from tests.golden.cases import CASES, METRICS_FILE, run_case

    torch.set_num_threads(1)
    pinned = json.loads(METRICS_FILE.read_text()) if METRICS_FILE.is_file() else {}
    for name in names or list(CASES):
        with tempfile.TemporaryDirectory() as tmp:
            rows = json.loads(json.dumps(run_case(name, Path(tmp) / name)))
        verdict = "new" if name not in pinned else ("bit-equal" if pinned[name] == rows else "MOVED")
        print(f"{name}: {verdict}")
        pinned[name] = rows
    METRICS_FILE.write_text(json.dumps(pinned, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
