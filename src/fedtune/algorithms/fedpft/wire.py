"""What FedPFT puts on the wire: the client model's layout and its parts -- what trains, what is
frozen, what is re-sent -- keyed the same everywhere.

- ``fit`` (server -> client): ``tuned/`` the global LoRA + head, ``layout/`` the client model's
  layout, and the parts the client does not hold: ``frozen/`` (embeddings, attention, norms, whole
  FFNs; with the architecture as ``arch``; once) and ``ffn/`` (the compressed layers' FFNs; again
  after each distillation). Reply: ``tuned/`` and the fit statistics (``local.REPLY_SCALARS``).
- ``apoz`` (server -> client): as ``fit``; reply ``apoz/<position>`` (float32 [width], the count of
  non-positive activations of each neuron of the layer at that position) and ``positions``.

Every state is keyed by the full model's parameter names (peft wrapper removed) with *original*
layer indices, so the LoRA + head a client trains on a sub-model (same layers, fewer FFN neurons) or
on a layer-dropped emulator plug into the full model by name. The LoRA goes on the attention
projections (``lora.target_modules``; ``auto``: q, k, v, o as ``ATTENTION_TARGETS`` names them).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch import nn

from fedtune.algorithms.fedpft.config import FedPFTConfig
from fedtune.algorithms.fedpft.maths import adapter_layers
from fedtune.algorithms.local import REPLY_SCALARS
from fedtune.config import ConfigError, LoraConfig
from fedtune.fl.broadcast import ARCH, VersionedBroadcast, sent_parts
from fedtune.fl.payload import Payload, arrays
from fedtune.fl.validation import ReplySpec
from fedtune.models.ffn import build_submodel, ffn_layers, select_neurons
from fedtune.models.ffn import ffn_parameters as ffn_module_parameters
from fedtune.models.layers import truncate_layers
from fedtune.models.lora import build_lora, lora_targets
from fedtune.models.surgery import (
    layer_index,
    layer_parameters,
    layer_pattern,
    num_decoder_layers,
    relabel,
    uniform_drop,
    unwrap,
)

TUNED = "tuned/"
FROZEN = "frozen/"
FFN = "ffn/"
LAYOUT = "layout/"
APOZ = "apoz/"

HEAD_PREFIXES = ("classifier.", "score.")
"""BERT's and the decoders' sequence-classification heads (transformers' names)."""
ATTENTION_TARGETS = {  # the default of ``lora.target_modules: auto``
    "bert": ["query", "key", "value", "attention.output.dense"],
    "roberta": ["query", "key", "value", "attention.output.dense"],
    "llama": ["q_proj", "k_proj", "v_proj", "o_proj"],
    "qwen2": ["q_proj", "k_proj", "v_proj", "o_proj"],
    "gemma3_text": ["q_proj", "k_proj", "v_proj", "o_proj"],
}


@dataclass(frozen=True)
class Layout:
    """Which original layers the client model holds, each held layer's FFN width, the positions of
    the layers whose FFN is narrower than the full model's (the ones the distillations train), the
    original layers whose attention LoRA trains (None: every held layer; FedOT: its adapter), and
    whether the compressed layers' FFN output norms train with their FFNs (``fedpft.distill_norms``)."""

    num_layers: int
    layers: tuple[int, ...]
    widths: tuple[int, ...]
    compressed: tuple[int, ...] = ()
    tuned: tuple[int, ...] | None = None
    norms: bool = False

    def positions(self) -> dict[int, int]:
        """Original layer index -> position in the client model."""
        return {layer: position for position, layer in enumerate(self.layers)}


def broadcast_parts(distilled: bool) -> VersionedBroadcast:
    """The parts of the client model that travel, by version: "frozen" once; "ffn" (the compressed
    FFNs) again after each distillation, only when there is one (without, nothing changes after setup)."""
    broadcast = VersionedBroadcast(("frozen", "ffn") if distilled else ("frozen",))
    broadcast.set_version("frozen", 1)
    return broadcast


def layout_payload(layout: Layout) -> Payload:
    return {
        LAYOUT + "num_layers": layout.num_layers,
        LAYOUT + "layers": np.asarray(layout.layers, dtype=np.int32),
        LAYOUT + "widths": np.asarray(layout.widths, dtype=np.int32),
        LAYOUT + "compressed": np.asarray(layout.compressed, dtype=np.int32),
        **({} if layout.tuned is None else {LAYOUT + "tuned": np.asarray(layout.tuned, dtype=np.int32)}),
        **({LAYOUT + "norms": 1} if layout.norms else {}),
    }


def layout_from(msg: Payload) -> Layout:
    def ints(key: str) -> tuple[int, ...]:
        return tuple(int(i) for i in np.asarray(msg[LAYOUT + key]).tolist())

    tuned = ints("tuned") if LAYOUT + "tuned" in msg else None
    norms = bool(int(msg.get(LAYOUT + "norms", 0)))
    return Layout(
        int(msg[LAYOUT + "num_layers"]), ints("layers"), ints("widths"), ints("compressed"), tuned, norms
    )


def attention_targets(model: nn.Module) -> list[str]:
    """The attention projections (q, k, v, o) of ``model``'s family."""
    model_type = unwrap(model).config.model_type
    if model_type not in ATTENTION_TARGETS:
        raise ValueError(f"fedpft: no attention projections known for model type {model_type!r}")
    return ATTENTION_TARGETS[model_type]


def with_lora(model: Any, lora: LoraConfig, seed: int) -> nn.Module:
    """The run's LoRA on ``lora.target_modules`` of every layer (``auto``: the attention projections
    q, k, v, o); the head is trained directly."""
    targets = lora_targets(model, lora, defaults=attention_targets)
    return build_lora(model, lora, seed=seed, target_modules=targets, task_type=None)


def kept_layers(num_layers: int, edge: int, drop: float) -> tuple[int, ...]:
    """FedOT's emulator layers: the first and last ``edge`` layers whole, a uniform share of the rest."""
    middle = list(range(edge, num_layers - edge))
    return tuple(sorted(set(adapter_layers(num_layers, edge)) | set(uniform_drop(middle, drop))))


def derive_client_model(base: Any, section: FedPFTConfig) -> tuple[Any, Layout]:
    """The client model the server derives from ``base`` (``submodel``), and its layout."""
    n = num_decoder_layers(base)
    tuned: tuple[int, ...] | None = None
    if section.submodel == "ffn":
        client = build_submodel(base, select_neurons(base, section.keep_ratio, section.keep_layers))
        layers = tuple(range(n))
    elif section.submodel == "layerdrop":
        layers = kept_layers(n, section.edge_layers, section.drop)
        client = truncate_layers(base, list(layers))
        if not section.emulator_lora:  # Offsite-tuning: only the adapter at both ends trains
            tuned = adapter_layers(n, section.edge_layers)
    else:
        client, layers = copy.deepcopy(base), tuple(range(n))
    widths = tuple(ffn.width for ffn in ffn_layers(client))
    full_widths = {ffn.layer: ffn.width for ffn in ffn_layers(base)}
    compressed = tuple(pos for pos, layer in enumerate(layers) if widths[pos] < full_widths[layer])
    norms = section.distill_norms and bool(compressed)
    if norms:
        missing = sorted(set(compressed) - set(output_norm_names(client)))
        if missing:
            raise ConfigError(
                f"fedpft.distill_norms: the {unwrap(client).config.model_type} model has no norm right "
                f"after the FFN of layer {layers[missing[0]]} (BERT's output.LayerNorm, Gemma-3's "
                "post_feedforward_layernorm); set fedpft.distill_norms: false"
            )
    return client, Layout(n, layers, widths, compressed, tuned, norms)


def output_norm_names(model: nn.Module) -> dict[int, str]:
    """Layer position -> the module name (in the unwrapped model) of the norm applied right after its
    FFN's output: BERT's ``<layer>.output.LayerNorm`` (over FFN output + residual), Gemma-3's
    ``<layer>.post_feedforward_layernorm``; layers without one (Llama, Qwen2: pre-norm only) are absent."""
    base = unwrap(model)
    found: dict[int, str] = {}
    for ffn in ffn_layers(base):
        owner = ffn.output_name.rsplit(".", 1)[0]  # BERT: <layer>.output; gated: <layer>.mlp
        if owner.endswith(".output"):
            name = f"{owner}.LayerNorm"
        else:
            name = f"{owner.rsplit('.', 1)[0]}.post_feedforward_layernorm"
        try:
            base.get_submodule(name)
        except AttributeError:
            continue
        found[ffn.layer] = name
    return found


def output_norm_parameters(model: nn.Module, positions: Iterable[int]) -> dict[str, nn.Parameter]:
    """The parameters of the FFN output norms (`output_norm_names`) of the layers at ``positions``,
    keyed as the unwrapped model names them (what `distill_ffns` trains beside the FFNs)."""
    base = unwrap(model)
    names = output_norm_names(base)
    return {
        f"{names[pos]}.{n}": p
        for pos in positions
        if pos in names
        for n, p in base.get_submodule(names[pos]).named_parameters()
    }


def _original_names(model: nn.Module, layout: Layout | None) -> dict[str, nn.Parameter]:
    """Every parameter of ``model`` (peft wrapper removed) keyed with original layer indices."""
    base = unwrap(model)
    if layout is None:
        return dict(base.named_parameters())
    pattern = layer_pattern(base)
    original = dict(enumerate(layout.layers))
    return {relabel(name, pattern, original): p for name, p in base.named_parameters()}


def tuned_parameters(model: nn.Module, layout: Layout | None = None) -> dict[str, nn.Parameter]:
    """What clients train: attention LoRA (of ``layout.tuned``'s layers when set) and the task head."""
    names = _original_names(model, layout)
    if layout is None or layout.tuned is None:
        return {n: p for n, p in names.items() if "lora_" in n or n.startswith(HEAD_PREFIXES)}
    pattern, tuned = layer_pattern(unwrap(model)), set(layout.tuned)
    return {
        n: p
        for n, p in names.items()
        if n.startswith(HEAD_PREFIXES) or ("lora_" in n and layer_index(n, pattern) in tuned)
    }


def ffn_parameters(
    model: nn.Module, layout: Layout | None = None, positions: Iterable[int] | None = None
) -> dict[str, nn.Parameter]:
    """The FFN weights and biases (of the layers at ``positions`` in ``model``, default all)."""
    wanted = set(ffn_module_parameters(unwrap(model), positions))
    base_names = {id(p): n for n, p in unwrap(model).named_parameters()}
    return {k: p for k, p in _original_names(model, layout).items() if base_names[id(p)] in wanted}


def distilled_parameters(model: nn.Module, layout: Layout) -> dict[str, nn.Parameter]:
    """The compressed layers' FFNs (and with ``layout.norms`` their FFN output norms): what the
    distillations change (re-sent after each)."""
    params = ffn_parameters(model, layout, layout.compressed)
    if layout.norms:
        wanted = {id(p) for p in output_norm_parameters(model, layout.compressed).values()}
        params.update({k: p for k, p in _original_names(model, layout).items() if id(p) in wanted})
    return params


def server_parameters(model: nn.Module, layout: Layout | None) -> dict[str, nn.Parameter]:
    """What the server's distillations may have changed in the client model, for its checkpoint: every
    FFN, and the compressed layers' output norms when they train."""
    params = ffn_parameters(model, layout)
    return params if layout is None else {**params, **distilled_parameters(model, layout)}


def emulator_middle(layout: Layout, edge: int) -> tuple[int, ...]:
    """The original indices of FedOT's emulator layers between its adapters (the first and last
    ``edge`` layers): what Offsite-tuning's distillation trains."""
    adapter = set(adapter_layers(layout.num_layers, edge))
    return tuple(layer for layer in layout.layers if layer not in adapter)


def emulator_parameters(model: nn.Module, layout: Layout, edge: int) -> dict[str, nn.Parameter]:
    """Every weight of the emulator's middle layers (`emulator_middle`; their LoRA excluded), keyed
    with original indices."""
    middle = emulator_middle(layout, edge)
    return layer_parameters(unwrap(model), middle, layout.positions(), keep=lambda n: "lora_" not in n)


def emulator_outputs(layout: Layout, edge: int) -> tuple[int, int]:
    """The ``output_hidden_states`` indices Offsite-tuning's distillation compares: the input of the top
    adapter in the full model and in the emulator (the middle block's output in each)."""
    return layout.num_layers - edge, len(layout.layers) - edge


def frozen_parameters(model: nn.Module, layout: Layout) -> dict[str, nn.Parameter]:
    """Everything else but the tuned LoRA and the head: embeddings, attention, norms, pooler, whole
    FFNs, the LoRA of layers that do not train (FedOT's emulator; sent once)."""
    moving = set(tuned_parameters(model, layout)) | set(distilled_parameters(model, layout))
    return {k: p for k, p in _original_names(model, layout).items() if k not in moving}


def arrays_of(params: Mapping[str, nn.Parameter]) -> dict[str, np.ndarray]:
    """``params`` as float32 numpy copies (payload-ready)."""
    return {k: p.detach().float().cpu().numpy().copy() for k, p in params.items()}


def part_payload(part: str, client: nn.Module, layout: Layout) -> Payload:
    """A broadcast part of the client model as payload entries: "frozen" (with the architecture) or
    "ffn" (the compressed layers' FFNs)."""
    if part == "frozen":
        frozen = arrays_of(frozen_parameters(client, layout))
        entries: Payload = {FROZEN + k: v for k, v in frozen.items()}
        entries[ARCH] = unwrap(client).config.to_json_string(use_diff=False)
        return entries
    return {FFN + k: v for k, v in arrays_of(distilled_parameters(client, layout)).items()}


def submodel_traffic(messages: Iterable[Payload], wire_dtype: str) -> tuple[int, int]:
    """How many of ``messages`` carry a part of the client model, and those parts' bytes as sent (fp16
    under ``fed.wire_dtype`` fp16)."""
    return sent_parts(messages, (FFN, FROZEN), wire_dtype)


def fit_spec(
    state: Mapping[str, np.ndarray], norm_bound: float | None, example_limits: Mapping[str, int]
) -> ReplySpec:
    """A ``fit`` reply: ``tuned/`` shaped like ``state`` (norm-bounded) and the fit statistics."""
    return ReplySpec.like(
        {TUNED + k: v for k, v in state.items()},
        scalars=REPLY_SCALARS,
        norm_bound=norm_bound,
        example_limits=example_limits,
    )


def apoz_spec(layout: Layout) -> ReplySpec:
    """An ``apoz`` reply: ``apoz/<position>`` [width] for every layer of the client model, ``positions``."""
    template = {f"{APOZ}{pos}": np.zeros(w, np.float32) for pos, w in enumerate(layout.widths)}
    return ReplySpec.like(template, scalars={"positions": int}, reference=False)


def apoz_counts_of(reply: Payload) -> dict[int, tuple[np.ndarray, int]]:
    """An ``apoz`` reply as position -> (non-positive counts [width], token positions counted)."""
    return {int(k): (np.asarray(v), int(reply["positions"])) for k, v in arrays(reply, APOZ).items()}


def apoz_problem(reply: Payload, max_positions: int) -> str | None:
    """Why an ``apoz`` reply cannot be what it claims, or None: ``positions`` is a token count in
    [1, ``max_positions``] and every neuron's count of non-positive activations lies in [0, positions]."""
    positions = int(reply["positions"])
    if not 1 <= positions <= max_positions:
        return f"apoz: positions {positions} outside [1, {max_positions}] (the tokens the client could count)"
    for key, counts in arrays(reply, APOZ).items():
        if counts.size and (float(counts.min()) < 0 or float(counts.max()) > positions):
            return f"apoz: '{APOZ}{key}' holds counts outside [0, positions = {positions}]"
    return None


def parameter_counts(full: nn.Module, client: nn.Module, layout: Layout | None) -> dict[str, int]:
    """Parameter counts: the full model, the client model, what trains, the FFNs of both."""
    return {
        "full_params": model_params(full),
        "client_params": model_params(client),
        "tuned_params": count(tuned_parameters(client, layout)),
        "full_ffn_params": count(ffn_parameters(full)),
        "client_ffn_params": count(ffn_parameters(client, layout)),
    }


def count(params: Mapping[str, nn.Parameter] | Sequence[nn.Parameter]) -> int:
    """The number of entries of ``params``."""
    values = params.values() if isinstance(params, Mapping) else params
    return int(sum(p.numel() for p in values))


def model_params(model: nn.Module) -> int:
    """``model``'s parameter count (peft wrapper removed, tied parameters once)."""
    return count(list({id(p): p for p in unwrap(model).parameters()}.values()))
