"""FFN neuron surgery for FedPFT (Peng et al., IJCAI 2024, sec. 3.4): saliency, selection, sub-models.

A transformer layer's FFN is ``FFN(x) = W_out act(W_in x + b_in) + b_out``; neuron ``i`` is row ``i`` of
every input projection (``W_in``, torch layout ``[I, H]``) and column ``i`` of the output projection
(``W_out``, ``[H, I]``). Its saliency (eq. 8) is the sum of its squared weights, row and column. The
sub-FM keeps the most salient neurons of each layer's FFN; attention, embeddings, norms and head are
untouched, so every non-FFN parameter has the same name and shape in the FM and the sub-FM.

Layouts (`ffn_layers`), found by module name in the model without its peft wrapper:
- BERT-style encoders: ``encoder.layer.<i>.intermediate.dense`` (input) and
  ``encoder.layer.<i>.output.dense`` (output);
- gated decoders (Llama, Qwen2, Gemma, Gemma 3): ``layers.<i>.mlp.{gate_proj, up_proj}`` (inputs,
  ``act(gate) * up``) and ``layers.<i>.mlp.down_proj`` (output), under any prefix (``model.``,
  ``model.language_model.``), for CausalLM and ForSequenceClassification heads alike.

A sub-model's FFN widths may differ from layer to layer (kept layers stay whole) while its config
still states the full ``intermediate_size``: a client rebuilds the sub-model from the FM's config with
`resize_ffn` and the widths of `ffn_widths`, then loads the received weights.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from fedtune.models.loading import ModelError
from fedtune.models.surgery import load_parameters, unwrap


class FFNError(ModelError):
    """An FFN layout, neuron selection or FFN state that does not fit the model."""


@dataclass(frozen=True)
class FFN:
    """One layer's FFN: the projections whose output rows are the neurons, and the one whose input
    columns are. Names are dotted module names inside the model without its peft wrapper."""

    layer: int
    inputs: list[nn.Linear]
    output: nn.Linear
    input_names: list[str]
    output_name: str

    @property
    def width(self) -> int:
        """The number of neurons ``I``."""
        return self.output.in_features

    def modules(self) -> dict[str, nn.Linear]:
        """Module name -> Linear, inputs first."""
        return dict(zip([*self.input_names, self.output_name], [*self.inputs, self.output], strict=True))


_GATED = re.compile(r"(?:^|.*\.)layers\.(\d+)\.mlp")
_ENCODER = re.compile(r"(?:^|.*\.)encoder\.layer\.(\d+)")
_GATED_INPUTS = ("gate_proj", "up_proj")


def _linear(module: nn.Module, path: str, owner: str) -> nn.Linear:
    found = module.get_submodule(path)
    if type(found) is not nn.Linear:
        raise FFNError(
            f"{owner}.{path} is a {type(found).__name__}, not a plain nn.Linear: FFN surgery needs the "
            "model without LoRA (or any other wrapper) on its FFN"
        )
    return found


def _gated_ffn(name: str, module: nn.Module) -> FFN | None:
    match = _GATED.fullmatch(name)
    if match is None or not all(hasattr(module, a) for a in (*_GATED_INPUTS, "down_proj")):
        return None
    return FFN(
        layer=int(match.group(1)),
        inputs=[_linear(module, p, name) for p in _GATED_INPUTS],
        output=_linear(module, "down_proj", name),
        input_names=[f"{name}.{p}" for p in _GATED_INPUTS],
        output_name=f"{name}.down_proj",
    )


def _encoder_ffn(name: str, module: nn.Module) -> FFN | None:
    match = _ENCODER.fullmatch(name)
    if match is None or not (hasattr(module, "intermediate") and hasattr(module, "output")):
        return None
    return FFN(
        layer=int(match.group(1)),
        inputs=[_linear(module, "intermediate.dense", name)],
        output=_linear(module, "output.dense", name),
        input_names=[f"{name}.intermediate.dense"],
        output_name=f"{name}.output.dense",
    )


def ffn_layers(model: nn.Module) -> list[FFN]:
    """Every layer's FFN, in layer order; ``model`` may be peft-wrapped (names are the unwrapped ones)."""
    base = unwrap(model)
    found: dict[int, FFN] = {}
    for name, module in base.named_modules():
        ffn = _gated_ffn(name, module) or _encoder_ffn(name, module)
        if ffn is None:
            continue
        if ffn.layer in found:
            raise FFNError(
                f"two FFNs claim layer {ffn.layer}: {found[ffn.layer].output_name}, {ffn.output_name}"
            )
        found[ffn.layer] = ffn
    if not found or sorted(found) != list(range(len(found))):
        model_type = getattr(getattr(base, "config", None), "model_type", "?")
        raise FFNError(
            f"no FFN layout known for model type {model_type!r} ({type(base).__name__}): expected "
            "layers.<i>.mlp.{gate_proj,up_proj,down_proj} (Llama, Qwen2, Gemma) or "
            "encoder.layer.<i>.{intermediate,output}.dense (BERT)"
        )
    return [found[i] for i in sorted(found)]


def ffn_widths(model: nn.Module) -> dict[int, int]:
    """Layer -> number of FFN neurons."""
    return {ffn.layer: ffn.width for ffn in ffn_layers(model)}


def neuron_saliency(ffn: FFN) -> Tensor:
    """Eq. 8: ``sum_j W_in[i, j]^2`` over every input projection ``+ sum_j W_out[j, i]^2``: [I], fp32."""
    with torch.no_grad():
        saliency = ffn.output.weight.float().pow(2).sum(dim=0)
        for projection in ffn.inputs:
            saliency += projection.weight.float().pow(2).sum(dim=1)
    return saliency


def top_neurons(saliency: np.ndarray, keep: int) -> np.ndarray:
    """Sorted indices of the ``keep`` largest entries of ``saliency`` [I]; ties -> lower index first."""
    order = np.argsort(-saliency, kind="stable")
    return np.sort(order[:keep]).astype(np.int64)


def _whole_layers(keep_layers: Iterable[int], num_layers: int) -> set[int]:
    bad = [k for k in keep_layers if not -num_layers <= k < num_layers]
    if bad:
        raise FFNError(f"keep_layers {bad} out of range for a model of {num_layers} layers")
    return {k % num_layers for k in keep_layers}


def select_neurons(model: nn.Module, keep_ratio: float, keep_layers: Sequence[int]) -> dict[int, np.ndarray]:
    """Layer -> sorted indices [k] of the ``k = max(1, round(keep_ratio * I))`` most salient neurons.

    Layers in ``keep_layers`` (negative indices count from the end) keep all their neurons.
    """
    if not 0.0 < keep_ratio <= 1.0:
        raise FFNError(f"keep_ratio must be in (0, 1], got {keep_ratio}")
    ffns = ffn_layers(model)
    whole = _whole_layers(keep_layers, len(ffns))
    kept: dict[int, np.ndarray] = {}
    for ffn in ffns:
        keep = ffn.width if ffn.layer in whole else max(1, round(keep_ratio * ffn.width))
        kept[ffn.layer] = top_neurons(neuron_saliency(ffn).cpu().numpy(), keep)
    return kept


def _check_kept(ffns: Sequence[FFN], kept: Mapping[int, np.ndarray]) -> None:
    if set(kept) != {ffn.layer for ffn in ffns}:
        raise FFNError(f"kept neurons given for layers {sorted(kept)}, the model has {len(ffns)} layers")
    for ffn in ffns:
        indices = np.asarray(kept[ffn.layer])
        valid = indices.ndim == 1 and indices.size > 0 and bool(np.all(np.diff(indices) > 0))
        if not valid or indices[0] < 0 or indices[-1] >= ffn.width:
            raise FFNError(
                f"layer {ffn.layer}: kept neurons must be non-empty, sorted, unique and in [0, {ffn.width})"
            )


def _new_linear(like: nn.Linear, in_features: int, out_features: int) -> nn.Linear:
    """A Linear of ``like``'s dtype, device, bias and requires_grad, holding zeros."""
    weight = like.weight
    new = nn.Linear(in_features, out_features, bias=like.bias is not None, device="meta", dtype=weight.dtype)
    new = new.to_empty(device=weight.device)
    with torch.no_grad():
        for param in new.parameters():
            param.zero_()
    new.requires_grad_(weight.requires_grad)
    return new


def _sliced(linear: nn.Linear, index: Tensor, rows: bool) -> nn.Linear:
    """``linear`` keeping output rows ``index`` (with their bias) or input columns ``index``."""
    index = index.to(linear.weight.device)
    if rows:
        new = _new_linear(linear, linear.in_features, len(index))
    else:
        new = _new_linear(linear, len(index), linear.out_features)
    with torch.no_grad():
        new.weight.copy_(linear.weight[index] if rows else linear.weight[:, index])
        if linear.bias is not None and new.bias is not None:
            new.bias.copy_(linear.bias[index] if rows else linear.bias)
    return new


def _replace(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, attribute = name.rpartition(".")
    setattr(model.get_submodule(parent), attribute, module)


def build_submodel(model: nn.Module, kept: Mapping[int, np.ndarray]) -> Any:
    """A deep copy of ``model`` whose FFNs hold only the ``kept`` neurons (layer -> sorted indices).

    ``model`` must not be peft-wrapped: attach LoRA to the sub-model afterwards. Non-FFN parameters
    keep their names and shapes; read the new widths with `ffn_widths`.
    """
    if unwrap(model) is not model:
        raise FFNError("build_submodel takes the model without its peft wrapper; attach LoRA afterwards")
    submodel = copy.deepcopy(model)
    ffns = ffn_layers(submodel)
    _check_kept(ffns, kept)
    for ffn in ffns:
        index = torch.from_numpy(np.asarray(kept[ffn.layer], dtype=np.int64))
        for name, projection in zip(ffn.input_names, ffn.inputs, strict=True):
            _replace(submodel, name, _sliced(projection, index, rows=True))
        _replace(submodel, ffn.output_name, _sliced(ffn.output, index, rows=False))
    return submodel


def resize_ffn(model: nn.Module, widths: Mapping[int, int]) -> None:
    """In place: give layer ``l``'s FFN ``widths[l]`` neurons (fresh Linear modules holding zeros)."""
    ffns = ffn_layers(model)
    if set(widths) != {ffn.layer for ffn in ffns} or min(widths.values()) < 1:
        raise FFNError(f"widths {dict(widths)} do not give every one of the {len(ffns)} layers >= 1 neuron")
    base = unwrap(model)
    for ffn in ffns:
        width = widths[ffn.layer]
        for name, projection in zip(ffn.input_names, ffn.inputs, strict=True):
            _replace(base, name, _new_linear(projection, projection.in_features, width))
        _replace(base, ffn.output_name, _new_linear(ffn.output, width, ffn.output.out_features))


def ffn_parameters(model: nn.Module, layers: Iterable[int] | None = None) -> dict[str, nn.Parameter]:
    """The FFN weights and biases of ``layers`` (default all), keyed as the unwrapped model names them."""
    chosen = None if layers is None else set(layers)
    params: dict[str, nn.Parameter] = {}
    for ffn in ffn_layers(model):
        if chosen is not None and ffn.layer not in chosen:
            continue
        for module_name, module in ffn.modules().items():
            params.update({f"{module_name}.{n}": p for n, p in module.named_parameters()})
    return params


def ffn_parameter_names(model: nn.Module) -> set[str]:
    """Names of every FFN parameter (see `ffn_parameters`)."""
    return set(ffn_parameters(model))


def ffn_state(model: nn.Module, layers: Iterable[int] | None = None) -> dict[str, np.ndarray]:
    """`ffn_parameters` as float32 numpy copies (payload-ready)."""
    return {
        name: param.detach().float().cpu().numpy().copy()
        for name, param in ffn_parameters(model, layers).items()
    }


def load_ffn_state(
    model: nn.Module, state: Mapping[str, Any], what: str, layers: Iterable[int] | None = None
) -> None:
    """Copy ``state`` (from `ffn_state`) into the FFNs of ``layers``: same keys and shapes, or `FFNError`."""
    targets = ffn_parameters(model, layers)
    try:
        load_parameters(targets, state, what)
    except (KeyError, ValueError) as err:
        raise FFNError(str(err.args[0])) from err
