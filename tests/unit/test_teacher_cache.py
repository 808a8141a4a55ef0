"""The teacher-output cache computes each batch's frozen outputs once per run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedtune.train.teacher_cache import TeacherCache


@pytest.mark.parametrize("mode", ["memory", "disk"])
def test_outputs_are_computed_once(mode: str, tmp_path: Path) -> None:
    calls: list[int] = []

    def compute() -> torch.Tensor:
        calls.append(1)
        return torch.tensor([[1.5, -2.25]])

    cache = TeacherCache(mode, tmp_path / "t", {"model": "a"}, "fp32")
    first = cache.get(0, compute)
    again = cache.get(0, compute)
    assert torch.equal(first, again) and len(calls) == 1
    if mode == "disk":  # a resumed run: a new cache over the same directory and fingerprint
        assert torch.equal(TeacherCache(mode, tmp_path / "t", {"model": "a"}, "fp32").get(0, compute), first)
        assert len(calls) == 1
        TeacherCache(mode, tmp_path / "t", {"model": "b"}, "fp32").get(0, compute)
        assert len(calls) == 2  # other teacher: the old values are gone


def test_recompute_mode_recomputes_and_fp16_rounds() -> None:
    calls: list[int] = []

    def compute() -> torch.Tensor:
        calls.append(1)
        return torch.tensor([0.1])

    cache = TeacherCache("recompute", Path("unused"), {}, "fp16")
    value = cache.get(0, compute)
    cache.get(0, compute)
    assert len(calls) == 2 and value.dtype == torch.float32
    assert float(value) == pytest.approx(0.1, abs=1e-4) and float(value) != 0.1
