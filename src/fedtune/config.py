"""The experiment config: one validated schema, YAML files plus dotted ``key=value`` overrides.

Unknown keys are errors with a "did you mean"; wrong types name the full dotted key.
Each algorithm has its own section (``fedit:`` ...); ``algorithm:`` picks which one runs.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)


class ConfigError(ValueError):
    """A config problem; the message names the file and the dotted key."""


def _accepts_bool(annotation: Any) -> bool:
    return annotation is bool or any(_accepts_bool(arg) for arg in get_args(annotation))


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        # YAML's true/false would otherwise pass as 1/0 (pydantic's lax mode): `fed.rounds: true` is a typo.
        name = info.field_name
        if (
            isinstance(value, bool)
            and name is not None
            and not _accepts_bool(cls.model_fields[name].annotation)
        ):
            raise ValueError("expected a number or a string, got a boolean")
        return value


class ModelConfig(Section):
    name: str = "smollm2-135m-instruct"
    dtype: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    device: str = "auto"
    gguf_file: str | None = None
    cache_dir: str | None = None


class LoraConfig(Section):
    r: int = Field(8, ge=1)
    alpha: int = Field(16, gt=0)
    dropout: float = Field(0.05, ge=0, lt=1)
    target_modules: list[str] | Literal["auto"] = "auto"


class PartitionConfig(Section):
    scheme: Literal["iid", "dirichlet", "pathological", "natural"] = "iid"
    num_clients: int = Field(4, ge=1)
    by: str = "category"
    alpha: float = Field(0.5, gt=0)
    classes_per_client: int = Field(2, ge=1)
    min_partition_size: int = Field(1, ge=0)


class DataConfig(Section):
    dataset: str = "wordnet-instruct"
    format: Literal["auto", "jsonl", "json", "csv", "parquet", "hf"] = "auto"
    schema_: Literal["auto", "alpaca", "dolly"] = Field("auto", alias="schema")
    template: Literal["alpaca", "chat", "plain"] = "alpaca"
    max_length: int = Field(256, ge=8)
    max_train_examples: int | None = Field(None, ge=1)
    eval_dataset: str | None = None
    eval_split: str = "test"
    length_bucketing: bool = True
    partition: PartitionConfig = PartitionConfig()

    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True)


class TrainConfig(Section):
    optimizer: Literal["adamw", "sgd", "prodigy"] = "adamw"
    lr: float = Field(3e-4, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    momentum: float = Field(0.0, ge=0)
    batch_size: int = Field(8, ge=1)
    grad_accum: int = Field(1, ge=1)
    local_epochs: float = Field(1.0, gt=0)
    max_steps: int | None = Field(None, ge=1)
    schedule: Literal["constant", "cosine", "linear"] = "constant"
    schedule_scope: Literal["round", "global"] = "round"
    warmup_ratio: float = Field(0.0, ge=0, lt=1)
    min_lr_ratio: float = Field(0.0, ge=0, le=1)
    clip_norm: float | None = Field(1.0, gt=0)


class FedConfig(Section):
    mode: Literal["federated", "standalone", "centralized"] = "federated"
    rounds: int = Field(3, ge=1)
    clients_per_round: int | None = Field(None, ge=1)
    fraction: float = Field(1.0, gt=0, le=1)
    min_replies: int = Field(1, ge=1)
    client_timeout: float | None = Field(None, gt=0)
    norm_bound: float | None = Field(None, gt=0)
    keep_checkpoints: int = Field(2, ge=1)
    backend: Literal["simulation", "flower"] = "simulation"


class EvalConfig(Section):
    metrics: list[
        Literal["rougeL", "perplexity", "dist3", "dist4", "exact_match", "numeric_accuracy", "pass_at_1"]
    ] = ["rougeL", "perplexity"]
    every: int = Field(1, ge=1)
    before: bool = True
    max_examples: int | None = Field(32, ge=1)
    max_new_tokens: int = Field(48, ge=1)
    batch_size: int = Field(8, ge=1)
    temperature: float = Field(0.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    seeds: int = Field(1, ge=1)
    extra_datasets: list[str] = []


class FedITConfig(Section):
    """FedIT = FedAvg of LoRA states weighted by example count; FedProx when ``prox_mu > 0``."""

    prox_mu: float = Field(0.0, ge=0)
    server_lr: float = Field(1.0, gt=0)


class FedPTConfig(Section):
    """FedPT: clients tune the small LM (``model``); the server proxy-tunes ``large_model`` with it.

    ``distill: false`` is the FedAvg+PT baseline (no distillation step). ``alpha`` steers the
    distillation teacher and decoding; at evaluation ``alpha_grid`` is searched on the validation
    split (``alpha_search``) and the best value is used on the test sets.
    """

    large_model: str = "smollm2-135m-instruct"
    large_dtype: Literal["fp32", "bf16", "fp16"] = "fp32"
    distill: bool = True
    alpha: float = Field(1.0, ge=0)
    alpha_grid: list[float] = [1.0, 1.3, 1.5, 1.8, 2.0]
    alpha_search: Literal["final", "every", "never"] = "final"
    alpha_search_seeds: int = Field(1, ge=1)
    alpha_search_examples: int | None = Field(None, ge=1)
    kd_lambda: float = Field(0.1, ge=0, le=1)
    kd_examples: int = Field(128, ge=1)
    kd_batch_size: int = Field(16, ge=1)
    kd_steps: int = Field(8, ge=1)
    kd_optimizer: Literal["adamw", "sgd", "prodigy"] = "prodigy"
    kd_lr: float = Field(1.0, gt=0)
    kd_weight_decay: float = Field(0.01, ge=0)
    kd_schedule: Literal["constant", "cosine", "linear"] = "cosine"
    # The distillation's own optimiser settings (the defaults are train's defaults, as before).
    kd_betas: tuple[float, float] = (0.9, 0.999)
    kd_momentum: float = Field(0.0, ge=0)
    kd_warmup_ratio: float = Field(0.0, ge=0, lt=1)
    kd_min_lr_ratio: float = Field(0.0, ge=0, le=1)
    kd_clip_norm: float | None = Field(1.0, gt=0)
    teacher_cache: Literal["disk", "memory", "recompute"] = "disk"
    teacher_dtype: Literal["fp16", "fp32"] = "fp16"
    eval_small: bool = True


class FedBiOTConfig(Section):
    """FedBiOT and its baselines: clients tune an adapter on top of a layer-dropped emulator.

    ``split: last`` is FedBiOT's LayerExtract (adapter = the last ``adapter_layers`` layers);
    ``split: first_last`` is Offsite-tuning's / FedOT's (half of ``adapter_layers`` first, half last).
    ``align_steps: 0`` keeps the emulator fixed after the initial distillation (Offsite-tuning, FedOT).
    """

    split: Literal["last", "first_last"] = "last"
    adapter_layers: int = Field(2, ge=1)
    dropout: float = Field(0.2, ge=0, lt=1)
    adapter_mode: Literal["full", "lora"] = "full"
    prox_eps: float = Field(0.5, ge=0)
    align_lambda: float = Field(0.5, ge=0)
    init_steps: int = Field(50, ge=0)
    align_steps: int = Field(10, ge=0)
    align_batch_size: int = Field(4, ge=1)
    align_optimizer: Literal["sgd", "adamw"] = "sgd"
    align_lr: float = Field(1e-3, gt=0)
    align_clip_norm: float | None = Field(1.0, gt=0)
    public_dataset: str | None = None
    public_examples: int | None = Field(512, ge=1)
    client_cache: Literal["auto", "memory", "disk"] = "auto"
    # A directory shared by runs: the initial emulator distillation is kept there under the
    # fingerprint of the settings it depends on, and reused by any run with the same settings.
    init_cache: str | None = None

    @model_validator(mode="after")
    def _check_split(self) -> FedBiOTConfig:
        if self.split == "first_last" and self.adapter_layers % 2:
            raise ValueError(
                "fedbiot.adapter_layers must be even with split first_last (half first, half last)"
            )
        return self


class FlowerConfig(Section):
    """The Flower deployment (``fed.backend: flower``); see ``fedtune.fl.flower``.

    ``superlink`` is where SuperNodes and ``flwr`` reach the SuperLink (``host:port``; port 0 =
    a free loopback port for the local deployment). ``tls`` and ``auth`` name directories: the
    TLS one holds ``ca.crt``, ``server.pem``, ``server.key``; the auth one holds each node's
    ``node<i>`` / ``node<i>.pub`` key pair. ``auto`` generates them for the local deployment.
    """

    superlink: str = "127.0.0.1:0"
    # "partition": SuperNodes train on their partition of data.dataset (the server derives the same
    # one and bounds each reply's num_examples by its size); "own": they bring their own data
    # (supernode --data-path), so the server checks only that num_examples is positive.
    client_data: Literal["partition", "own"] = "partition"
    tls: str | None = None
    auth: str | None = None
    connect_timeout: float = Field(300.0, gt=0)
    reply_timeout: float = Field(3600.0, gt=0)
    poll_interval: float = Field(0.1, gt=0)


class ExperimentConfig(Section):
    name: str = "experiment"
    seed: int = 0
    algorithm: str = "fedit"
    output_dir: str | None = None
    progress: bool = True
    model: ModelConfig = ModelConfig()
    lora: LoraConfig = LoraConfig()
    data: DataConfig = DataConfig()
    train: TrainConfig = TrainConfig()
    fed: FedConfig = FedConfig()
    eval: EvalConfig = EvalConfig()
    fedit: FedITConfig = FedITConfig()
    fedpt: FedPTConfig = FedPTConfig()
    flower: FlowerConfig = FlowerConfig()
    fedbiot: FedBiOTConfig = FedBiOTConfig()

    @model_validator(mode="after")
    def _check_consistency(self) -> ExperimentConfig:
        from fedtune.algorithms.registry import algorithm_names, get_algorithm

        if self.algorithm not in algorithm_names():
            raise ValueError(f"unknown algorithm {self.algorithm!r}; choose one of {algorithm_names()}")
        for name in algorithm_names():
            section = getattr(self, name, None)
            if name != self.algorithm and isinstance(section, BaseModel) and section.model_fields_set:
                key = f"{name}.{sorted(section.model_fields_set)[0]}"
                raise ValueError(
                    f"config key '{key}' belongs to algorithm '{name}', but algorithm is "
                    f"'{self.algorithm}' (remove the '{name}' section or set algorithm: {name})"
                )
        modes = get_algorithm(self.algorithm).modes
        if self.fed.mode not in modes:
            raise ValueError(
                f"fed.mode {self.fed.mode!r} is not supported by algorithm {self.algorithm!r}; "
                f"it supports {', '.join(modes)}"
            )
        if self.fed.min_replies > self.data.partition.num_clients:
            raise ValueError("fed.min_replies is larger than data.partition.num_clients")
        per_round = self.fed.clients_per_round
        if (
            per_round is not None
            and self.fed.mode != "centralized"
            and per_round > self.data.partition.num_clients
        ):
            raise ValueError(
                f"fed.clients_per_round = {per_round} is larger than data.partition.num_clients = "
                f"{self.data.partition.num_clients}"
            )
        return self

    def run_dir(self) -> Path:
        return Path(self.output_dir) if self.output_dir else Path("runs") / self.name

    def to_yaml_dict(self) -> dict[str, Any]:
        """Every key with its value, but for other algorithms' sections (they would not validate)."""
        data = self.model_dump(mode="json", by_alias=True)
        for name in _other_algorithm_sections(data):
            del data[name]
        return data


_SECTIONS = {
    name
    for name, field in ExperimentConfig.model_fields.items()
    if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)
}


def _known_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    keys = []
    for name, field in model.model_fields.items():
        key = prefix + (field.alias or name)
        keys.append(key)
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            keys.extend(_known_keys(annotation, key + "."))
    return keys


def _describe(error: Any, source: str) -> str:
    key = ".".join(str(part) for part in error["loc"]) or "<root>"
    if error["type"] == "extra_forbidden":
        suggestion = difflib.get_close_matches(key, _known_keys(ExperimentConfig), n=1, cutoff=0.6)
        hint = f" (did you mean '{suggestion[0]}'?)" if suggestion else ""
        return f"{source}: unknown config key '{key}'{hint}"
    got = error.get("input")
    shown = "" if isinstance(got, dict) else f", got {got!r}"
    return f"{source}: config key '{key}': {error['msg']}{shown}"


def validate_config(raw: dict[str, Any], source: str = "config") -> ExperimentConfig:
    """The validated config; a section set to null (``fedpt=null`` on the command line) is dropped."""
    raw = {key: value for key, value in raw.items() if not (value is None and key in _SECTIONS)}
    try:
        return ExperimentConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError("\n".join(_describe(err, source) for err in exc.errors())) from None


def parse_override(override: str) -> tuple[list[str], Any]:
    if "=" not in override:
        raise ConfigError(f"override {override!r} is not of the form key=value")
    key, _, text = override.partition("=")
    if not key.strip():
        raise ConfigError(f"override {override!r} has an empty key")
    try:
        value = yaml.safe_load(text) if text else ""
    except yaml.YAMLError:
        value = text
    return key.strip().split("."), value


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for override in overrides:
        path, value = parse_override(override)
        node = raw
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {override!r}: '{part}' is not a section")
            node = child
        node[path[-1]] = value
    return raw


def read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML: {exc}") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of config keys")
    return raw


def load_config(path: str | Path, overrides: list[str] | None = None) -> ExperimentConfig:
    """Read a YAML config, apply ``key=value`` overrides, validate everything."""
    path = Path(path)
    raw = apply_overrides(read_yaml(path), overrides or [])
    return validate_config(raw, source=str(path))


def _other_algorithm_sections(raw: dict[str, Any]) -> list[str]:
    from fedtune.algorithms.registry import algorithm_names

    running = raw.get("algorithm", ExperimentConfig.model_fields["algorithm"].default)
    return [name for name in algorithm_names() if name != running and name in raw]


def dump_config(cfg: ExperimentConfig, path: Path, extra: dict[str, Any] | None = None) -> None:
    data = cfg.to_yaml_dict()
    if extra:
        data["_run"] = extra
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def load_run_config(run_dir: Path) -> ExperimentConfig:
    raw = read_yaml(run_dir / "config.yaml")
    raw.pop("_run", None)
    # Run directories written before other algorithms' sections were left out hold their defaults.
    for name in _other_algorithm_sections(raw):
        del raw[name]
    return validate_config(raw, source=str(run_dir / "config.yaml"))
