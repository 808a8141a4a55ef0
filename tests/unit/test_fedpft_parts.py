"""FedPFT's parts: what trains, what is sent once, what is re-sent; FedOT's kept layers."""

from __future__ import annotations

import pytest

from fedtune.algorithms.fedpft.wire import (
    Layout,
    distilled_parameters,
    frozen_parameters,
    kept_layers,
    tuned_parameters,
    with_lora,
)
from fedtune.config import LoraConfig
from fedtune.models.ffn import build_submodel, ffn_widths, select_neurons
from fedtune.models.layers import truncate_layers
from fedtune.models.loading import load_encoder_classifier

LORA = LoraConfig(r=4, alpha=8, dropout=0.0)


def test_fedot_keeps_the_edges_and_a_uniform_share_of_the_middle() -> None:
    assert kept_layers(6, 1, 0.5) == (0, 1, 4, 5)
    assert kept_layers(4, 1, 0.5) == (0, 1, 3)
    assert kept_layers(12, 2, 0.0) == tuple(range(12))


@pytest.mark.parametrize("name", ["tiny-bert-L4-H32", "tiny-llama-L4-H32"])
def test_tuned_frozen_and_distilled_split_every_parameter_once(name: str) -> None:
    base, _ = load_encoder_classifier(name, 3, device="cpu")
    sub = build_submodel(base, select_neurons(base, 0.5, [0, -1]))
    widths = ffn_widths(sub)
    layout = Layout(4, (0, 1, 2, 3), tuple(widths[i] for i in range(4)), (1, 2))
    model = with_lora(sub, LORA, 0)

    tuned, frozen = tuned_parameters(model, layout), frozen_parameters(model, layout)
    distilled = distilled_parameters(model, layout)

    names = [set(tuned), set(frozen), set(distilled)]
    assert not (names[0] & names[1] or names[0] & names[2] or names[1] & names[2])
    every = {id(p) for p in model.parameters()}
    assert {id(p) for group in (tuned, frozen, distilled) for p in group.values()} == every
    assert all("lora_" in k or k.startswith(("classifier.", "score.")) for k in tuned)
    assert {k.split(".")[0] for k in tuned if "lora_" not in k} <= {"classifier", "score"}
    assert distilled and all(".1." in k or ".2." in k for k in distilled)


def test_layer_drop_keys_use_the_original_layer_indices() -> None:
    base, _ = load_encoder_classifier("tiny-bert-L4-H32", 2, device="cpu")
    emulator = with_lora(truncate_layers(base, [0, 1, 3]), LORA, 0)
    layout = Layout(4, (0, 1, 3), (64, 64, 64))

    keys = set(tuned_parameters(emulator, layout))

    assert any(".layer.3." in k for k in keys) and not any(".layer.2." in k for k in keys)
    full_keys = set(tuned_parameters(with_lora(base, LORA, 0)))
    assert keys < full_keys


def test_fedot_without_an_adapter_layer_is_a_config_error() -> None:
    from pydantic import ValidationError

    from fedtune.algorithms.fedpft.config import FedPFTConfig

    with pytest.raises(ValidationError, match="edge_layers 0 leaves FedOT no adapter"):
        FedPFTConfig(submodel="layerdrop", edge_layers=0)
    assert FedPFTConfig(submodel="layerdrop", edge_layers=0, emulator_lora=True).emulator_lora


def test_lora_targets_the_attention_of_roberta_and_gemma3() -> None:
    from tests.unit.test_ffn_surgery import gemma_classifier, roberta_classifier

    for make, per_layer in ((roberta_classifier, 4), (gemma_classifier, 4)):
        model = with_lora(make(), LORA, 0)
        lora = [k for k in tuned_parameters(model) if "lora_A" in k]
        assert len(lora) == 3 * per_layer, make.__name__
        assert not [k for k in lora if "mlp" in k or "intermediate" in k]


@pytest.mark.parametrize(
    ("name", "targets"), [("tiny-bert-L4-H32", ["query"]), ("tiny-llama-L4-H32", ["v_proj"])]
)
def test_an_explicit_lora_target_list_replaces_the_attention_default(name: str, targets: list[str]) -> None:
    base, _ = load_encoder_classifier(name, 2, device="cpu")
    default = {k for k in tuned_parameters(with_lora(base, LORA, 0)) if "lora_A" in k}
    base, _ = load_encoder_classifier(name, 2, device="cpu")
    explicit = LoraConfig(r=4, alpha=8, dropout=0.0, target_modules=targets)
    chosen = {k for k in tuned_parameters(with_lora(base, explicit, 0)) if "lora_A" in k}

    assert len(default) == 4 * 4  # auto: q, k, v, o in each of the 4 layers
    assert len(chosen) == 4 and all(f".{targets[0]}." in k for k in chosen)
    assert chosen < default


def test_an_empty_label_list_is_an_error_not_unset() -> None:
    from fedtune.config import ConfigError
    from tests.integration.helpers import tiny_config

    with pytest.raises(ConfigError, match=r"fedpft\.labels"):
        tiny_config("fedpft", "fedpft.labels=[]")


def test_the_distillations_see_a_pairs_segment_ids() -> None:
    """Public pair records keep their segment ids into the hidden states both distillations (and the
    clients' APoZ counts) read."""
    import torch

    from fedtune.algorithms.fedpft.distill import public_batches
    from fedtune.data.records import Record
    from fedtune.models.tiny import tiny_model
    from fedtune.train.ffn_distill import _hidden_states
    from tests.unit.test_classify import pair_tokenizer

    tokenizer = pair_tokenizer()
    model, _ = tiny_model("bert", tokenizer=tokenizer)
    records = [Record("ab", "x", input="cde")]

    (batch,) = public_batches(records, tokenizer, max_length=64, batch_size=1, count=None, seed=0)

    direct = tokenizer(["ab"], ["cde"], return_tensors="pt")
    torch.testing.assert_close(batch["token_type_ids"], direct["token_type_ids"])
    with torch.no_grad():
        expected = model.base_model(**direct, output_hidden_states=True).hidden_states
        torch.testing.assert_close(_hidden_states(model, batch)[-1], expected[-1])
