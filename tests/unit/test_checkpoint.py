from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from fedtune.fl.checkpoint import (
    CheckpointDamaged,
    clean_partial,
    intact_checkpoint,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)


def latest(run_dir: Path) -> Path:
    path = latest_checkpoint(run_dir)
    assert path is not None
    return path


def test_round_trip_of_a_nested_tree(tmp_path: Path) -> None:
    tree = {
        "round": 3,
        "algorithm": {"global_adapter": {"a.weight": np.arange(6, dtype=np.float32).reshape(2, 3)}},
        "federation": {"clients": {"c00": {"adapter": {"x": torch.ones(2)}}, "c01": {}}},
        "history": [{"round": 0, "eval": {"rougeL": 0.5}}, {"round": 1, "train_loss": None}],
        "pair": (1, "two"),
    }
    save_checkpoint(tmp_path, 3, tree)
    loaded = load_checkpoint(latest(tmp_path))
    expected = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(loaded["algorithm"]["global_adapter"]["a.weight"], expected)
    np.testing.assert_array_equal(loaded["federation"]["clients"]["c00"]["adapter"]["x"], np.ones(2))
    assert loaded["federation"]["clients"]["c01"] == {}
    assert loaded["history"] == tree["history"]
    assert loaded["pair"] == (1, "two")


def test_keeps_only_the_last_checkpoints(tmp_path: Path) -> None:
    for rnd in range(5):
        save_checkpoint(tmp_path, rnd, {"round": rnd}, keep=2)
    kept = sorted(p.name for p in (tmp_path / "checkpoints").glob("round_*"))
    assert kept == ["round_0003", "round_0004"]
    assert load_checkpoint(latest_checkpoint(tmp_path))["round"] == 4  # type: ignore[arg-type]


def test_a_half_written_checkpoint_is_ignored(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, 1, {"round": 1})
    partial = tmp_path / "checkpoints" / ".tmp_round_0002"
    partial.mkdir()
    (partial / "state.json").write_text("{trunc")
    assert load_checkpoint(latest_checkpoint(tmp_path))["round"] == 1  # type: ignore[arg-type]
    clean_partial(tmp_path)
    assert not partial.exists()


def test_no_checkpoint(tmp_path: Path) -> None:
    assert latest_checkpoint(tmp_path) is None


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


DAMAGES = {
    "flipped bytes": lambda d: _flip_a_byte(d / "arrays.safetensors"),
    "truncated arrays": lambda d: (d / "arrays.safetensors").write_bytes(
        (d / "arrays.safetensors").read_bytes()[:100]
    ),
    "junk state.json": lambda d: (d / "state.json").write_text("{junk"),
    "missing state.json": lambda d: (d / "state.json").unlink(),
    "missing manifest": lambda d: (d / "manifest.json").unlink(),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_damaged_checkpoint_is_refused_and_the_previous_one_found(damage: str, tmp_path: Path) -> None:
    for rnd in (1, 2):
        save_checkpoint(tmp_path, rnd, {"round": rnd, "w": np.full(64, float(rnd), dtype=np.float32)})
    newest = tmp_path / "checkpoints" / "round_0002"

    DAMAGES[damage](newest)

    with pytest.raises(CheckpointDamaged, match="round_0002"):
        load_checkpoint(newest)
    path, damaged = intact_checkpoint(tmp_path)
    assert path == tmp_path / "checkpoints" / "round_0001"
    assert len(damaged) == 1 and "round_0002" in damaged[0]
    assert load_checkpoint(path)["round"] == 1


def test_no_intact_checkpoint_is_none_with_every_reason(tmp_path: Path) -> None:
    for rnd in (1, 2):
        save_checkpoint(tmp_path, rnd, {"w": np.ones(8, dtype=np.float32)})
        _flip_a_byte(tmp_path / "checkpoints" / f"round_{rnd:04d}" / "arrays.safetensors")

    path, damaged = intact_checkpoint(tmp_path)

    assert path is None and len(damaged) == 2


def test_a_bf16_optimizer_state_goes_into_a_checkpoint_and_back(tmp_path: Path) -> None:
    # FedBiOT's server aligns its bf16 emulator (model.dtype auto on a GPU) with AdamW; numpy has no bf16
    from fedtune.train.optim import optimizer_state_from_tree, optimizer_state_to_tree

    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 3).to(torch.bfloat16)
    optimizer = torch.optim.AdamW(layer.parameters(), lr=1e-2)
    layer(torch.randn(2, 4, dtype=torch.bfloat16)).sum().backward()
    optimizer.step()
    tree = optimizer_state_to_tree(optimizer)
    save_checkpoint(tmp_path, 1, {"opt": tree})
    restored = torch.optim.AdamW(layer.parameters(), lr=1e-2)
    restored.load_state_dict(optimizer_state_from_tree(load_checkpoint(latest(tmp_path))["opt"]))
    for index, entry in optimizer.state_dict()["state"].items():
        for key, value in entry.items():
            again = restored.state_dict()["state"][index][key]
            # (the checkpoint keeps a 0-d array, AdamW's step, as one of shape (1,))
            assert again.dtype == value.dtype and torch.equal(again.reshape(value.shape), value), (index, key)
