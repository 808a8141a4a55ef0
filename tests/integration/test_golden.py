"""Golden runs: every pinned tiny run still produces its pinned metrics (see tests/golden/cases.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from tests.golden.cases import CASES, METRICS_FILE, run_case

PINNED: dict[str, list[dict[str, Any]]] = json.loads(METRICS_FILE.read_text())
# Other CPUs and library builds pick other kernels: the same code has moved a tiny run's perplexity by
# 1.1e-6 relative between machines. A real change moves a metric by far more than this.
REL_TOL = 1e-5
# Deflated payloads (FedMKT's and FedPT's logits) grow or shrink by a few bytes when the last bits of a
# float move; a change of what travels (a field, a dtype, a shape) moves a tiny run's bytes by more.
BYTES_REL_TOL = 1e-3


def differences(pinned: Any, got: Any, path: str = "") -> list[str]:
    """Where ``got`` departs from ``pinned``: exact for strings, keys and ints but byte counts
    (BYTES_REL_TOL); REL_TOL for floats."""
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
    elif path.rpartition(".")[2].startswith("bytes_") and type(pinned) is int and type(got) is int:
        same = abs(pinned - got) <= BYTES_REL_TOL * abs(pinned)
    else:
        same = pinned == got and type(pinned) is type(got)
    return [] if same else [f"{path}: pinned {pinned!r}, got {got!r}"]


def test_every_case_is_pinned() -> None:
    assert sorted(PINNED) == sorted(CASES), "run `python -m tests.golden.regenerate` for new cases"


def test_differences_sees_a_moved_number() -> None:
    pinned = [{"round": 1, "eval": {"rougeL": 0.25}, "bytes_up": 100}]
    assert differences(pinned, json.loads(json.dumps(pinned))) == []
    assert differences(pinned, [{"round": 1, "eval": {"rougeL": 0.2501}, "bytes_up": 100}])
    assert differences(pinned, [{"round": 1, "eval": {"rougeL": 0.25}, "bytes_up": 101}])
    assert differences(pinned, [{"round": 1, "eval": {"rougeL": 0.25}}])
    assert differences(pinned, [{"round": 2, "eval": {"rougeL": 0.25}, "bytes_up": 100}])


def test_differences_forgives_only_kernel_noise() -> None:
    pinned = [{"round": 1, "eval": {"perplexity": 251.73996596507868}, "bytes_up": 15771}]
    noise = [{"round": 1, "eval": {"perplexity": 251.74023671391436}, "bytes_up": 15772}]
    assert differences(pinned, noise) == []
    assert differences(pinned, [{"round": 1, "eval": {"perplexity": 251.75}, "bytes_up": 15771}])
    assert differences(pinned, [{"round": 1, "eval": {"perplexity": 251.74}, "bytes_up": 15790}])


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden_run_matches_its_pinned_metrics(case: str, tmp_path: Path) -> None:
    rows = json.loads(json.dumps(run_case(case, tmp_path / case)))
    moved = differences(PINNED[case], rows)
    assert not moved, (
        f"golden case {case!r} moved (regenerate with `python -m tests.golden.regenerate {case}` "
        "only if the change had to move it):\n" + "\n".join(moved[:20])
    )
