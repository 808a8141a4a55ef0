"""A short real run: SmolLM2-135M-Instruct from the offline zoo, 2 clients, 1 round, via the CLI."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "configs" / "demo" / "fedit-smollm2.yaml"


def fedtune(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    return subprocess.run(
        [sys.executable, "-m", "fedtune", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )


@pytest.mark.slow
def test_real_smollm2_round_trip(tmp_path: Path) -> None:
    run_dir = tmp_path / "smoke"
    result = fedtune(
        "run",
        str(DEMO),
        "-o",
        str(run_dir),
        "progress=false",
        "fed.rounds=1",
        "train.max_steps=2",
        "data.partition.num_clients=2",
        "data.max_train_examples=64",
        "eval.max_examples=4",
        "eval.max_new_tokens=8",
        "eval.every=1",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [0, 1]
    assert math.isfinite(rows[1]["train_loss"]) and rows[1]["bytes_up"] > 0
    assert 1.0 < rows[1]["eval"]["perplexity"] < 1000.0
    assert (run_dir / "artifacts" / "adapter" / "adapter_config.json").is_file()
    generated = fedtune(
        "generate", str(run_dir), "--prompt", "Give a synonym of 'big'.", "--max-new-tokens", "8"
    )
    assert generated.returncode == 0, generated.stderr[-3000:]
    assert len(generated.stdout.strip()) > len("Give a synonym of 'big'.")
    report = fedtune("report", str(run_dir))
    assert report.returncode == 0, report.stderr[-3000:]
    assert (run_dir / "report.md").is_file()


FEDPT = ROOT / "configs" / "paper" / "fedpt-smollm2.yaml"


@pytest.mark.slow
def test_real_fedpt_round_trip(tmp_path: Path) -> None:
    """FedPT on real weights: SmolLM2 is both the small and the large model (the derived small model
    takes minutes to build, so it is not part of CI); distillation, alpha search and proxy decoding."""
    run_dir = tmp_path / "fedpt"
    result = fedtune(
        "run",
        str(FEDPT),
        "-o",
        str(run_dir),
        "progress=false",
        "model.name=smollm2-135m-instruct",
        "fed.rounds=1",
        "fed.clients_per_round=2",
        "train.max_steps=2",
        "data.partition.num_clients=2",
        "data.max_train_examples=64",
        "eval.max_examples=4",
        "eval.max_new_tokens=8",
        "eval.seeds=2",
        "eval.extra_datasets=[]",
        "fedpt.kd_examples=16",
        "fedpt.kd_batch_size=8",
        "fedpt.kd_steps=2",
        "fedpt.alpha_grid=[1.0,2.0]",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    final = rows[-1]
    assert final["round"] == 1 and math.isfinite(final["kd_kl"]) and final["teacher_seconds"] > 0
    assert final["eval"]["alpha"] in (1.0, 2.0) and 0.0 <= final["eval"]["rougeL"] <= 1.0
    assert "rougeL_std" in final["eval"] and 1.0 < final["eval"]["perplexity"] < 1000.0
    generated = fedtune(
        "generate", str(run_dir), "--prompt", "Give a synonym of 'big'.", "--max-new-tokens", "8"
    )
    assert generated.returncode == 0, generated.stderr[-3000:]
    assert len(generated.stdout.strip()) > len("Give a synonym of 'big'.")


@pytest.mark.slow
def test_real_smollm2_fedbiot_keeps_dropped_layers_on_the_server(tmp_path: Path) -> None:
    """FedBiOT on the real 30-layer SmolLM2: 2 clients, 2 rounds; the traffic never holds a dropped layer."""
    import re

    from fedtune.algorithms.fedbiot import make_split
    from fedtune.config import load_config
    from tests.integration.helpers import quiet_runner

    cfg = load_config(
        ROOT / "configs" / "paper" / "fedbiot-math.yaml",
        [
            "progress=false",
            "fed.rounds=2",
            "train.max_steps=2",
            "data.partition.num_clients=2",
            "data.max_train_examples=40",
            "fedbiot.init_steps=2",
            "fedbiot.align_steps=1",
            "fedbiot.public_examples=16",
            "eval.every=2",
            "eval.max_examples=4",
            "eval.max_new_tokens=8",
        ],
    )
    split = make_split(cfg.fedbiot, 30)
    assert len(split.emulator) == 22 and split.adapter == (28, 29)
    layer = re.compile(r"model\.layers\.(\d+)\.")
    indices: set[int] = set()

    def tap(direction: str, client: str, task: str, rnd: int, payload: dict[str, object]) -> None:
        indices.update(int(m.group(1)) for key in payload if (m := layer.search(key)))

    history = quiet_runner(cfg, tmp_path / "fedbiot", tap=tap).run()
    assert indices == set(split.kept)
    last = history[-1]
    assert math.isfinite(last["train_loss"]) and last["emulator_sends"] == 2
    # The adapter plugged back into the full model beats it inside the 22-of-28-layer emulator.
    assert 1.0 < last["eval"]["adapfu/perplexity"] < last["eval"]["adapemu/perplexity"] < 1000.0
    info = json.loads((tmp_path / "fedbiot" / "artifacts" / "fedbiot.json").read_text())
    assert info["params"]["client_params"] < info["params"]["full_params"]
