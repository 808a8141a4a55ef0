"""The rules that span sections: what the running method, its modes, DP, secure aggregation,
quantisation and the evaluation metrics require of the rest of the config.

Each rule is a pure function of the sections it reads and returns the problem, or None: a message that
names the keys to change. ``ExperimentConfig`` applies them in order and raises the first problem.
"""

from __future__ import annotations

import importlib.util

from fedtune.config.algorithm import AlgorithmConfig
from fedtune.config.data import PERSONAL_SPLITS, DataConfig, PartitionConfig
from fedtune.config.deploy import RayConfig
from fedtune.config.eval import CHOICE_METRICS, EvalConfig
from fedtune.config.fed import FedConfig
from fedtune.config.model import ModelConfig
from fedtune.config.privacy import DPConfig, SecAggConfig
from fedtune.data.builtin import list_builtin


def personal_eval_problem(
    algorithm: str, section: AlgorithmConfig, evaluation: EvalConfig, fed: FedConfig, data: DataConfig
) -> str | None:
    """``eval.personal`` where the method has no client-side evaluation, or off where it needs it, or with
    a ``data.eval_split`` the clients cannot carve from their records."""
    if evaluation.personal and data.eval_split not in PERSONAL_SPLITS:
        return (
            f"data.eval_split {data.eval_split!r}: with eval.personal each client evaluates on a split of "
            "its own records, 'test' (its held-out records) or 'validation' (held out from what it trains on)"
        )
    if section.requires_personal_eval and not evaluation.personal:
        return f"algorithm {algorithm!r} evaluates each client's own model: set eval.personal: true"
    if evaluation.personal and not section.personal_eval:
        return f"eval.personal: algorithm {algorithm!r} has no client-side evaluation"
    if evaluation.personal and fed.mode == "centralized":
        return "eval.personal needs clients: fed.mode centralized has a single one"
    return None


def mode_problem(algorithm: str, section: AlgorithmConfig, fed: FedConfig) -> str | None:
    """A ``fed.mode`` the method does not implement."""
    if fed.mode not in section.modes:
        return (
            f"fed.mode {fed.mode!r} is not supported by algorithm {algorithm!r}; "
            f"it supports {', '.join(section.modes)}"
        )
    return None


def quantization_problem(algorithm: str, section: AlgorithmConfig, model: ModelConfig) -> str | None:
    """``model.quantization`` where the method refuses it, without bitsandbytes, or on a device
    bitsandbytes has no kernels for."""
    bits = model.quantization
    if bits is None:
        return None
    if section.quantization_refused:
        return (
            f"model.quantization {bits}: algorithm {algorithm!r} cannot train on a quantised base: "
            f"{section.quantization_refused}; remove model.quantization (null)"
        )
    if importlib.util.find_spec("bitsandbytes") is None:
        return (
            f"model.quantization {bits} needs bitsandbytes, which is not installed: "
            "pip install 'fedtune[quant]'"
        )
    device = model.device.split(":")[0]
    if device not in ("auto", "cpu", "cuda"):
        return f"model.quantization {bits}: bitsandbytes runs on cpu or cuda, not model.device {device!r}"
    return None


def dp_problem(algorithm: str, section: AlgorithmConfig, dp: DPConfig, fed: FedConfig) -> str | None:
    """What ``dp.enabled`` cannot run with: a method that refuses it, a mode without aggregation, a robust
    aggregator or the median screen set explicitly (whose choices depend on the other clients' updates, so
    one client could change what many contribute: the sum's sensitivity would no longer be
    ``dp.clip_norm``). ``fed.screen`` left at its default is switched off after the checks
    (``screen_left_on``)."""
    if not dp.enabled:
        return None
    if importlib.util.find_spec("dp_accounting") is None:
        return "dp.enabled needs dp-accounting, which is not installed: pip install 'fedtune[dp]'"
    refused = section.dp_problem()
    if refused:
        return (
            f"dp.enabled: algorithm {algorithm!r} cannot run with client-level differential privacy: "
            f"{refused}; set dp.enabled: false"
        )
    if fed.mode != "federated":
        return (
            f"dp.enabled: fed.mode {fed.mode!r} aggregates nothing across clients, so there is no "
            "noised mean to protect them; use fed.mode: federated or dp.enabled: false"
        )
    if fed.aggregator != "mean":
        return (
            f"dp.enabled: fed.aggregator {fed.aggregator!r} has no sensitivity bound the accountant "
            "covers; under dp every update is clipped to dp.clip_norm (which bounds a lying client too): "
            "set fed.aggregator: mean"
        )
    if _screen_set(fed):
        return (
            "dp.enabled: fed.screen drops a reply by comparing it with the other replies' median, so "
            "one client could change what others contribute and the sum's sensitivity would exceed "
            "dp.clip_norm; under dp clipping bounds every reply instead: set fed.screen: null"
        )
    return None


def secagg_problem(
    algorithm: str,
    section: AlgorithmConfig,
    secagg: SecAggConfig,
    fed: FedConfig,
    partition: PartitionConfig,
) -> str | None:
    """What ``secagg.enabled`` cannot run with: the methods and settings ``dp`` refuses (the protocol sums
    the same updates ``Algorithm.aggregate`` combines), per-reply screening set explicitly (the server
    sees no single reply; left at its default it is switched off, ``screen_left_on``) and a sum that
    would overflow the 32-bit modulus."""
    if not secagg.enabled:
        return None
    refused = section.dp_problem()
    if refused:
        return (
            f"secagg.enabled: algorithm {algorithm!r} cannot aggregate securely: {refused}; "
            "set secagg.enabled: false"
        )
    if fed.mode != "federated":
        return f"secagg.enabled: fed.mode {fed.mode!r} has no sum of client updates to protect"
    if fed.aggregator != "mean":
        return (
            f"secagg.enabled: fed.aggregator {fed.aggregator!r} needs every update, and the server only "
            "learns their sum: set fed.aggregator: mean"
        )
    if _screen_set(fed):
        return (
            "secagg.enabled: fed.screen compares single replies, which the server no longer sees (the "
            "clients clip and check their own updates): set fed.screen: null"
        )
    return _secagg_round_problem(secagg, fed, partition)


def _screen_set(fed: FedConfig) -> bool:
    """``fed.screen`` given a value in the config (not left at its default)."""
    return fed.screen is not None and "screen" in fed.model_fields_set


def screen_left_on(dp: DPConfig, secagg: SecAggConfig, fed: FedConfig) -> bool:
    """``fed.screen`` still at its default under ``dp`` or ``secagg``, which cannot screen single
    replies (``dp_problem``, ``secagg_problem``): validation switches it off."""
    return (dp.enabled or secagg.enabled) and fed.screen is not None and not _screen_set(fed)


def _secagg_round_problem(secagg: SecAggConfig, fed: FedConfig, partition: PartitionConfig) -> str | None:
    """Rounds of one client (whose secure sum is its own update) or a sum over the 32-bit modulus."""
    clients = partition.num_clients
    per_round = fed.clients_per_round
    expected = per_round if per_round is not None else max(1, round(fed.fraction * clients))
    if expected < 2:
        key = (
            f"fed.clients_per_round = {per_round}"
            if per_round is not None
            else f"fed.fraction = {fed.fraction:g} of {clients} clients"
        )
        return (
            f"secagg.enabled: {key} gives rounds of one client, whose secure sum would be its own update "
            "(the protocol leaves a lone client out, so no round would aggregate anything): sample at "
            "least 2 clients a round"
        )
    if clients * ((1 << secagg.bits) - 1) >= 1 << 32:
        most = max(bits for bits in range(1, 33) if clients * ((1 << bits) - 1) < 1 << 32)
        return (
            f"secagg.bits {secagg.bits}: the sum of {clients} clients' values overflows the 32-bit "
            f"modulus; use secagg.bits <= {most}"
        )
    return None


def ray_device_problem(fed: FedConfig, ray: RayConfig, model: ModelConfig) -> str | None:
    """``model.device: cuda:N`` (N > 0) on Ray actors that reserve GPUs: Ray shows each such actor only the
    GPU it assigned, as ``cuda:0``, so the actors would find no GPU N."""
    if fed.backend != "ray" or ray.num_gpus <= 0:
        return None
    kind, _, index = model.device.partition(":")
    if kind == "cuda" and index.isdigit() and int(index) > 0:
        return (
            f"model.device {model.device!r} with fed.backend ray and ray.num_gpus {ray.num_gpus:g}: Ray "
            "shows each actor only the GPU it assigned it, as cuda:0; use model.device cuda or auto (Ray "
            "spreads the actors over the GPUs), and CUDA_VISIBLE_DEVICES to choose which GPUs Ray may use"
        )
    return None


def replies_problem(fed: FedConfig, partition: PartitionConfig) -> str | None:
    """More replies or clients per round asked for than there are clients."""
    if fed.min_replies > partition.num_clients:
        return "fed.min_replies is larger than data.partition.num_clients"
    per_round = fed.clients_per_round
    if per_round is not None and fed.mode != "centralized" and per_round > partition.num_clients:
        return (
            f"fed.clients_per_round = {per_round} is larger than data.partition.num_clients = "
            f"{partition.num_clients}"
        )
    return None


def choice_metric_problem(evaluation: EvalConfig, data: DataConfig) -> str | None:
    """``acc`` / ``acc_norm`` asked of a built-in dataset without choices, named by its config key.

    Files are not opened here: a record without choices there stops the evaluation instead.
    """
    wanted = [metric for metric in evaluation.metrics if metric in CHOICE_METRICS]
    if not wanted:
        return None
    tasks = {info.name: info.task for info in list_builtin()}
    evaluated = {"data.eval_dataset": data.eval_dataset} if data.eval_dataset else {}
    if not data.eval_dataset or evaluation.personal:
        evaluated["data.dataset"] = data.dataset
    evaluated.update({f"eval.extra_datasets[{i}]": name for i, name in enumerate(evaluation.extra_datasets)})
    for key, name in evaluated.items():
        task = tasks.get(name, "multiple_choice")
        if task != "multiple_choice":
            choice_sets = ", ".join(sorted(n for n, t in tasks.items() if t == "multiple_choice"))
            return (
                f"eval.metrics: {wanted[0]!r} scores multiple-choice records, but {key} is '{name}', a "
                f"{task} dataset without choices; evaluate on a multiple_choice one ({choice_sets}) or drop "
                f"{' and '.join(repr(metric) for metric in wanted)}"
            )
    return None
