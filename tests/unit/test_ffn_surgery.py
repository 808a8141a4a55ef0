"""FFN neuron surgery (FedPFT sec. 3.4): saliency, selection, sub-models, resizing and FFN state."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
from torch import nn

from fedtune.models.ffn import (
    FFNError,
    build_submodel,
    ffn_layers,
    ffn_parameter_names,
    ffn_state,
    ffn_widths,
    load_ffn_state,
    neuron_saliency,
    resize_ffn,
    select_neurons,
    top_neurons,
)
from fedtune.models.loading import load_causal_lm, load_encoder_classifier
from fedtune.models.lora import attach_lora


def llama(name: str = "tiny-llama", seed: int = 0) -> nn.Module:
    return load_causal_lm(name, device="cpu", seed=seed)[0]


def bert(seed: int = 0) -> nn.Module:
    return load_encoder_classifier("tiny-bert", 3, device="cpu", seed=seed)[0]


def llama_classifier() -> nn.Module:
    return load_encoder_classifier("tiny-llama", 3, device="cpu")[0]


def tiny_classifier(config_class: type, model_class: type, **extra: object) -> nn.Module:
    """A tiny random 3-class classifier: 3 layers, width 32, FFN 64, 2 heads, 256 tokens."""
    config = config_class(
        vocab_size=256,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=2,
        num_labels=3,
        **extra,
    )
    torch.manual_seed(0)
    return model_class(config).eval()


def gemma_classifier() -> nn.Module:
    """Gemma-3 text: a gated FFN with GELU-tanh, sliding-window layers."""
    from transformers import Gemma3TextConfig, Gemma3TextForSequenceClassification

    extra = {"num_key_value_heads": 1, "head_dim": 16, "max_position_embeddings": 64, "sliding_window": 4}
    return tiny_classifier(Gemma3TextConfig, Gemma3TextForSequenceClassification, pad_token_id=0, **extra)


def roberta_classifier() -> nn.Module:
    """RoBERTa (the paper's second encoder): BERT's FFN layout."""
    from transformers import RobertaConfig, RobertaForSequenceClassification

    return tiny_classifier(
        RobertaConfig, RobertaForSequenceClassification, max_position_embeddings=72, pad_token_id=1
    )


def batch(model: nn.Module) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, 250, (2, 7), generator=generator)
    attention_mask = torch.ones(2, 7, dtype=torch.long)
    attention_mask[1, 5:] = 0
    input_ids[1, 5:] = model.config.pad_token_id
    return {"input_ids": input_ids, "attention_mask": attention_mask}


def logits(model: nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs).logits


def non_ffn_shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    names = ffn_parameter_names(model)
    return {n: tuple(p.shape) for n, p in model.named_parameters() if n not in names}


def test_layouts_of_bert_and_gated_decoders() -> None:
    bert_ffn = ffn_layers(bert())[1]
    assert bert_ffn.input_names == ["bert.encoder.layer.1.intermediate.dense"]
    assert bert_ffn.output_name == "bert.encoder.layer.1.output.dense"
    assert bert_ffn.width == 128
    llama_ffn = ffn_layers(llama_classifier())[0]
    assert llama_ffn.input_names == ["model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj"]
    assert llama_ffn.output_name == "model.layers.0.mlp.down_proj" and llama_ffn.width == 64
    assert [f.layer for f in ffn_layers(llama("tiny-qwen2-L3-H32"))] == [0, 1, 2]


def test_saliency_and_selection_on_hand_set_weights() -> None:
    model = llama()
    ffn = ffn_layers(model)[0]
    with torch.no_grad():
        for projection in [*ffn.inputs, ffn.output]:
            projection.weight.zero_()
        ffn.inputs[0].weight[0, 0] = 1.0  # gate row 0
        ffn.inputs[1].weight[2, 1] = 2.0  # up row 2
        ffn.output.weight[5, 3] = 3.0  # down column 3
        ffn.output.weight[0, 2] = 1.0  # down column 2
    saliency = neuron_saliency(ffn)
    assert saliency.shape == (64,)
    assert saliency[:4].tolist() == [1.0, 0.0, 5.0, 9.0] and saliency[4:].abs().sum() == 0
    # 3 of 64 -> the three salient neurons; 4 of 64 -> the tie among zeros goes to neuron 1.
    assert select_neurons(model, 3 / 64, ())[0].tolist() == [0, 2, 3]
    assert select_neurons(model, 4 / 64, ())[0].tolist() == [0, 1, 2, 3]


def test_top_neurons_ties_go_to_the_lower_index() -> None:
    saliency = np.array([1.0, 2.0, 2.0, 1.0, 0.5])
    assert top_neurons(saliency, 2).tolist() == [1, 2]
    assert top_neurons(saliency, 3).tolist() == [0, 1, 2]
    assert top_neurons(np.zeros(4), 2).tolist() == [0, 1]


def test_keep_layers_keep_whole_layers_and_ratio_is_validated() -> None:
    model = llama("tiny-llama-L3-H32")
    kept = select_neurons(model, 0.5, (0, -1))
    assert [len(kept[i]) for i in range(3)] == [64, 32, 64]
    assert kept[0].tolist() == list(range(64))
    assert all(np.all(np.diff(k) > 0) for k in kept.values())
    assert [len(k) for k in select_neurons(model, 0.001, ()).values()] == [1, 1, 1]
    for bad in (0.0, 1.5):
        with pytest.raises(FFNError, match="keep_ratio"):
            select_neurons(model, bad, ())
    with pytest.raises(FFNError, match="out of range"):
        select_neurons(model, 0.5, (3,))


@pytest.mark.parametrize("make", [bert, llama, llama_classifier, gemma_classifier, roberta_classifier])
def test_keep_ratio_one_gives_identical_logits(make: Callable[[], nn.Module]) -> None:
    full = make()
    sub = build_submodel(full, select_neurons(full, 1.0, ()))
    inputs = batch(full)
    assert torch.equal(logits(sub, inputs), logits(full, inputs))
    assert all(f.output is not s.output for f, s in zip(ffn_layers(full), ffn_layers(sub), strict=True))


@pytest.mark.parametrize("make", [bert, llama, gemma_classifier, roberta_classifier])
def test_removing_neurons_with_zero_output_columns_changes_nothing(make: Callable[[], nn.Module]) -> None:
    full = make()
    rng = np.random.default_rng(0)
    kept = {}
    for ffn in ffn_layers(full):
        removed = rng.choice(ffn.width, size=ffn.width // 3, replace=False)
        with torch.no_grad():
            ffn.output.weight[:, torch.from_numpy(removed)] = 0.0
        kept[ffn.layer] = np.setdiff1d(np.arange(ffn.width), removed)
    sub = build_submodel(full, kept)
    assert ffn_widths(sub) == {f.layer: f.width - f.width // 3 for f in ffn_layers(full)}
    inputs = batch(full)
    torch.testing.assert_close(logits(sub, inputs), logits(full, inputs), atol=1e-5, rtol=1e-5)


def test_sub_model_keeps_non_ffn_names_and_shapes() -> None:
    for full in (bert(), llama()):
        sub = build_submodel(full, select_neurons(full, 0.5, (0,)))
        assert non_ffn_shapes(sub) == non_ffn_shapes(full)
        assert ffn_parameter_names(sub) == ffn_parameter_names(full)
        assert ffn_widths(full) == {0: ffn_layers(full)[0].width, 1: ffn_layers(full)[1].width}
        assert ffn_widths(sub)[1] == ffn_widths(full)[1] // 2


def test_resize_and_load_reproduce_the_sub_model() -> None:
    full = llama("tiny-llama-L3-H32")
    sub = build_submodel(full, select_neurons(full, 0.25, (0, -1)))
    client = llama("tiny-llama-L3-H32", seed=1)
    resize_ffn(client, ffn_widths(sub))
    assert ffn_widths(client) == {0: 64, 1: 16, 2: 64}
    load_ffn_state(client, ffn_state(sub), "sub-model FFN")
    names = ffn_parameter_names(sub)
    others = {k: v for k, v in sub.state_dict().items() if k not in names}
    missing, unexpected = client.load_state_dict(others, strict=False)
    assert set(missing) == names and not unexpected
    inputs = batch(full)
    assert torch.equal(logits(client, inputs), logits(sub, inputs))


def test_ffn_state_layers_and_dtype() -> None:
    model = bert()
    state = ffn_state(model, layers=[1])
    assert sorted(state) == [
        "bert.encoder.layer.1.intermediate.dense.bias",
        "bert.encoder.layer.1.intermediate.dense.weight",
        "bert.encoder.layer.1.output.dense.bias",
        "bert.encoder.layer.1.output.dense.weight",
    ]
    assert state["bert.encoder.layer.1.output.dense.weight"].shape == (32, 128)
    assert all(v.dtype == np.float32 for v in state.values())


def test_peft_wrapped_models_use_the_unwrapped_names() -> None:
    model = bert()
    names = ffn_parameter_names(model)
    wrapped = attach_lora(model, r=2, alpha=4, dropout=0.0, task_type="SEQ_CLS")
    assert ffn_parameter_names(wrapped) == names
    with pytest.raises(FFNError, match="without its peft wrapper"):
        build_submodel(wrapped, select_neurons(wrapped, 0.5, ()))
    on_ffn = attach_lora(llama(), r=2, alpha=4, dropout=0.0, target_modules=["gate_proj"])
    with pytest.raises(FFNError, match=r"not a plain nn\.Linear"):
        ffn_layers(on_ffn)


def test_errors_on_unknown_layout_and_bad_state() -> None:
    with pytest.raises(FFNError, match="'gpt2'"):
        ffn_layers(llama("tiny-gpt2"))
    model = llama()
    state = ffn_state(model)
    renamed = dict(state)
    renamed["model.layers.9.mlp.up_proj.weight"] = renamed.pop("model.layers.0.mlp.up_proj.weight")
    with pytest.raises(FFNError, match=r"server FFN: .*model\.layers\.0\.mlp\.up_proj\.weight"):
        load_ffn_state(model, renamed, "server FFN")
    state["model.layers.1.mlp.down_proj.weight"] = np.zeros((32, 3), dtype=np.float32)
    with pytest.raises(FFNError, match=r"server FFN: key model\.layers\.1\.mlp\.down_proj\.weight has shape"):
        load_ffn_state(model, state, "server FFN")
    with pytest.raises(FFNError, match="sorted, unique"):
        build_submodel(model, {0: np.array([3, 1]), 1: np.array([0])})
    with pytest.raises(FFNError, match="layers"):
        build_submodel(model, {0: np.array([1])})
