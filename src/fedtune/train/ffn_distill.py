"""FedPFT's two distillations of a sub-FM's FFNs towards the FM (Peng et al., IJCAI 2024, sec. 3.5).

Layer-level (eq. 13): ``sum_i MSE(O_i, O'_i) + mu * sum_i ||W1 W2 - W1' W2'||_F^2`` over the layers
``i`` (outputs of every transformer layer, not the embeddings), only the sub-FM's FFNs train.
Neuron-level (eq. 14): clients count per neuron the share of token positions whose activation is
"zero" (APoZ); the server freezes the most active neurons (lowest APoZ) and re-runs the layer-level
distillation updating only the others (`ffn_grad_masks` zeroes their gradients).

Deviations and choices:
- An activation counts as zero when it is ``<= 0`` (a negative pre-activation), ReLU's APoZ carried
  over: GELU and SiLU output a small negative value there and are exactly zero in fp32 only below
  about -5.5 (GELU; never for SiLU), which the authors' exact-zero count reads (see ``fedpft``).
- The mu term is computed with gradient w.r.t. the sub-FM's weights (the official code computes it
  without, which ``mu = 0`` reproduces); it costs two ``[H, I] x [I, H]`` products per input
  projection and layer per step.
- The gated decoders' FFN has two input projections (gate, up): the weight term is summed over both.
- The output projection's bias is shared by all neurons, so it is never frozen.
- AdamW runs without weight decay so that masked (zero-gradient) entries stay bit-identical.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor, nn

from fedtune.models.ffn import FFN, ffn_layers, ffn_parameters
from fedtune.models.surgery import unwrap
from fedtune.train.optim import schedule_factor

Batch = Mapping[str, Tensor]
ApozCounts = dict[int, tuple[np.ndarray, int]]


HiddenLoss = Literal["mse", "token_relative", "layer_relative"]


def hidden_mse(
    teacher_hidden: Sequence[Tensor],
    student_hidden: Sequence[Tensor],
    attention_mask: Tensor,
    kind: HiddenLoss = "mse",
) -> Tensor:
    """Sum over layers ``i >= 1`` of the error between hidden states [B, T, H] at non-pad positions.

    ``mse`` (eq. 13): the mean squared error over positions and features. ``token_relative``: each
    position's squared error divided by the teacher's squared norm there, averaged over positions,
    so that no position outweighs the others (decoders put activations thousands of times larger
    than the rest on their first token). ``layer_relative`` (the authors' code): each layer's squared
    error over its non-pad positions divided by the teacher's squared norm over the same positions, so
    that every layer counts at its own scale. Index 0 (the embedding output of
    ``output_hidden_states``) is skipped; ``attention_mask`` [B, T]; the teacher's states are
    constants. Returns a scalar (fp32).
    """
    if len(teacher_hidden) != len(student_hidden):
        raise ValueError(f"{len(teacher_hidden)} teacher hidden states, {len(student_hidden)} student ones")
    if kind not in ("mse", "token_relative", "layer_relative"):
        raise ValueError(f"unknown hidden-state loss {kind!r}; use mse, token_relative or layer_relative")
    mask = attention_mask.to(dtype=torch.float32, device=student_hidden[0].device)
    total = student_hidden[0].new_zeros((), dtype=torch.float32)
    for teacher, student in zip(teacher_hidden[1:], student_hidden[1:], strict=True):
        target = teacher.detach().float().to(student.device)
        squared = (student.float() - target).pow(2).sum(-1)  # [B, T]
        if kind == "mse":
            total = total + (squared * mask).sum() / (mask.sum() * student.shape[-1])
        elif kind == "layer_relative":
            scale = (target.pow(2).sum(-1) * mask).sum().clamp_min(1e-12)
            total = total + (squared * mask).sum() / scale
        else:
            scale = target.pow(2).sum(-1).clamp_min(1e-12)
            total = total + (squared / scale * mask).sum() / mask.sum()
    return total


def ffn_product_gap(full_ffn: FFN, sub_ffn: FFN) -> Tensor:
    """``sum over input projections of ||W_out W_in - W_out' W_in'||_F^2``, a scalar (fp32).

    ``W_out`` [H, I] and ``W_in`` [I, H] are torch Linear weights, so ``W_out W_in`` [H, H] is the
    transpose of the paper's ``W1 W2`` (same norm). Gradient flows to the sub-FFN's weights only.
    """
    if len(full_ffn.inputs) != len(sub_ffn.inputs):
        raise ValueError(f"layer {full_ffn.layer}: the FFNs have different numbers of input projections")
    full_out = full_ffn.output.weight.detach().float()
    sub_out = sub_ffn.output.weight.float()
    gap = sub_out.new_zeros(())
    for full_in, sub_in in zip(full_ffn.inputs, sub_ffn.inputs, strict=True):
        target = (full_out @ full_in.weight.detach().float()).to(sub_out.device)
        gap = gap + (target - sub_out @ sub_in.weight.float()).pow(2).sum()
    return gap


def layer_distill_loss(
    teacher_hidden: Sequence[Tensor],
    student_hidden: Sequence[Tensor],
    attention_mask: Tensor,
    full_ffns: Sequence[FFN],
    sub_ffns: Sequence[FFN],
    mu: float,
    hidden_loss: HiddenLoss = "mse",
) -> tuple[Tensor, dict[str, float]]:
    """Eq. 13: `hidden_mse` (of kind ``hidden_loss``) + ``mu`` * the sum of `ffn_product_gap` over
    layers (skipped when mu == 0).

    Returns the scalar loss and its parts as floats (``loss``, ``hidden_mse``, ``product_gap``).
    """
    mse = hidden_mse(teacher_hidden, student_hidden, attention_mask, hidden_loss)
    loss = mse
    parts = {"hidden_mse": float(mse.detach()), "product_gap": 0.0}
    if mu != 0.0:
        if [f.layer for f in full_ffns] != [f.layer for f in sub_ffns]:
            raise ValueError("the full and the sub-model FFNs are not of the same layers")
        gap = sum(
            (ffn_product_gap(f, s) for f, s in zip(full_ffns, sub_ffns, strict=True)), mse.new_zeros(())
        )
        loss = mse + mu * gap
        parts["product_gap"] = float(gap.detach())
    parts["loss"] = float(loss.detach())
    return loss, parts


def ffn_grad_masks(sub_model: nn.Module, frozen: Mapping[int, np.ndarray]) -> dict[str, Tensor]:
    """FFN parameter name -> 0/1 mask, broadcastable to the parameter, 0 on the ``frozen`` neurons.

    ``frozen``: layer -> neuron indices in the sub-model's own numbering (absent layers: none frozen).
    Input weights [I, H] get a mask [I, 1], input biases [I] a mask [I], the output weight [H, I] a mask
    [1, I]; the output bias [H] is shared by all neurons and gets ones.
    """
    masks: dict[str, Tensor] = {}
    for ffn in ffn_layers(sub_model):
        weight = ffn.output.weight
        keep = torch.ones(ffn.width, dtype=weight.dtype, device=weight.device)
        keep[torch.as_tensor(np.asarray(frozen.get(ffn.layer, []), dtype=np.int64), device=weight.device)] = 0
        for name in ffn.input_names:
            masks[f"{name}.weight"] = keep.unsqueeze(1)
            masks[f"{name}.bias"] = keep
        masks[f"{ffn.output_name}.weight"] = keep.unsqueeze(0)
        masks[f"{ffn.output_name}.bias"] = torch.ones_like(keep[:1])
    names = set(ffn_parameters(sub_model))
    return {name: mask for name, mask in masks.items() if name in names}


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def _hidden_states(model: nn.Module, batch: Batch) -> tuple[Tensor, ...]:
    """Every layer's output of the backbone (no LM / classification head) on ``batch``; its
    ``token_type_ids`` (a pair's segment ids, for BERT-family encoders) are passed on when present."""
    device = _device(model)
    backbone = unwrap(model).base_model
    inputs = {
        key: batch[key].to(device)
        for key in ("input_ids", "attention_mask", "token_type_ids")
        if key in batch
    }
    out = backbone(**inputs, output_hidden_states=True)
    return tuple(out.hidden_states)


def _count(counts: dict[int, list[Any]], layer: int, state: dict[str, Tensor], values: Tensor) -> None:
    """Add the entries ``<= 0`` of ``values`` [B, T, I] at non-pad positions to ``counts[layer]``."""
    mask = state["mask"].to(values.device).unsqueeze(-1)
    zeros = ((values <= 0) & mask).sum(dim=(0, 1))
    counts[layer][0] += zeros.cpu().numpy().astype(np.int64)
    counts[layer][1] += int(state["mask"].sum())


def apoz_counts(model: nn.Module, batches: Sequence[Batch]) -> ApozCounts:
    """Layer -> (per-neuron count of activations ``<= 0`` [I], number of non-pad token positions).

    The activation is the FFN's nonlinearity's output: BERT's GELU(W_in x), read at the input of the
    output projection; a gated decoder's SiLU(gate) (GELU-tanh for Gemma), which is ``<= 0`` exactly
    where the gate projection's output is, read there (the product with ``up`` that multiplies
    W_out's columns has the sign of ``up`` as well, which says nothing about the neuron's activity).
    Eval mode without gradient; batches need input_ids and attention_mask (token_type_ids if any are used).
    """
    counts: dict[int, list[Any]] = {}
    state: dict[str, Tensor] = {}
    handles = []
    was_training = model.training
    try:
        for ffn in ffn_layers(model):
            counts[ffn.layer] = [np.zeros(ffn.width, dtype=np.int64), 0]
            count = functools.partial(_count, counts, ffn.layer, state)
            if len(ffn.inputs) > 1:  # gated: inputs are (gate, up)
                handles.append(ffn.inputs[0].register_forward_hook(lambda m, a, out, c=count: c(out)))
            else:
                handles.append(ffn.output.register_forward_pre_hook(lambda m, args, c=count: c(args[0])))
        model.eval()
        with torch.no_grad():
            for batch in batches:
                state["mask"] = batch["attention_mask"].bool()
                _hidden_states(model, batch)
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    return {layer: (zeros, int(positions)) for layer, (zeros, positions) in counts.items()}


def aggregate_apoz(counts: Sequence[Mapping[int, tuple[np.ndarray, int]]]) -> dict[int, np.ndarray]:
    """Layer -> APoZ [I] over all clients: summed zero counts / summed positions (token-weighted)."""
    if not counts:
        raise ValueError("no APoZ counts to aggregate")
    layers = set(counts[0])
    if any(set(c) != layers for c in counts):
        raise ValueError("clients reported APoZ counts for different layers")
    apoz: dict[int, np.ndarray] = {}
    for layer in sorted(layers):
        zeros = np.sum([np.asarray(c[layer][0], dtype=np.float64) for c in counts], axis=0)
        positions = sum(int(c[layer][1]) for c in counts)
        if positions == 0:
            raise ValueError(f"layer {layer}: no token positions counted")
        apoz[layer] = zeros / positions
    return apoz


def neurons_to_freeze(apoz: Mapping[int, np.ndarray], fraction: float) -> dict[int, np.ndarray]:
    """Layer -> sorted indices of the ``round(fraction * I)`` lowest-APoZ (most active) neurons.

    Ties go to the lower index.
    """
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"freeze fraction must be in [0, 1], got {fraction}")
    frozen: dict[int, np.ndarray] = {}
    for layer, values in apoz.items():
        order = np.argsort(np.asarray(values), kind="stable")
        frozen[layer] = np.sort(order[: round(fraction * len(order))]).astype(np.int64)
    return frozen


@dataclass(frozen=True)
class DistillStats:
    first_loss: float
    last_loss: float
    mean_loss: float
    steps: int
    seconds: float


def _optimizer(name: str, params: Sequence[nn.Parameter], lr: float) -> torch.optim.Optimizer:
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    raise ValueError(f"unknown optimizer {name!r}; use adamw or sgd")


def _distill_step(
    teacher: nn.Module,
    student: nn.Module,
    batch: Batch,
    mu: float,
    ffns: tuple[list[FFN], list[FFN]],
    hidden_loss: HiddenLoss,
    compare: tuple[int, int] | None = None,
) -> float:
    with torch.no_grad():
        teacher_hidden = _hidden_states(teacher, batch)
    student_hidden = _hidden_states(student, batch)
    if compare is not None:  # index 0 (the embeddings) is skipped by the loss: only the pair counts
        teacher_hidden = (teacher_hidden[0], teacher_hidden[compare[0]])
        student_hidden = (student_hidden[0], student_hidden[compare[1]])
    mask = batch["attention_mask"].to(student_hidden[0].device)
    loss, parts = layer_distill_loss(teacher_hidden, student_hidden, mask, ffns[0], ffns[1], mu, hidden_loss)
    loss.backward()
    return parts["loss"]


def distill_ffns(
    teacher: nn.Module,
    student: nn.Module,
    batches: Sequence[Batch],
    *,
    steps: int,
    lr: float,
    mu: float,
    grad_masks: Mapping[str, Tensor] | None = None,
    clip_norm: float = 1.0,
    optimizer: str = "adamw",
    hidden_loss: HiddenLoss = "mse",
    schedule: str = "constant",
    warmup_ratio: float = 0.0,
    extra_params: Mapping[str, nn.Parameter] | None = None,
    params: Mapping[str, nn.Parameter] | None = None,
    compare: tuple[int, int] | None = None,
) -> DistillStats:
    """Train only the student's FFN parameters for ``steps`` steps (cycling ``batches``) on eq. 13.

    Both models run in eval mode (no dropout); requires_grad flags and modes are restored afterwards.
    ``grad_masks`` (from `ffn_grad_masks`) multiply the gradients, so masked entries never move.
    The learning rate warms up linearly over ``warmup_ratio`` of the steps, then stays (``schedule``
    constant) or decays to 0 (cosine). ``extra_params`` (keyed like the unwrapped student names them,
    e.g. the compressed layers' output LayerNorm) train too, unmasked.
    Models may be peft-wrapped and have any head: only the backbone's hidden states are used.

    A student with fewer layers than the teacher (a layer-dropped emulator, Offsite-tuning's
    distillation): ``params`` replaces the FFNs as what trains, and ``compare`` = (teacher index,
    student index) compares one pair of ``output_hidden_states`` entries only (the emulator's output
    against the full model's at the same place); ``mu`` must then be 0 (its FFN gap pairs the models'
    layers one to one).
    """
    if steps < 1 or not batches:
        raise ValueError(f"distillation needs steps >= 1 and at least one batch, got {steps} steps")
    if compare is not None and mu != 0.0:
        raise ValueError("mu pairs the teacher's and the student's layers one to one: use mu 0 with compare")
    if params is not None and (extra_params or grad_masks):
        raise ValueError("params replaces the FFNs as what trains: give no extra_params or grad_masks")
    params = dict(params) if params is not None else ffn_parameters(student)
    if not params:
        raise ValueError("distillation has no parameter to train")
    clash = sorted(set(extra_params or {}) & set(params))
    if clash:
        raise ValueError(f"{clash[0]} is an FFN parameter: extra_params are trained beside the FFNs")
    params.update(extra_params or {})
    flags = {name: p.requires_grad for name, p in student.named_parameters()}
    modes = (teacher.training, student.training)
    ffns = (ffn_layers(teacher), ffn_layers(student))
    losses: list[float] = []
    start = time.perf_counter()
    try:
        for p in student.parameters():
            p.requires_grad_(False)
        for p in params.values():
            p.requires_grad_(True)
        teacher.eval()
        student.eval()
        opt = _optimizer(optimizer, list(params.values()), lr)
        warmup = int(warmup_ratio * steps)
        scheduler = None
        if schedule != "constant" or warmup > 0:
            factor = functools.partial(schedule_factor, schedule, total=steps, warmup=warmup)
            scheduler = torch.optim.lr_scheduler.LambdaLR(opt, factor)
        for step in range(steps):
            batch = batches[step % len(batches)]
            losses.append(_distill_step(teacher, student, batch, mu, ffns, hidden_loss, compare))
            _mask_and_clip(params, grad_masks, clip_norm)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if scheduler is not None:
                scheduler.step()
    finally:
        for name, p in student.named_parameters():
            p.requires_grad_(flags[name])
        teacher.train(modes[0])
        student.train(modes[1])
    seconds = time.perf_counter() - start
    return DistillStats(losses[0], losses[-1], float(np.mean(losses)), steps, seconds)


def _mask_and_clip(
    params: Mapping[str, nn.Parameter], grad_masks: Mapping[str, Tensor] | None, clip_norm: float
) -> None:
    if grad_masks is not None:
        unknown = sorted(set(grad_masks) - set(params))
        if unknown:
            raise ValueError(f"grad mask for {unknown[0]}, which is not an FFN parameter of the student")
        for name, mask in grad_masks.items():
            grad = params[name].grad
            if grad is not None:
                grad.mul_(mask)
    if clip_norm > 0:
        torch.nn.utils.clip_grad_norm_(list(params.values()), clip_norm)
