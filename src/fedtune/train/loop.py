"""The one local training loop: every method's client and server training goes through it."""

from __future__ import annotations

import math
import resource
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from fedtune.train.losses import proximal_term, response_nll

Batch = dict[str, torch.Tensor]
LossFn = Callable[[torch.nn.Module, Batch], tuple[torch.Tensor, int]]
Reporter = Callable[[int, int, float | None], None]


@dataclass(frozen=True)
class TrainResult:
    loss: float
    steps: int
    num_examples: int
    tokens: int
    target_tokens: int
    seconds: float
    peak_mem_mb: float

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def batch_targets(batch: Batch) -> int:
    """What a batch's loss is a sum over: its response tokens, or its examples for a classification
    batch (one ``class_labels`` entry per example)."""
    if "class_labels" in batch:
        return int(batch["class_labels"].numel())
    return int((batch["labels"][:, 1:] != -100).sum())


def sft_loss(model: torch.nn.Module, batch: Batch) -> tuple[torch.Tensor, int]:
    """Summed response-token NLL of a causal LM and the number of target tokens."""
    return response_nll(model, batch)


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MiB.

    Linux's ``VmHWM`` where there is one: ``getrusage``'s ``ru_maxrss`` survives ``fork`` and ``exec``,
    so a small process started by a large one (a client started by a loaded test or bench process)
    would report its parent's peak. Elsewhere ``ru_maxrss`` (KiB on Linux).
    """
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return peak_rss_mb()


def steps_for(num_batches: int, epochs: float, grad_accum: int, max_steps: int | None) -> int:
    steps = max(1, math.ceil(num_batches * epochs / grad_accum))
    return min(steps, max_steps) if max_steps else steps


def train_local(
    model: torch.nn.Module,
    batches: Sequence[Batch],
    optimizer: Optimizer,
    scheduler: LRScheduler | None,
    *,
    steps: int,
    grad_accum: int = 1,
    clip_norm: float | None = None,
    prox_mu: float = 0.0,
    prox_reference: Mapping[str, torch.Tensor] | None = None,
    loss_fn: LossFn = sft_loss,
    report: Reporter | None = None,
    grad_masks: Mapping[str, torch.Tensor] | None = None,
    master: FP32Master | None = None,
    gradient_checkpointing: bool = False,
) -> TrainResult:
    """Run ``steps`` optimizer steps of ``grad_accum`` micro-batches each, cycling ``batches``.

    The loss of an accumulation group is the token-weighted mean over its micro-batches, so
    accumulation gives the same gradient as one large batch. With ``prox_mu > 0`` the FedProx
    term mu/2 ||w - w_ref||^2 over the trainable parameters is added.

    ``grad_masks`` maps trainable parameter names (as ``model.named_parameters()`` gives them) to
    boolean tensors of the parameter's shape: entries outside a mask get a zero gradient (so clipping
    and optimizer moments see only the trained entries) and are put back after every step, so no
    optimizer term (weight decay, momentum) moves them either.

    ``master`` (fp32 copies of half-precision trainable parameters, ``FP32Master``): the optimizer
    steps the fp32 copies (it must have been built over ``master.optimizer_parameters()``) and the
    model's bf16/fp16 weights are refreshed from them after every step, so small updates add up
    instead of rounding away.

    ``gradient_checkpointing`` (``train.gradient_checkpointing``): the model's decoder layers recompute
    their activations in the backward pass for these steps (``activation_checkpointing``).
    """
    if not batches:
        raise ValueError("train_local got no batches")
    device = next(model.parameters()).device
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    trainable = {name: p for name, p in model.named_parameters() if p.requires_grad}
    masks = _device_masks(trainable, grad_masks or {}, device)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()
    model.train()
    start = time.perf_counter()
    total_nll, total_targets, total_tokens, num_examples, cursor = 0.0, 0, 0, 0, 0
    with activation_checkpointing(model, gradient_checkpointing):
        for step in range(steps):
            group = [batches[(cursor + i) % len(batches)] for i in range(grad_accum)]
            cursor += grad_accum
            group_targets = sum(batch_targets(b) for b in group)
            optimizer.zero_grad(set_to_none=True)
            for batch in group:
                batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
                with autocast:
                    nll, _ = loss_fn(model, batch)
                (nll / max(1, group_targets)).backward()
                total_nll += float(nll.detach())
                total_tokens += int(batch["attention_mask"].sum())
                num_examples += int(batch["input_ids"].shape[0])
            if prox_mu > 0 and prox_reference is not None:
                (prox_mu / 2 * proximal_term(trainable, prox_reference)).backward()
            stepped = master.stepped(trainable) if master is not None else trainable
            frozen = _mask_gradients(stepped, masks)
            if clip_norm:
                torch.nn.utils.clip_grad_norm_(list(stepped.values()), clip_norm)
            optimizer.step()
            _restore_frozen(stepped, masks, frozen)
            if master is not None:
                master.push()
            if scheduler is not None:
                scheduler.step()
            total_targets += group_targets
            if report is not None:
                report(step + 1, steps, total_nll / max(1, total_targets))
    model.eval()
    return TrainResult(
        loss=total_nll / max(1, total_targets),
        steps=steps,
        num_examples=num_examples,
        tokens=total_tokens,
        target_tokens=total_targets,
        seconds=time.perf_counter() - start,
        peak_mem_mb=_peak_memory_mb(device),
    )


@contextmanager
def activation_checkpointing(model: torch.nn.Module, enabled: bool) -> Iterator[None]:
    """Inside the block, ``model``'s decoder layers keep only their inputs in the forward pass and
    recompute the rest in the backward (non-reentrant torch checkpointing: dropout replays the same
    masks, so the loss and gradients are those without it); switched off again on exit, so a shared
    model's other users (evaluation, a method's server steps) are not affected.

    ``model``: a transformers model or a peft model around one. The input embeddings' output is made to
    require grad (what reentrant checkpointing needs to reach a LoRA above a frozen embedding; harmless
    here, and transformers 5 does it itself).
    """
    if not enabled:
        yield
        return
    wrapped: Any = model
    base: Any = wrapped.get_base_model() if hasattr(wrapped, "get_base_model") else wrapped
    if not getattr(base, "supports_gradient_checkpointing", False):
        raise ValueError(
            f"train.gradient_checkpointing: {type(base).__name__} does not support gradient "
            "checkpointing; set train.gradient_checkpointing: false"
        )
    kwargs = {"use_reentrant": False}
    # transformers 5 renamed gradient_checkpointing_* to activation_checkpointing_* (the old names warn).
    if hasattr(base, "activation_checkpointing_enable"):
        base.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        disable = base.activation_checkpointing_disable
    else:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        disable = base.gradient_checkpointing_disable
    if not getattr(base, "_require_grads_hooks", None) and getattr(base, "_require_grads_hook", None) is None:
        base.enable_input_require_grads()  # transformers 5 does it in activation_checkpointing_enable
    try:
        yield
    finally:
        disable()
        base.disable_input_require_grads()
        # transformers leaves the removed hook handles behind; a later enable must not take them for live.
        for attribute in ("_require_grads_hooks", "_require_grads_hook"):
            if hasattr(base, attribute):
                delattr(base, attribute)


HALF_DTYPES = (torch.bfloat16, torch.float16)


class FP32Master:
    """fp32 master copies of the half-precision (bf16/fp16) parameters among ``params``.

    Training full layers of a bf16 model in bf16 loses every update smaller than half a bf16 step
    (2^-8 relative); the optimizer steps these fp32 copies instead, and the model's weights are
    rounded from them after each step. fp32 parameters (e.g. peft's LoRA factors) need no copy.
    """

    def __init__(self, params: Mapping[str, torch.nn.Parameter]) -> None:
        self.params = dict(params)
        self.copies = {
            name: torch.nn.Parameter(p.detach().float().clone())
            for name, p in params.items()
            if p.dtype in HALF_DTYPES
        }

    @classmethod
    def needed(cls, params: Mapping[str, torch.nn.Parameter]) -> FP32Master | None:
        master = cls(params)
        return master if master.copies else None

    def optimizer_parameters(self) -> list[torch.nn.Parameter]:
        """What the optimizer steps: the fp32 copy where there is one, else the parameter itself."""
        return [self.copies.get(name, p) for name, p in self.params.items()]

    def stepped(self, trainable: Mapping[str, torch.nn.Parameter]) -> dict[str, torch.nn.Parameter]:
        """The fp32 copies with this step's gradients (from the model's), by the model's names."""
        result = {}
        for name, p in trainable.items():
            copy = self.copies.get(name)
            if copy is None:
                result[name] = p
                continue
            copy.grad = None if p.grad is None else p.grad.float()
            result[name] = copy
        return result

    def push(self) -> None:
        """Round the fp32 copies into the model's half-precision weights."""
        with torch.no_grad():
            for name, copy in self.copies.items():
                self.params[name].copy_(copy)


def _device_masks(
    trainable: Mapping[str, torch.nn.Parameter], masks: Mapping[str, torch.Tensor], device: torch.device
) -> dict[str, torch.Tensor]:
    unknown = sorted(set(masks) - set(trainable))
    if unknown:
        raise KeyError(f"gradient mask for a parameter that does not train: {unknown[0]}")
    result = {}
    for name, mask in masks.items():
        if tuple(mask.shape) != tuple(trainable[name].shape):
            raise ValueError(
                f"gradient mask of {name}: shape {tuple(mask.shape)} != {tuple(trainable[name].shape)}"
            )
        result[name] = mask.to(device=device, dtype=torch.bool)
    return result


def _mask_gradients(
    trainable: Mapping[str, torch.nn.Parameter], masks: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """Zero the gradient outside each mask; return the masked-out values to restore after the step."""
    frozen = {}
    for name, mask in masks.items():
        param = trainable[name]
        if param.grad is not None:
            param.grad.mul_(mask)
        frozen[name] = param.detach().clone()
    return frozen


def _restore_frozen(
    trainable: Mapping[str, torch.nn.Parameter],
    masks: Mapping[str, torch.Tensor],
    frozen: Mapping[str, torch.Tensor],
) -> None:
    with torch.no_grad():
        for name, mask in masks.items():
            param = trainable[name]
            param.copy_(torch.where(mask, param, frozen[name]))
