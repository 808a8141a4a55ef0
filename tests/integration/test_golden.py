"""Golden runs: every pinned tiny run still produces its pinned metrics (see tests/golden/cases.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from tests.golden.cases import CASES, METRICS_FILE, run_case

PINNED: dict[str, list[dict[str, Any]]] = json.loads(METRICS_FILE.read_text())
# Other CPUs may pick other kernels; a real change moves a metric by far more than this.
REL_TOL = 1e-6


def differences(pinned: Any, got: Any, path: str = "") -> list[str]:
    """Where ``got`` departs from ``pinned``: exact for ints, strings and keys; REL_TOL for floats."""
    if isinstance(pinned, dict) and isinstance(got, dict):
        found = (
            [f"{path}: keys {sorted(set(pinned) ^ set(got))} differ"] if pinned.keys() != got.keys() else []
        )
        for key in pinned.keys() & got.keys():
            found += differences(pinned[key], got[key], f"{path}.{key}")
        return found
    if isinstance(pinned, list) and isinstance(got, list) and len(pinned) == len(got):
        return [
            d
            for i, (p, g) in enumerate(zip(pinned, got, strict=True))
            for d in differences(p, g, f"{path}[{i}]")
        ]
    if isinstance(pinned, float) and isinstance(got, float):
        same = math.isclose(pinned, got, rel_tol=REL_TOL, abs_tol=1e-12)
        return [] if same else [f"{path}: pinned {pinned!r}, got {got!r}"]
    return [] if pinned == got and type(pinned) is type(got) else [f"{path}: pinned {pinned!r}, got {got!r}"]


def test_every_case_is_pinned() -> None:
    assert sorted(PINNED) == sorted(CASES), "run `python -m tests.golden.regenerate` for new cases"


def test_differences_sees_a_moved_number() -> None:
    pinned = [{"round": 1, "eval": {"rougeL": 0.25}, "bytes_up": 100}]
    assert differences(pinned, json.loads(json.dumps(pinned))) == []
    assert differences(pinned, [{"round": 1, "eval": {"rougeL": 0.2501}, "bytes_up": 100}])
    assert differences(pinned, [{"round": 1, "eval": {"rougeL": 0.25}, "bytes_up": 101}])
    assert differences(pinned, [{"round": 1, "eval": {"rougeL": 0.25}}])


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden_run_matches_its_pinned_metrics(case: str, tmp_path: Path) -> None:
    rows = json.loads(json.dumps(run_case(case, tmp_path / case)))
    moved = differences(PINNED[case], rows)
    assert not moved, (
        f"golden case {case!r} moved (regenerate with `python -m tests.golden.regenerate {case}` "
        "only if the change had to move it):\n" + "\n".join(moved[:20])
    )
