"""The round row's GPU peak counts the GPU the model is on, whichever it is."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from fedtune import runner
from fedtune.algorithms.base import RoundResult
from fedtune.fl.federation import Traffic


def test_the_gpu_peak_counts_every_device_not_only_the_current_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """A model on ``cuda:1`` allocates nothing on the current device (0): the peak must still show it."""
    peaks = {0: 0, 1: 512 * 2**20}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)

    def allocated(device: int | None = None) -> int:
        return peaks[torch.cuda.current_device() if device is None else device]

    monkeypatch.setattr(torch.cuda, "max_memory_allocated", allocated)
    federation = SimpleNamespace(traffic=Traffic())
    row = runner._round_row(1, RoundResult(["c00"], 1.0, 4, 40), federation)  # type: ignore[arg-type]
    assert row["gpu_peak_mb"] == 512.0


def test_no_gpu_peak_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert runner.gpu_peak_mb() is None
