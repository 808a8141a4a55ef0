"""FedPFT on a tiny BERT and a tiny Llama classifier: what travels, plug-in, baselines and ablations."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedtune.algorithms.fedpft.final import TUNED_FILE
from fedtune.algorithms.fedpft.wire import APOZ, FFN, FROZEN, TUNED
from fedtune.algorithms.final import FinalModelError
from fedtune.fl.broadcast import load_npz, save_npz
from fedtune.fl.checkpoint import latest_checkpoint, load_checkpoint
from fedtune.fl.payload import Payload
from fedtune.models.ffn import ffn_layers
from fedtune.models.loading import load_encoder_classifier
from tests.integration.helpers import quiet_runner, tiny_config

Tap = list[tuple[str, str, str, int, Payload]]


def tapped_run(tmp_path: Path, *overrides: str) -> tuple[list[dict[str, Any]], Tap]:
    cfg = tiny_config("fedpft", *overrides)
    seen: Tap = []

    def tap(direction: str, client: str, task: str, rnd: int, payload: Payload) -> None:
        seen.append((direction, client, task, rnd, payload))

    return quiet_runner(cfg, tmp_path, tap=tap).run(), seen


def full_widths(name: str) -> dict[int, int]:
    model, _ = load_encoder_classifier(name, 2, device="cpu")
    return {ffn.layer: ffn.width for ffn in ffn_layers(model)}


def ffn_width(key: str, value: np.ndarray) -> int | None:
    """The neuron count of an FFN array (BERT: intermediate rows, output columns; gated decoders: gate
    and up rows, down columns), else None."""
    if ".intermediate.dense." in key or ".mlp.gate_proj." in key or ".mlp.up_proj." in key:
        return int(value.shape[0])
    if ".mlp.down_proj.weight" in key or (".output.dense.weight" in key and ".attention." not in key):
        return int(value.shape[1])
    return None


@pytest.mark.parametrize("model", ["tiny-bert-L4-H32", "tiny-llama-L4-H32"])
def test_no_full_ffn_of_a_compressed_layer_leaves_the_server(tmp_path: Path, model: str) -> None:
    history, seen = tapped_run(tmp_path, f"model.name={model}")
    widths = full_widths(model)
    whole = {0, len(widths) - 1}

    downs = [(client, rnd, p) for direction, client, task, rnd, p in seen if direction == "down"]
    sent = [(k, v) for _, _, p in downs for k, v in p.items() if isinstance(v, np.ndarray)]
    checked = 0
    for key, value in sent:
        width = ffn_width(key, value)
        if width is None:
            continue
        match = re.search(r"\.layers?\.(\d+)\.", key)
        assert match, key
        layer = int(match.group(1))
        # Compressed layers travel only at their sub-model width (as FFN), whole layers once (frozen).
        assert key.startswith(FROZEN if layer in whole else FFN), key
        assert width == (widths[layer] if layer in whole else widths[layer] // 2), key
        checked += 1
    assert checked
    for key, _ in sent:
        assert key.startswith((TUNED, FROZEN, FFN, "layout/")), key
    # The sub-model goes to a client once; its compressed FFNs again only after the neuron-level
    # distillation.
    first = {client for client, rnd, p in downs if rnd == 1 and any(k.startswith(FROZEN) for k in p)}
    again = [p for client, rnd, p in downs if rnd == 2 and client in first]
    assert first and again
    assert all(not any(k.startswith(FROZEN) for k in p) for p in again)
    assert all(any(k.startswith(FFN) for k in p) for p in again)
    assert history[1]["ffn_version"] == 1 and history[2]["ffn_version"] == 2
    apoz = [p for direction, _, task, _, p in seen if direction == "up" and task == "apoz"]
    expected = {f"{APOZ}{i}" for i in range(4)}
    assert apoz and all({k for k in p if k.startswith(APOZ)} == expected for p in apoz)


def test_layers_kept_whole_stay_equal_to_the_full_model(tmp_path: Path) -> None:
    cfg = tiny_config("fedpft")
    quiet_runner(cfg, tmp_path).run()
    state = load_checkpoint(latest_checkpoint(tmp_path))["algorithm"]  # type: ignore[arg-type]
    full, _ = load_encoder_classifier(cfg.model.name, 24, device="cpu", seed=cfg.seed)
    reference = {n: p.detach().numpy() for n, p in full.named_parameters()}

    last = len(ffn_layers(full)) - 1
    whole = [k for k in state["ffn"] if ".layer.0." in k or f".layer.{last}." in k]
    assert whole and state["ffn_version"] == 2  # the neuron-level distillation ran
    for key in whole:
        np.testing.assert_array_equal(state["ffn"][key], reference[key], err_msg=key)
    moved = [
        k for k in state["ffn"] if k not in whole and not np.array_equal(state["ffn"][k], reference.get(k))
    ]
    assert moved


def test_uploads_hold_only_lora_and_the_head(tmp_path: Path) -> None:
    _, seen = tapped_run(tmp_path, "fedpft.neuron_every=0")

    uploads = [p for direction, _, task, _, p in seen if direction == "up" and task == "fit"]
    keys = {k for p in uploads for k, v in p.items() if isinstance(v, np.ndarray)}
    assert keys and all(
        k.startswith(TUNED) and ("lora_" in k or k.startswith(TUNED + "classifier.")) for k in keys
    )
    assert any(k.startswith(TUNED + "classifier.") for k in keys)
    assert not [p for direction, _, task, _, p in seen if task == "apoz"]


def test_full_model_baseline_trains_the_model_it_evaluates(tmp_path: Path) -> None:
    history, _ = tapped_run(tmp_path, "fedpft.submodel=full")

    final = history[-1]["eval"]
    assert final["accuracy"] == pytest.approx(final["sub/accuracy"])
    assert history[1]["ffn_version"] == 1 and history[2]["ffn_version"] == 1


@pytest.mark.parametrize("model", ["tiny-bert-L4-H32", "tiny-llama-L4-H32"])
def test_layer_drop_baseline_plugs_into_the_full_model(tmp_path: Path, model: str) -> None:
    history, seen = tapped_run(
        tmp_path, f"model.name={model}", "fedpft.submodel=layerdrop", "fedpft.drop=0.5"
    )

    layers = {int(v) for _, _, _, _, p in seen for k, v in p.items() if k == "layout/layers" for v in v}
    assert layers == {0, 1, 3}
    assert np.isfinite(history[-1]["eval"]["accuracy"])


def uploaded_lora_layers(seen: Tap) -> set[int]:
    uploads = [p for direction, _, task, _, p in seen if direction == "up" and task == "fit"]
    keys = {k for p in uploads for k in p if "lora_" in k}
    return {int(k.split(".layer.")[1].split(".")[0]) for k in keys}


@pytest.mark.parametrize(("emulator_lora", "trained"), [(False, {0, 3}), (True, {0, 1, 3})])
def test_fedot_trains_the_adapter_layers_and_on_request_the_emulator(
    tmp_path: Path, emulator_lora: bool, trained: set[int]
) -> None:
    # Offsite-tuning / FedOT: only the adapter (the first and last edge_layers layers) and the head
    # train; the emulator's layers (here layer 1 of 0..3, layer 2 dropped) stay as sent.
    extra = ["fedpft.emulator_lora=true"] if emulator_lora else []  # the default is the method
    _, seen = tapped_run(tmp_path, "fedpft.submodel=layerdrop", "fedpft.drop=0.5", *extra)

    assert uploaded_lora_layers(seen) == trained
    downs = [p for direction, _, task, _, p in seen if direction == "down" and task == "fit"]
    sent_tuned = {k for p in downs for k in p if k.startswith(TUNED) and "lora_" in k}
    assert {int(k.split(".layer.")[1].split(".")[0]) for k in sent_tuned} == trained


@pytest.mark.parametrize("distilled", [True, False])
def test_fedot_sends_an_emulator_distilled_as_offsite_tuning_does(tmp_path: Path, distilled: bool) -> None:
    # Layers 0, 1, 3 of 4: the adapters 0 and 3 stay the full model's; the middle layer 1 is distilled
    # towards the full model's middle block (layers 1-2) by default, sent as cut with the ablation.
    extra = [] if distilled else ["fedpft.emulator_distill=false"]
    history, seen = tapped_run(tmp_path, "fedpft.submodel=layerdrop", "fedpft.drop=0.5", *extra)
    full, _ = load_encoder_classifier("tiny-bert-L4-H32", 2, device="cpu")
    original = {k: p.detach().numpy() for k, p in full.named_parameters()}

    sent = {k[len(FROZEN) :]: v for _, _, _, _, p in seen for k, v in p.items() if k.startswith(FROZEN)}
    ffns = {k: v for k, v in sent.items() if k.endswith("intermediate.dense.weight")}
    assert sorted(ffns) == [f"bert.encoder.layer.{i}.intermediate.dense.weight" for i in (0, 1, 3)]
    for layer in (0, 3):
        key = f"bert.encoder.layer.{layer}.intermediate.dense.weight"
        assert np.array_equal(ffns[key], original[key])
    key = "bert.encoder.layer.1.intermediate.dense.weight"
    assert np.array_equal(ffns[key], original[key]) is not distilled
    assert np.isfinite(history[-1]["eval"]["accuracy"])
    info = json.loads((tmp_path / "artifacts" / "fedpft.json").read_text())
    if distilled:
        [entry] = info["distillation"]
        assert entry["steps"] == 4 and entry["last_loss"] < entry["first_loss"]
    else:
        assert info["distillation"] == []


def test_decoder_sub_model_trains(tmp_path: Path) -> None:
    history, _ = tapped_run(tmp_path, "model.name=tiny-llama-L4-H32")

    assert history[-1]["train_loss"] > 0
    assert 0 <= history[-1]["eval"]["accuracy"] <= 1
    assert history[2]["ffn_version"] == 2


def test_nothing_compressed_means_nothing_distilled_nor_re_sent(tmp_path: Path) -> None:
    history, seen = tapped_run(tmp_path, "fedpft.keep_ratio=1.0")

    assert not any(task == "apoz" for _, _, task, _, _ in seen)
    assert history[1]["submodel_sends"] > 0
    assert history[2]["ffn_version"] == 1 and history[2]["submodel_sends"] == 0
    assert "distill_seconds" not in history[1]


def test_fedtune_eval_scores_the_plugged_in_model_like_the_last_round(tmp_path: Path) -> None:
    from fedtune.artifacts import evaluate_run, generate_from_run

    # Sentence pairs, 2 classes: a tiny random model scores away from 0.
    history, _ = tapped_run(tmp_path, "fedpft.submodel=layerdrop", "data.dataset=wordnet-wic")
    result = evaluate_run(tmp_path)

    assert 0 < result.metrics["accuracy"] == pytest.approx(history[-1]["eval"]["accuracy"])
    assert result.by_category == history[-1]["eval_by_category"]
    assert result.metrics["macro_f1"] == pytest.approx(history[-1]["eval"]["macro_f1"])
    with pytest.raises(FinalModelError, match="does not generate"):
        generate_from_run(tmp_path, ["hello"])

    # A tuned state without the head would score a random head: refused, naming the file.
    tuned_file = tmp_path / "artifacts" / TUNED_FILE
    save_npz(tuned_file, {k: v for k, v in load_npz(tuned_file).items() if not k.startswith("classifier.")})
    with pytest.raises(KeyError, match=f"{TUNED_FILE}.*classifier"):
        evaluate_run(tmp_path)


class Interrupt(BaseException):
    """Stops the whole run (an Exception would count as the client's failure)."""


def test_a_resumed_run_reports_every_distillation_once(tmp_path: Path) -> None:

    cfg = tiny_config("fedpft", "fed.rounds=3")
    quiet_runner(cfg, tmp_path / "full").run()

    def die_in_round_3(client: str, task: str, rnd: int) -> None:
        if rnd == 3:
            raise Interrupt

    with pytest.raises(Interrupt):
        quiet_runner(cfg, tmp_path / "cut", before_task=die_in_round_3).run()
    quiet_runner(cfg, tmp_path / "cut").run(resume=True)

    def log(run: str) -> list[tuple[float, float, float]]:
        info = json.loads((tmp_path / run / "artifacts" / "fedpft.json").read_text())
        return [(d["round"], d["steps"], d["last_loss"]) for d in info["distillation"]]

    # The initial distillation and the neuron-level ones after rounds 1 and 2, as uninterrupted.
    assert [entry[0] for entry in log("full")] == [0.0, 1.0, 2.0]
    assert log("cut") == log("full")


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"positions": -(10**6)}, "positions"),
        ({"positions": 0}, "positions"),
        ("scaled", "counts outside"),
    ],
)
def test_apoz_replies_a_client_cannot_have_counted_are_rejected(
    tmp_path: Path, change: Any, reason: str
) -> None:
    # Prepare: client c00's APoZ reply lies; the others' are honest.
    def lie(client: str, task: str, rnd: int, reply: Payload) -> Payload:
        if client != "c00" or task != "apoz":
            return reply
        if change == "scaled":
            return {k: v * 1e30 if isinstance(v, np.ndarray) else v for k, v in reply.items()}
        return {**reply, **change}

    cfg = tiny_config("fedpft", "fed.rounds=2")

    # Execute
    history = quiet_runner(cfg, tmp_path / "run", after_task=lie).run()

    # Assert: the run goes on without it, with the reason and only honest clients' APoZ
    apoz_row = next(row for row in history if "apoz_clients" in row)
    assert reason in apoz_row["rejected"]["c00"]
    assert apoz_row["apoz_clients"] == 3 and 0 <= apoz_row["apoz_mean"] <= 1


def test_distilling_the_output_norms_trains_and_re_sends_the_compressed_layers_only(tmp_path: Path) -> None:
    """``distill_norms``: the compressed layers' FFN output LayerNorm trains with their FFN (as the
    authors' code) and travels with it (``ffn/``, again after each distillation); the norms of layers
    kept whole stay the full model's and travel once (``frozen/``). The other distillation options
    (warmup + cosine, the layer-relative error) run with it."""
    options = (
        "fedpft.distill_norms=true",
        "fedpft.distill_schedule=cosine",
        "fedpft.distill_warmup_ratio=0.25",
        "fedpft.hidden_loss=layer_relative",
    )
    cfg = tiny_config("fedpft", *options)
    _, seen = tapped_run(tmp_path, *options)

    def norm_of(key: str) -> int | None:
        match = re.search(r"\.layer\.(\d+)\.output\.LayerNorm\.", key)
        return None if match is None or ".attention." in key else int(match.group(1))

    downs = [p for direction, _, _, _, p in seen if direction == "down"]
    sent = {k for p in downs for k in p if norm_of(k) is not None}
    assert {k for k in sent if k.startswith(FFN)} and {norm_of(k) for k in sent if k.startswith(FFN)} == {
        1,
        2,
    }
    assert {norm_of(k) for k in sent if k.startswith(FROZEN)} == {0, 3}
    state = load_checkpoint(latest_checkpoint(tmp_path))["algorithm"]  # type: ignore[arg-type]
    full, _ = load_encoder_classifier(cfg.model.name, 24, device="cpu", seed=cfg.seed)
    reference = {n: p.detach().numpy() for n, p in full.named_parameters()}
    norms = {k: norm_of(k) for k in state["ffn"] if norm_of(k) is not None}
    assert set(norms.values()) == {1, 2}
    assert all(not np.array_equal(state["ffn"][k], reference[k]) for k in norms)


def test_distilling_the_norms_of_a_model_without_one_after_its_ffn_names_the_key(tmp_path: Path) -> None:
    from fedtune.config import ConfigError

    cfg = tiny_config("fedpft", "model.name=tiny-llama-L4-H32", "fedpft.distill_norms=true")

    with pytest.raises(ConfigError, match=r"fedpft\.distill_norms"):
        quiet_runner(cfg, tmp_path / "run").run()

    assert not (tmp_path / "run" / "checkpoints").exists() or not any(
        (tmp_path / "run" / "checkpoints").iterdir()
    )


def test_distilling_on_every_built_in_public_split(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``fedpft.public_dataset: all``: the general corpus of every built-in public split, whatever the
    task of each (only their texts are read)."""

    from fedtune.data import loaders
    from fedtune.data.builtin import list_builtin, load_all_public

    corpus = load_all_public()
    public = {info.name: info.splits["public"] for info in list_builtin() if "public" in info.splits}
    assert len(corpus) == sum(public.values()) and len({r.category for r in corpus}) > 10
    served: list[int] = []
    monkeypatch.setattr(loaders, "load_all_public", lambda: served.append(len(corpus)) or corpus)
    cfg = tiny_config("fedpft", "fed.rounds=1", "fedpft.public_dataset=all", "fedpft.public_examples=32")
    quiet_runner(cfg, tmp_path / "run").run()
    assert served == [len(corpus)]
    info = json.loads((tmp_path / "run" / "artifacts" / "fedpft.json").read_text())
    assert info["distillation"][0]["round"] == 0.0 and info["distillation"][0]["steps"] > 0
