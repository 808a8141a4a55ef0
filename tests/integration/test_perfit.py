"""PerFIT end to end on tiny models: masks, the personalised aggregation on the wire, budgets, bytes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from fedtune.algorithms.base import derive_seed
from fedtune.algorithms.perfit import MASK, VALUES, kept_count
from fedtune.algorithms.perfit.maths import symmetric_init, update_global
from fedtune.config import ConfigError
from fedtune.fl.aggregate import gather_masked, masked_average, scatter_masked, unpack_mask
from fedtune.fl.checkpoint import latest_checkpoint, load_checkpoint
from fedtune.fl.payload import Payload, arrays, payload_nbytes
from tests.integration.helpers import quiet_runner, tiny_config


def tapped(cfg: Any, run_dir: Path) -> tuple[list[dict[str, Any]], list[tuple[str, str, str, int, Payload]]]:
    seen: list[tuple[str, str, str, int, Payload]] = []

    def tap(direction: str, client: str, task: str, rnd: int, payload: Payload) -> None:
        seen.append((direction, client, task, rnd, payload))

    return quiet_runner(cfg, run_dir, tap=tap).run(), seen


def masks_of(
    seen: list[tuple[str, str, str, int, Payload]], shapes: dict[str, tuple[int, ...]]
) -> dict[str, Any]:
    found = {}
    for direction, client, task, _, payload in seen:
        if direction == "up" and task == "search":
            found[client] = {k: unpack_mask(v, shapes[k]) for k, v in arrays(payload, MASK).items()}
    return found


def shapes_of(cfg: Any) -> dict[str, tuple[int, ...]]:
    from fedtune.algorithms.perfit import PerFIT
    from fedtune.resources import Resources

    return PerFIT(cfg).module_shapes(Resources(cfg))


def assert_clients_hold(run_dir: Path, payloads: dict[str, Payload]) -> None:
    """Each client's saved values (latest checkpoint) are exactly the values in its payload."""
    path = latest_checkpoint(run_dir)
    assert path is not None
    states = load_checkpoint(path)["federation"]["clients"]
    for client, payload in payloads.items():
        for key, value in arrays(payload, VALUES).items():
            np.testing.assert_array_equal(states[client]["values"][key], value)


def test_masks_hold_each_clients_budget_and_differ(tmp_path: Path) -> None:
    cfg = tiny_config("perfit", "fed.rounds=1", "perfit.budgets=[2,4]", "perfit.sparsity=0.5")
    _, seen = tapped(cfg, tmp_path / "run")
    shapes = shapes_of(cfg)
    masks = masks_of(seen, shapes)
    assert sorted(masks) == ["c00", "c01", "c02", "c03"]
    for client, mask in masks.items():
        budget = 2 if client in ("c00", "c02") else 4
        assert sum(int(m.sum()) for m in mask.values()) == kept_count(shapes, budget)
    # Clients with other data (pathological split) pick other entries.
    same_budget = [masks["c01"], masks["c03"]]
    overlap = sum(int((a & b).sum()) for a, b in zip(*(m.values() for m in same_budget), strict=True))
    assert overlap < kept_count(shapes, 4)


def test_the_update_is_the_masked_mean_times_each_receivers_mask(tmp_path: Path) -> None:
    # The ablation perfit.start=own: each trained client receives Alg. 3's mean at its own entries.
    cfg = tiny_config("perfit", "fed.rounds=2", "perfit.start=own")
    _, seen = tapped(cfg, tmp_path / "run")
    masks = masks_of(seen, shapes_of(cfg))
    for rnd in (1, 2):
        uploads = {c: p for d, c, t, r, p in seen if d == "up" and t == "fit" and r == rnd}
        updates = {c: p for d, c, t, r, p in seen if d == "down" and t == "update" and r == rnd}
        assert set(updates) == set(uploads) and len(uploads) == 4
        clients = sorted(uploads)
        states = [scatter_masked(arrays(uploads[c], VALUES), masks[c]) for c in clients]
        mean, held = masked_average(
            states, [masks[c] for c in clients], [int(uploads[c]["num_examples"]) for c in clients]
        )
        assert any((h == 1).any() for h in held.values()), "some entries should be exclusive to one client"
        for client in clients:
            expected = gather_masked(mean, masks[client])
            for key, value in arrays(updates[client], VALUES).items():
                np.testing.assert_array_equal(value, expected[key])


def test_with_own_starts_unsampled_clients_keep_their_modules(tmp_path: Path) -> None:
    cfg = tiny_config("perfit", "fed.rounds=3", "fed.clients_per_round=2", "perfit.start=own")
    history, seen = tapped(cfg, tmp_path / "run")
    assert any(len(row["clients"]) == 2 for row in history[1:])
    last_update: dict[str, Payload] = {}
    for direction, client, task, _, payload in seen:
        if direction == "down" and task == "update":
            last_update[client] = payload
    assert_clients_hold(tmp_path / "run", last_update)


def test_without_aggregation_every_client_keeps_what_it_trained(tmp_path: Path) -> None:
    # The ablation perfit.aggregate=false: no update goes down, each client's values are its own upload.
    cfg = tiny_config("perfit", "fed.rounds=2", "perfit.start=own", "perfit.aggregate=false")
    _, seen = tapped(cfg, tmp_path / "run")
    assert not [t for d, _, t, _, _ in seen if d == "down" and t == "update"]
    last_upload = {c: p for d, c, t, _, p in seen if d == "up" and t == "fit"}
    assert len(last_upload) == 4
    assert_clients_hold(tmp_path / "run", last_upload)


def test_only_masked_values_go_up_and_the_mask_only_once(tmp_path: Path) -> None:
    cfg = tiny_config("perfit", "fed.rounds=2")
    _, seen = tapped(cfg, tmp_path / "run")
    shapes = shapes_of(cfg)
    kept = kept_count(shapes, cfg.lora.r)
    searches = [p for d, _, t, _, p in seen if d == "up" and t == "search"]
    assert len(searches) == 4  # once per client, before round 1
    mask_bytes = sum((int(np.prod(s)) + 7) // 8 for s in shapes.values())
    assert all(sum(v.nbytes for v in arrays(p, MASK).values()) == mask_bytes for p in searches)
    fits = [p for d, _, t, _, p in seen if d == "up" and t == "fit"]
    assert all(sum(v.nbytes for v in arrays(p, VALUES).values()) == kept * 4 for p in fits)
    dense = sum(int(np.prod(s)) for s in shapes.values()) * 4
    assert max(payload_nbytes(p) for p in fits) < dense  # sparse upload: below the expanded dense size


def test_clients_prune_one_common_initial_lora(tmp_path: Path) -> None:
    # Alg. 2 starts every client from the same Delta theta_0: an entry two clients keep starts equal,
    # which is what makes the parameter-wise mean of Alg. 3 meaningful.
    cfg = tiny_config("perfit", "fed.rounds=1", "train.lr=1e-12", "eval.before=false")
    _, seen = tapped(cfg, tmp_path / "run")
    masks = masks_of(seen, shapes_of(cfg))
    uploads = {c: arrays(p, VALUES) for d, c, t, _, p in seen if d == "up" and t == "fit"}
    dense = {c: scatter_masked(uploads[c], masks[c]) for c in uploads}
    key = next(iter(dense["c00"]))
    both = masks["c00"][key] & masks["c01"][key]
    assert both.any()
    np.testing.assert_allclose(dense["c00"][key][both], dense["c01"][key][both], rtol=1e-5, atol=1e-8)


def test_every_client_searches_before_round_1_with_the_global_module(tmp_path: Path) -> None:
    cfg = tiny_config("perfit", "fed.rounds=2", "fed.clients_per_round=1", "eval.before=false")
    own = tiny_config(
        "perfit", "fed.rounds=2", "fed.clients_per_round=1", "eval.before=false", "perfit.start=own"
    )

    _, seen = tapped(cfg, tmp_path / "global")
    _, seen_own = tapped(own, tmp_path / "own")

    searched = sorted(c for d, c, t, r, _ in seen if d == "up" and t == "search" and r == 1)
    assert searched == ["c00", "c01", "c02", "c03"]
    assert not [c for d, c, t, r, _ in seen if t == "search" and r > 1]
    # The ablation searches lazily: only the clients sampled so far.
    assert len({c for d, c, t, _, _ in seen_own if d == "up" and t == "search"}) <= 2


def test_a_sampled_client_starts_from_the_global_module_at_its_mask(tmp_path: Path) -> None:
    # Prepare: 3 rounds, 2 of 4 clients a round, so entries no trained client holds must keep G's value.
    cfg = tiny_config("perfit", "fed.rounds=3", "fed.clients_per_round=2", "eval.before=false")
    shapes = shapes_of(cfg)

    # Execute
    history, seen = tapped(cfg, tmp_path / "run")

    # Assert: replay the server's G from the shared init and the uploads, round by round.
    masks = masks_of(seen, shapes)
    module = symmetric_init(shapes, derive_seed(cfg.seed, "perfit-init"))
    for rnd in (1, 2, 3):
        sent = {c: arrays(p, VALUES) for d, c, t, r, p in seen if d == "down" and t == "fit" and r == rnd}
        uploads = {c: p for d, c, t, r, p in seen if d == "up" and t == "fit" and r == rnd}
        assert sorted(sent) == sorted(history[rnd]["clients"]) and len(sent) == 2
        for client, values in sent.items():
            expected = gather_masked(module, masks[client])
            for key in shapes:
                np.testing.assert_array_equal(values[key], expected[key])
        clients = sorted(uploads)
        states = [scatter_masked(arrays(uploads[c], VALUES), masks[c]) for c in clients]
        weights = [int(uploads[c]["num_examples"]) for c in clients]
        module = update_global(module, states, [masks[c] for c in clients], weights)
    path = latest_checkpoint(tmp_path / "run")
    assert path is not None
    saved = load_checkpoint(path)["algorithm"]["global_module"]
    for key in shapes:
        np.testing.assert_array_equal(saved[key], module[key])
    # Every client is scored on G at its mask; the round's trained clients also right after training.
    assert {"personal/perplexity", "personal_after_fit/perplexity"} <= set(history[3]["eval"])
    assert sorted(history[3]["eval_by_client"]) == ["c00", "c01", "c02", "c03"]


def test_the_no_aggregation_ablation_needs_own_starts() -> None:
    try:
        tiny_config("perfit", "perfit.aggregate=false")
    except ConfigError as error:
        assert "perfit.start: own" in str(error)
    else:
        raise AssertionError("perfit.aggregate=false with perfit.start=global was accepted")


def test_perfit_takes_the_per_entry_median_and_refuses_a_trimmed_mean(tmp_path: Path) -> None:
    median = tiny_config("perfit", "fed.rounds=1", "eval.before=false", "fed.aggregator=median")
    trimmed = tiny_config("perfit", "fed.rounds=1", "eval.before=false", "fed.aggregator=trimmed_mean")

    history = quiet_runner(median, tmp_path / "median").run()

    assert history[1]["train_loss"] > 0
    try:
        quiet_runner(trimmed, tmp_path / "trimmed").run()
    except ConfigError as error:
        assert "fed.aggregator" in str(error) and "median" in str(error)
    else:
        raise AssertionError("PerFIT ran with fed.aggregator=trimmed_mean")
