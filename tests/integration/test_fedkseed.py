"""FedKSeed end to end on the tiny config: what crosses the wire, what the server refuses."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedtune.fl.payload import Payload
from tests.integration.helpers import quiet_runner, stable, tiny_config

FAST = ("eval.before=false", "eval.metrics=[perplexity]", "eval.max_examples=4")


def test_a_reply_with_a_seed_not_of_the_round_is_rejected_naming_the_seed(tmp_path: Path) -> None:
    def swap_seed(client: str, task: str, rnd: int, reply: Payload) -> Payload:
        if client == "c01" and rnd == 1:
            seeds = np.array(reply["seeds"], copy=True)
            seeds[2] = 99
            return {**reply, "seeds": seeds}
        return reply

    history = quiet_runner(
        tiny_config("fedkseed", "fed.rounds=1", *FAST), tmp_path, after_task=swap_seed
    ).run()

    assert history[1]["rejected"] == {
        "c01": "fedkseed: seed 99 at position 2 is not a seed of this round (expected 1195884381)"
    }


def test_sending_the_model_instead_of_the_history_gives_the_same_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prepare: the same run twice, the second told that the model is always the cheaper catch-up
    cfg = tiny_config("fedkseed", "fed.rounds=3", "fed.clients_per_round=2", *FAST)
    by_history = quiet_runner(cfg, tmp_path / "history").run()
    sent: list[set[str]] = []

    def tap(direction: str, client: str, task: str, rnd: int, payload: Payload) -> None:
        if direction == "down":
            sent.append({key.split("/")[0] for key in payload})

    monkeypatch.setattr("fedtune.algorithms.fedkseed.server.history_is_cheaper", lambda *args: False)

    # Execute
    by_model = quiet_runner(cfg, tmp_path / "model", tap=tap).run()

    # Assert: clients that lacked rounds got the model's arrays and trained from the same bits
    assert any("model" in keys for keys in sent)
    assert sum(row.get("bytes_down", 0) for row in by_model) > sum(
        row.get("bytes_down", 0) for row in by_history
    )
    drop = ("bytes_down",)
    assert [{k: v for k, v in row.items() if k not in drop} for row in stable(by_model)] == [
        {k: v for k, v in row.items() if k not in drop} for row in stable(by_history)
    ]


def test_the_final_model_is_replayed_where_its_directions_were_drawn(tmp_path: Path) -> None:
    # A run trained in fp32 on the CPU, its final model then loaded in bf16 (as model.dtype auto does on a
    # GPU): the history must be replayed in fp32 and the result cast, not replayed in bf16 with other z
    import torch

    from fedtune.algorithms.fedkseed.server import FedKSeed
    from fedtune.algorithms.final import FinalModelError, FinalRun

    cfg = tiny_config("fedkseed", "fed.rounds=2", *FAST)
    quiet_runner(cfg, tmp_path / "run").run()
    saved = np.load(tmp_path / "run" / "artifacts" / "fedkseed-history.npz")
    assert list(saved["drawn_on"]) == ["cpu", "float32"]

    def final(dtype: str) -> dict[str, torch.Tensor]:
        run_cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"dtype": dtype})})
        model = FedKSeed.final_model(FinalRun(run_cfg, tmp_path / "run", None, {}))
        return {k: v.detach().clone() for k, v in model.model.named_parameters()}

    fp32, bf16 = final("fp32"), final("bf16")
    assert all(v.dtype == torch.bfloat16 for v in bf16.values())
    assert all(torch.equal(bf16[k], fp32[k].to(torch.bfloat16)) for k in fp32)

    # A run drawn on a CUDA GPU cannot be replayed without one: a clear error, not another model
    np.savez(
        tmp_path / "run" / "artifacts" / "fedkseed-history.npz",
        **{**{k: saved[k] for k in saved.files}, "drawn_on": np.array(["cuda", "bfloat16"])},
    )
    if not torch.cuda.is_available():
        with pytest.raises(FinalModelError, match="drew its random directions on a CUDA GPU"):
            final("fp32")


@pytest.mark.parametrize("drawn", [("tpu", "float32"), ("cpu", "float8"), ("cpu",), ("cpu", "float32", "x")])
def test_a_history_whose_drawn_on_names_no_device_and_dtype_is_refused_by_name(
    drawn: tuple[str, ...],
) -> None:
    from fedtune.algorithms.fedkseed.server import drawn_on
    from fedtune.algorithms.final import FinalModelError

    with pytest.raises(
        FinalModelError, match=r"history\.npz: drawn_on .* is no device \(cpu, cuda\) and dtype"
    ):
        drawn_on(Path("run/artifacts/history.npz"), drawn)
    assert drawn_on(Path("x"), ("cpu", "float32")) == ("cpu", "fp32")


def test_fedkseed_tunes_in_fp32_where_auto_would_give_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from fedtune.algorithms.fedkseed import client
    from fedtune.resources import Resources

    cfg = tiny_config("fedkseed")
    # On the CPU auto is fp32 already: the run's own model, loaded once
    resources = Resources(cfg)
    assert client.tuned_lm(resources)[0] is resources.base_lm()[0]
    # Where auto means bf16 (a GPU), FedKSeed's model is fp32; a dtype set explicitly is kept
    monkeypatch.setattr(client, "resolve_dtype", lambda dtype, device: torch.bfloat16)
    assert next(client.tuned_lm(Resources(cfg))[0].parameters()).dtype == torch.float32
    explicit = tiny_config("fedkseed", "model.dtype=bf16")
    assert next(client.tuned_lm(Resources(explicit))[0].parameters()).dtype == torch.bfloat16
