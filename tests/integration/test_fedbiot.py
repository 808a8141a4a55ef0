"""FedBiOT / FedOT / Offsite-tuning on tiny random models: traffic boundaries, who trains what."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fedtune.algorithms.fedbiot import ClientCacheMiss, FedBiOT
from fedtune.algorithms.fedbiot.client import fit
from fedtune.eval.evaluate import EvalSet
from fedtune.fl.federation import ClientContext
from fedtune.fl.payload import Payload, arrays
from fedtune.models.loading import load_causal_lm
from fedtune.models.surgery import layer_state, non_layer_parameters
from fedtune.progress import RunProgress
from fedtune.resources import Resources
from tests.integration.helpers import quiet_runner, tiny_config

FEDOT = (
    "fedbiot.split=first_last",
    "fedbiot.adapter_layers=4",
    "fedbiot.align_steps=0",
    "fedbiot.prox_eps=0",
)
LAYER = re.compile(r"model\.layers\.(\d+)\.")


def _digest(array: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(array, dtype=np.float32).tobytes()).hexdigest()


def _run_and_tap(cfg: Any, run_dir: Path) -> tuple[list[dict[str, Any]], list[tuple[str, str, int, Payload]]]:
    seen: list[tuple[str, str, int, Payload]] = []
    history = quiet_runner(cfg, run_dir, tap=lambda d, c, t, r, p: seen.append((d, c, r, p))).run()
    return history, seen


def _built(cfg: Any, run_dir: Path) -> tuple[FedBiOT, Any, Any]:
    run_dir.mkdir(parents=True, exist_ok=True)
    runner = quiet_runner(cfg, run_dir)
    with RunProgress(runner.console, 1, enabled=False) as progress:
        algorithm, fed, server = runner._build(progress)
    assert isinstance(algorithm, FedBiOT)
    algorithm.setup(server)
    return algorithm, fed, server


@pytest.mark.parametrize("variant", ["fedbiot", "fedot"])
def test_no_dropped_layer_ever_leaves_the_server(variant: str, tmp_path: Path) -> None:
    cfg = tiny_config("fedbiot", *(FEDOT if variant == "fedot" else ()))
    algorithm = FedBiOT(cfg)
    _, seen = _run_and_tap(cfg, tmp_path / "run")
    original, _ = load_causal_lm(cfg.model.name, seed=cfg.seed)
    from fedtune.algorithms.fedbiot import make_split

    split = make_split(cfg.fedbiot, 8)
    assert split.dropped, "the tiny config must drop layers for this test to mean anything"
    allowed = {_digest(v) for v in layer_state(original, split.kept).values()}
    # Norm weights start as all-ones in every layer: only digests unique to dropped layers identify them.
    dropped = {_digest(v) for v in layer_state(original, split.dropped).values()} - allowed
    assert dropped
    assert {d for d, *_ in seen} == {"down", "up"}
    for direction, _, _, payload in seen:
        for key, value in payload.items():
            if not isinstance(value, np.ndarray) or key.startswith("layout/"):
                continue
            match = LAYER.search(key)
            if match:
                index = int(match.group(1))
                assert index in split.kept and index not in split.dropped, key
                if direction == "up":
                    assert key.startswith("adapter/") and index in split.adapter, key
            else:
                assert direction == "down" and key.startswith("frozen/"), key
            assert _digest(value) not in dropped, key
    del algorithm


def test_emulator_is_sent_only_when_it_changed(tmp_path: Path) -> None:
    # FedOT: the emulator is fixed after the initial distillation -> each client gets it once.
    cfg = tiny_config("fedbiot", *FEDOT, "fed.rounds=3")
    history, seen = _run_and_tap(cfg, tmp_path / "fedot")
    downs = [(client, rnd, p) for d, client, rnd, p in seen if d == "down"]
    for client, rnd, payload in downs:
        has_emulator = any(k.startswith("emulator/") for k in payload)
        has_frozen = any(k.startswith("frozen/") for k in payload)
        assert has_emulator == has_frozen == (rnd == 1), (client, rnd)
    assert (
        history[1]["emulator_sends"] == 4
        and history[2]["emulator_sends"] == history[3]["emulator_sends"] == 0
    )
    assert history[2]["bytes_down"] < history[1]["bytes_down"]
    assert history[2]["bytes_down"] == history[3]["bytes_down"]
    # FedBiOT aligns the emulator every round: it changes, so it is sent every round.
    cfg = tiny_config("fedbiot", "fed.rounds=3")
    history, seen = _run_and_tap(cfg, tmp_path / "fedbiot")
    for d, _, rnd, payload in seen:
        if d == "down":
            assert any(k.startswith("emulator/") for k in payload)
            assert any(k.startswith("frozen/") for k in payload) == (rnd == 1)
    assert [row["emulator_version"] for row in history[1:]] == [2, 3, 4]


def test_only_the_emulator_trains_on_the_server(tmp_path: Path) -> None:
    cfg = tiny_config("fedbiot")
    algorithm, fed, server = _built(cfg, tmp_path / "run")
    full, emulator, split = server.resources.get("fedbiot/server_models", lambda: None)
    original, _ = load_causal_lm(cfg.model.name, seed=cfg.seed)

    def snapshot(model: Any, positions: Any = None) -> dict[str, np.ndarray]:
        return layer_state(model, list(range(8)) if positions is None else split.kept, positions)

    emulator_before = snapshot(emulator, split.emulator_positions())
    for rnd in (1, 2):
        fed.begin_round(rnd)
        algorithm.run_round(rnd, server, fed)
    # E* and the non-layer weights of the full model are exactly the pretrained ones.
    pretrained = layer_state(original, split.emulator_full)
    for key, value in layer_state(full, split.emulator_full).items():
        np.testing.assert_array_equal(value, pretrained[key])
    for key, p in non_layer_parameters(full).items():
        torch.testing.assert_close(p, dict(original.named_parameters())[key], rtol=0, atol=0)
    after = snapshot(emulator, split.emulator_positions())
    emulator_keys = set(layer_state(emulator, split.emulator, split.emulator_positions()))
    changed = {k for k in after if not np.array_equal(after[k], emulator_before[k])}
    # Emulator layers moved (alignment), adapter layers hold the new global adapter; nothing else.
    assert changed & emulator_keys
    assert changed <= emulator_keys | set(algorithm.global_adapter)


def test_proximal_term_keeps_the_adapter_near_the_broadcast(tmp_path: Path) -> None:
    def drift(eps: float) -> float:
        cfg = tiny_config("fedbiot", f"fedbiot.prox_eps={eps}", "fed.rounds=1", "train.max_steps=6")
        algorithm, fed, server = _built(cfg, tmp_path / f"eps{eps}")
        start = dict(algorithm.global_adapter)
        fed.begin_round(1)
        algorithm.run_round(1, server, fed)
        return float(sum(np.sum((algorithm.global_adapter[k] - start[k]) ** 2) for k in start))

    free, held = drift(0.0), drift(10.0)
    assert 0 < held < 0.9 * free


def test_round_logs_how_far_the_clients_moved_the_adapter(tmp_path: Path) -> None:
    # adapter_shift: the mean over the round's replies of ||adapter sent up - adapter sent down||_2;
    # adapter_shift_pct: the same in percent of the adapter sent down's norm. Recomputed from the wire;
    # the runner keeps two decimals of a round's statistics.
    cfg = tiny_config("fedbiot", "fed.rounds=2")
    history, seen = _run_and_tap(cfg, tmp_path / "run")
    for rnd in (1, 2):
        down = {c: arrays(p, "adapter/") for d, c, r, p in seen if d == "down" and r == rnd}
        up = {c: arrays(p, "adapter/") for d, c, r, p in seen if d == "up" and r == rnd}
        assert up and set(up) <= set(down)
        sent = next(iter(down.values()))
        shifts = [np.sqrt(sum(np.sum((up[c][k] - sent[k]) ** 2.0) for k in sent)) for c in up]
        scale = np.sqrt(sum(np.sum(v.astype(np.float64) ** 2) for v in sent.values()))
        assert history[rnd]["adapter_shift"] == pytest.approx(np.mean(shifts), abs=0.0051)
        assert history[rnd]["adapter_shift_pct"] == pytest.approx(100 * np.mean(shifts) / scale, abs=0.0051)
        assert history[rnd]["adapter_shift"] > 0


def test_lora_adapter_mode_sends_only_lora_factors_up(tmp_path: Path) -> None:
    cfg = tiny_config("fedbiot", "fedbiot.adapter_mode=lora", "lora.r=2", "lora.alpha=4")
    history, seen = _run_and_tap(cfg, tmp_path / "run")
    ups = [p for d, _, _, p in seen if d == "up"]
    assert ups
    for payload in ups:
        keys = [k for k, v in payload.items() if isinstance(v, np.ndarray)]
        assert keys and all("lora_" in k for k in keys)
    first = next(p for d, _, r, p in seen if d == "down" and r == 1)
    # The adapter layers' frozen base weights travel with the frozen part in LoRA mode.
    assert any(k.startswith("frozen/") and LAYER.search(k) and "lora_" not in k for k in first)
    assert np.isfinite(history[-1]["eval"]["adapfu/perplexity"])


def test_offsite_tuning_is_one_client_with_all_data(tmp_path: Path) -> None:
    cfg = tiny_config("fedbiot", *FEDOT, "fed.mode=centralized")
    history = quiet_runner(cfg, tmp_path / "run").run()
    assert history[1]["clients"] == ["central"]
    assert {"adapemu/perplexity", "adapfu/perplexity"} <= set(history[-1]["eval"])


def test_round_zero_adapfu_is_the_pretrained_model(tmp_path: Path) -> None:
    cfg = tiny_config("fedbiot")
    algorithm, fed, server = _built(cfg, tmp_path / "run")
    zero = algorithm.evaluate(0, server, fed, EvalSet("", server.eval_records)).metrics
    original, tokenizer = load_causal_lm(cfg.model.name, seed=cfg.seed)
    from fedtune.eval.evaluate import evaluate_lm

    reference = evaluate_lm(
        original,
        tokenizer,
        server.eval_records,
        cfg.eval,
        template=cfg.data.template,
        max_length=cfg.data.max_length,
        seed=0,
    ).metrics
    assert zero["adapfu/perplexity"] == pytest.approx(reference["perplexity"], rel=1e-6)
    assert zero["adapemu/perplexity"] != pytest.approx(reference["perplexity"], rel=1e-3)


@pytest.mark.parametrize("cache", ["memory", "disk"])
def test_restarted_client_process(cache: str, tmp_path: Path) -> None:
    cfg = tiny_config("fedbiot", *FEDOT, f"fedbiot.client_cache={cache}")
    algorithm, fed, _ = _built(cfg, tmp_path / "run")
    client = fed.client_ids()[0]
    workdir = tmp_path / "client"

    def context(resources: Resources) -> ClientContext:
        return ClientContext(client, cfg, fed.client_data[client], resources, {}, workdir, rnd=1)

    first = algorithm.message(client)
    fit(context(Resources(cfg)), first)
    algorithm.broadcast.delivered([client])
    lean = algorithm.message(client)
    assert not any(k.startswith(("emulator/", "frozen/")) for k in lean)
    fresh = Resources(cfg)  # a new client process: nothing in memory
    if cache == "memory":
        with pytest.raises(ClientCacheMiss, match="holds no emulator model"):
            fit(context(fresh), lean)
    else:
        # Architecture, frozen part and emulator all come from the client's own disk.
        reply = fit(context(fresh), lean)
        assert np.isfinite(reply["train_loss"])
        again = fit(context(Resources(cfg)), lean)
        key = "adapter/" + next(iter(algorithm.global_adapter))
        np.testing.assert_array_equal(again[key], reply[key])


@pytest.mark.parametrize("arch", ["qwen2", "gpt2"])
def test_runs_on_other_decoder_families(arch: str, tmp_path: Path) -> None:
    cfg = tiny_config("fedbiot", f"model.name=tiny-{arch}-L8-H32", "fed.rounds=1", *FEDOT)
    history, seen = _run_and_tap(cfg, tmp_path / "run")
    assert not history[1]["failed"] and not history[1]["rejected"]
    assert np.isfinite(history[1]["eval"]["adapemu/perplexity"])
    assert any(k.startswith("emulator/") for d, _, _, p in seen if d == "down" for k in p)


def test_initial_distillation_is_shared_through_init_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fedtune.algorithms.fedbiot.server as fedbiot

    calls: list[int] = []
    align = fedbiot.align_emulator

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(len(args[3]))
        return align(*args, **kwargs)

    monkeypatch.setattr(fedbiot, "align_emulator", counting)
    shared = f"fedbiot.init_cache={tmp_path / 'shared'}"
    first, _, _ = _built(tiny_config("fedbiot", shared), tmp_path / "a")
    assert calls == [first.section.init_steps]
    # eps and the per-round steps do not enter the initial distillation: the second run reuses it.
    second, _, _ = _built(tiny_config("fedbiot", shared, "fedbiot.prox_eps=0"), tmp_path / "b")
    assert len(calls) == 1
    assert (tmp_path / "b" / "fedbiot" / "emulator-init.npz").is_file()  # kept for its own resume
    first_state, second_state = first.state_dict()["emulator"], second.state_dict()["emulator"]
    assert first_state.keys() == second_state.keys()
    for key, value in first_state.items():
        np.testing.assert_array_equal(value, second_state[key], err_msg=key)
    # A setting that does enter it (lambda) distils anew, into an entry of its own.
    _built(tiny_config("fedbiot", shared, "fedbiot.align_lambda=0"), tmp_path / "c")
    assert len(calls) == 2
    assert len(list((tmp_path / "shared").iterdir())) == 2


def test_runs_started_together_distil_a_shared_init_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two runs with one ``init_cache`` started at once (a table's ``--jobs``): the second waits for the
    first's initial distillation and loads it, instead of both distilling the same emulator."""
    import threading
    import time

    import fedtune.algorithms.fedbiot.server as fedbiot

    calls: list[int] = []
    align = fedbiot.align_emulator
    both_started = threading.Barrier(2, timeout=60)

    def slow(*args: Any, **kwargs: Any) -> Any:
        calls.append(len(args[3]))
        time.sleep(1.0)  # wide enough for the other run to reach the cache while this one distils
        return align(*args, **kwargs)

    monkeypatch.setattr(fedbiot, "align_emulator", slow)
    shared = f"fedbiot.init_cache={tmp_path / 'shared'}"
    errors: list[BaseException] = []

    def build(name: str) -> None:
        try:
            both_started.wait()
            _built(tiny_config("fedbiot", shared), tmp_path / name)
        except BaseException as error:  # reported by the assert below, in the test's thread
            errors.append(error)

    threads = [threading.Thread(target=build, args=(name,)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not errors, errors
    assert len(calls) == 1, "both runs distilled the same initial emulator"
    for name in ("a", "b"):
        assert (tmp_path / name / "fedbiot" / "emulator-init.npz").is_file()


def test_client_model_is_placed_on_model_device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import fedtune.algorithms.fedbiot.client as fedbiot

    asked: list[str] = []

    def spy(device: str) -> torch.device:
        asked.append(device)
        return torch.device("cpu")

    monkeypatch.setattr(fedbiot, "resolve_device", spy)
    quiet_runner(tiny_config("fedbiot", "fed.rounds=1", "model.device=cpu"), tmp_path / "run").run()
    assert asked == ["cpu"], "the client's emulator model must go to model.device"


def test_alignment_optimizer_persists_across_rounds_and_resumes(tmp_path: Path) -> None:
    from tests.integration.test_contract import Interrupt

    cfg = tiny_config("fedbiot", "fedbiot.align_optimizer=adamw", "fed.rounds=3")
    algorithm, fed, server = _built(cfg, tmp_path / "probe")
    for rnd in (1, 2):
        fed.begin_round(rnd)
        algorithm.run_round(rnd, server, fed)
    assert algorithm.align_optimizer is not None
    steps = {float(entry["step"]) for entry in algorithm.align_optimizer.state.values()}
    assert steps == {2.0 * cfg.fedbiot.align_steps}, "AdamW's moments must carry over from round to round"

    full = quiet_runner(cfg, tmp_path / "full").run()

    def die_in_round_3(client: str, task: str, rnd: int) -> None:
        if rnd == 3:
            raise Interrupt

    with pytest.raises(Interrupt):
        quiet_runner(cfg, tmp_path / "cut", before_task=die_in_round_3).run()
    resumed = quiet_runner(cfg, tmp_path / "cut").run(resume=True)
    assert resumed[3]["eval"] == full[3]["eval"]


def test_alignment_runs_the_student_without_dropout(tmp_path: Path) -> None:
    cfg = tiny_config("fedbiot", "fedbiot.adapter_mode=lora")
    algorithm, fed, server = _built(cfg, tmp_path / "run")
    _, emulator, _ = server.resources.get("fedbiot/server_models", lambda: None)
    modes: list[bool] = []
    dropouts = [m for m in emulator.modules() if isinstance(m, torch.nn.Dropout)]
    hooks = [
        m.register_forward_pre_hook(lambda module, args: modes.append(module.training)) for m in dropouts
    ]
    fed.begin_round(1)
    algorithm.run_round(1, server, fed)
    for hook in hooks:
        hook.remove()
    assert modes and not any(modes)


def test_alignment_clip_norm_is_its_own_setting(tmp_path: Path) -> None:
    def emulator_after(*overrides: str) -> dict[str, np.ndarray]:
        cfg = tiny_config("fedbiot", "fed.rounds=1", *overrides)
        algorithm, fed, server = _built(cfg, tmp_path / "-".join(overrides or ("default",)))
        fed.begin_round(1)
        algorithm.run_round(1, server, fed)
        return algorithm.state_dict()["emulator"]  # type: ignore[no-any-return]

    default = emulator_after()
    clipped = emulator_after("fedbiot.align_clip_norm=1e-6")
    assert any(not np.array_equal(default[k], clipped[k]) for k in default)


@pytest.mark.parametrize("adapter_mode", ["full", "lora"])
def test_generate_and_eval_work_on_a_fedbiot_run(adapter_mode: str, tmp_path: Path) -> None:
    from fedtune.algorithms.final import FinalModelError
    from fedtune.artifacts import evaluate_run, generate_from_run, load_final

    cfg = tiny_config("fedbiot", "fed.rounds=1", f"fedbiot.adapter_mode={adapter_mode}")
    history = quiet_runner(cfg, tmp_path / "run").run()

    texts = generate_from_run(tmp_path / "run", ["Define 'harbor'."], max_new_tokens=3)
    emulated = generate_from_run(tmp_path / "run", ["Define 'harbor'."], max_new_tokens=3, variant="adapemu")
    assert len(texts) == 1 and len(emulated) == 1
    for which, prefix in ((None, "adapfu/"), ("adapfu", "adapfu/"), ("adapemu", "adapemu/")):
        result = evaluate_run(tmp_path / "run", variant=which)
        assert result.metrics["perplexity"] == pytest.approx(
            history[-1]["eval"][f"{prefix}perplexity"], rel=1e-5
        )
    full = load_final(tmp_path / "run").model  # type: ignore[attr-defined]
    emulator = load_final(tmp_path / "run", "adapemu").model  # type: ignore[attr-defined]
    assert sum(p.numel() for p in emulator.parameters()) < sum(p.numel() for p in full.parameters())
    with pytest.raises(FinalModelError, match="adapfu, adapemu"):
        load_final(tmp_path / "run", "emulator")


def test_fp16_wire_halves_the_emulator_bytes(tmp_path: Path) -> None:
    runs = {
        dtype: quiet_runner(
            tiny_config("fedbiot", "fed.rounds=1", "eval.before=false", f"fed.wire_dtype={dtype}"),
            tmp_path / dtype,
        ).run()
        for dtype in ("fp32", "fp16")
    }
    fp32, fp16 = runs["fp32"][1], runs["fp16"][1]
    assert fp16["emulator_sends"] == fp32["emulator_sends"] > 0
    assert 0.45 < fp16["bytes_down"] / fp32["bytes_down"] < 0.6
    assert 0.45 < fp16["emulator_mb_down"] / fp32["emulator_mb_down"] < 0.6  # MB rounded to 0.01
    assert np.isfinite(fp16["train_loss"]) and fp16["train_loss"] != fp32["train_loss"]


@pytest.mark.parametrize("kl_order", ["emulator_first", "full_first"])
def test_the_alignment_takes_the_kl_in_the_configured_order(
    kl_order: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fedtune.algorithms.fedbiot.emulator as emulator

    orders: list[str] = []
    loss = emulator.emulator_alignment_loss

    def spy(*args: Any, **kwargs: Any) -> Any:
        orders.append(kwargs["kl_order"])
        return loss(*args, **kwargs)

    monkeypatch.setattr(emulator, "emulator_alignment_loss", spy)
    overrides = () if kl_order == "emulator_first" else (f"fedbiot.kl_order={kl_order}",)  # the default
    cfg = tiny_config("fedbiot", "fed.rounds=1", *overrides)
    algorithm, fed, server = _built(cfg, tmp_path / "run")
    fed.begin_round(1)
    algorithm.run_round(1, server, fed)
    assert orders == [kl_order] * (cfg.fedbiot.init_steps + cfg.fedbiot.align_steps)


def test_the_kl_order_enters_the_initial_distillations_fingerprint_only_with_a_kl_term() -> None:
    from fedtune.algorithms.fedbiot.config import init_fingerprint

    def fingerprint(*overrides: str) -> dict[str, Any]:
        return init_fingerprint(tiny_config("fedbiot", *overrides))

    assert fingerprint() != fingerprint("fedbiot.kl_order=full_first")
    # FedOT's and Offsite-tuning's distillation has no KL: their shared caches stay valid.
    no_kl = "fedbiot.align_lambda=0"
    assert fingerprint(no_kl) == fingerprint(no_kl, "fedbiot.kl_order=full_first")
    # The LM term enters only when on: caches made before it existed stay valid.
    assert fingerprint() == fingerprint("fedbiot.align_lm=0")
    assert fingerprint(no_kl) != fingerprint(no_kl, "fedbiot.align_lm=0.033")
