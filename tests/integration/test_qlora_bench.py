"""bench/qlora_memory.py (memory-qlora): one setting's probe and the tables it writes, at tiny size.

The full benchmark starts a process per setting; here the probe runs in-process, its peak-RSS reset
left out (the test process's peak is other tests' to read).
"""

from __future__ import annotations

import argparse
from typing import Any

import pytest
from bench import qlora_memory

pytest.importorskip("bitsandbytes")


def test_a_4bit_checkpointed_probe_measures_and_the_tables_show_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(qlora_memory, "_reset_peak_rss", lambda: False)
    spec: dict[str, Any] = {
        "model": qlora_memory.SMOKE_MODEL,
        **qlora_memory.SETTINGS["4-bit"],
        "checkpointing": True,
        "batch_size": 2,
        "seq_len": 32,
        "warmup": 1,
        "steps": 1,
        "threads": 1,
    }

    # Execute
    result = qlora_memory.probe(spec)

    # Assert
    assert len(result["step_times_s"]) == 2 and result["step_s"] == result["step_times_s"][1] > 0
    assert result["load_peak_rss_mb"] >= result["loaded_rss_mb"] > 0 and result["weights_mb"] > 0
    assert result["anon_rss_after_mb"] > 0 and result["file_rss_after_mb"] > 0
    assert result["first_loss"] > 0 and result["peak_is_training_only"] is False
    quality = {"base": {"perplexity": 268.0}, "final": {"perplexity": 232.0, "rougeL": 0.1}}
    results = {
        "steps_setup": {"batch_size": 2, "seq_len": 32, "warmup": 1, "steps": 1, "threads": 1},
        "steps": {spec["model"]: {"fp32, no checkpointing": result, "4-bit, checkpointing": result}},
        "quality_setup": {"config": "configs/test/fedit-tiny.yaml", "overrides": ["fed.rounds=1"]},
        "quality": {"4-bit": {**quality, "train_loss": [5.5], "client_peak_mem_mb": 600.0, "seconds": 3.0}},
    }
    text = qlora_memory._markdown(results, argparse.Namespace())
    assert "| tiny-llama-L2-H64 | 4-bit, checkpointing |" in text and "1.00x" in text
    assert f"| {result['load_peak_rss_mb']:.0f} | {result['peak_rss_mb']:.0f} | 1.00x |" in text
    assert "| 4-bit | 268.00 | 232.00 | - | 0.100 | 5.500 | 3 |" in text
