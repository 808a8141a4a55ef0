"""The experiment config: one validated schema, YAML files plus dotted ``key=value`` overrides.

Unknown keys are errors with a "did you mean"; wrong types name the full dotted key.
``algorithm:`` picks the method; its own section (``fedbiot:`` ...) is validated by the ``Config``
class that the algorithm's module defines (``fedtune.plugins`` finds it), and a section of any other
algorithm is an error.
"""

from __future__ import annotations

import difflib
import importlib.util
from pathlib import Path
from typing import Any, ClassVar, Literal, get_args

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
from pydantic_core import PydanticCustomError

from fedtune.data.builtin import list_builtin
from fedtune.data.records import ROW_FIELDS
from fedtune.plugins import algorithm_names, config_class


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
    # 4: the base model's linear layers in bitsandbytes NF4 (double quantisation, computing in `dtype`);
    # 8: LLM.int8. The LoRA trained on top stays fp32 (QLoRA); embeddings, norms and the head are not
    # quantised. Applies to every LoRA base loaded from this section (and FedMKT's fedmkt.clients);
    # FedBiOT and FedPFT refuse it (see docs/memory.md). Needs `pip install 'fedtune[quant]'`.
    quantization: Literal[4, 8] | None = None


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
    # With eval.personal: the fraction of each client's partition held out (seeded per client) for
    # the client-side evaluation; the rest is what the client trains on.
    holdout: float = Field(0.2, ge=0, lt=1)
    # Renames data.dataset's columns before the schema applies: `{question: instruction, answer: output}`.
    # A column renamed onto a name the file already has replaces that column (FlowerTune's medical set:
    # `{input: instruction}` makes the question the instruction, its fixed instruction dropped). The
    # same for the hub dataset and a local copy of it; data.eval_dataset and eval.extra_datasets are
    # read as they are.
    columns: dict[str, str] = {}
    partition: PartitionConfig = PartitionConfig()

    @field_validator("columns")
    @classmethod
    def _columns_name_row_fields(cls, columns: dict[str, str]) -> dict[str, str]:
        for source, target in columns.items():
            if target not in ROW_FIELDS:
                close = difflib.get_close_matches(target, ROW_FIELDS, n=1)
                hint = f" (did you mean '{close[0]}'?)" if close else ""
                raise ValueError(
                    f"column '{source}' -> '{target}': not a row field{hint}; valid: {', '.join(ROW_FIELDS)}"
                )
        targets = list(columns.values())
        repeated = sorted({target for target in targets if targets.count(target) > 1})
        if repeated:
            raise ValueError(f"two columns renamed to '{repeated[0]}'")
        return columns

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
    # Recompute each decoder layer's activations in the backward pass instead of keeping them
    # (non-reentrant torch checkpointing), in every local training step: less activation memory,
    # about one more forward pass of time.
    gradient_checkpointing: bool = False


class FedConfig(Section):
    mode: Literal["federated", "standalone", "centralized"] = "federated"
    rounds: int = Field(3, ge=1)
    clients_per_round: int | None = Field(None, ge=1)
    fraction: float = Field(1.0, gt=0, le=1)
    min_replies: int = Field(1, ge=1)
    client_timeout: float | None = Field(None, gt=0)
    norm_bound: float | None = Field(None, gt=0)
    # An adaptive bound on by default: a reply whose update norm (against what the server sent) exceeds
    # ``screen`` x the median of the call's update norms is rejected; it needs 3 or more such replies
    # (with 2 the median cannot tell the liar). null turns it off.
    screen: float | None = Field(10.0, gt=1)
    # How the server combines client tensors: "mean" (weighted by example count, the methods' own rule),
    # or, robust to a few lying clients, the coordinate-wise "median" or "trimmed_mean" (unweighted;
    # ``trim`` is the share of values dropped at each end of every coordinate).
    aggregator: Literal["mean", "median", "trimmed_mean"] = "mean"
    trim: float = Field(0.2, ge=0, lt=0.5)
    keep_checkpoints: int = Field(2, ge=1)
    backend: Literal["simulation", "flower", "ray"] = "simulation"
    # fp16: float32 arrays of >= 1024 entries travel as fp16 in both directions (half the bytes; the
    # receiver computes with the rounded values). Bytes are counted as sent.
    wire_dtype: Literal["fp32", "fp16"] = "fp32"
    # A communication budget in MB (10^6 bytes), up plus down as metrics.jsonl counts them; null: none.
    # The run stops cleanly (final artifacts written) before the round predicted to pass it: the next
    # round is taken to cost the largest round after the first (the first while it is the only one).
    # When round 1 alone passes it, the run stops after round 1. `fedtune resume` on a run it stopped
    # runs no more rounds and says why again. FlowerTune's leaderboard caps runs at 200000.
    budget_mb: float | None = Field(None, gt=0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _trim_used(self) -> FedConfig:
        if self.trim != type(self).model_fields["trim"].default and self.aggregator != "trimmed_mean":
            raise ValueError(
                f"fed.trim {self.trim:g} is set but fed.aggregator is {self.aggregator!r}: only trimmed_mean "
                "trims, so it would be ignored. Set fed.aggregator: trimmed_mean, or remove fed.trim"
            )
        return self


class DPConfig(Section):
    """Client-level differential privacy, central: the server clips each client's update, adds Gaussian
    noise to their sum and accounts for the privacy spent (docs/privacy.md)."""

    # Off by default. On: the methods that support it (``AlgorithmConfig.dp_refused`` is None) sample
    # clients from a secret seed, clip, noise and account; the others refuse the run with the reason.
    enabled: bool = False
    # z: the noise's standard deviation on the sum of clipped updates is z x clip_norm, per coordinate.
    # Give it, or target_epsilon instead.
    noise_multiplier: float | None = Field(None, gt=0)
    # The epsilon to reach after fed.rounds rounds: the noise multiplier is calibrated from it (with the
    # run's sampling rate and dp.delta) when the run starts.
    target_epsilon: float | None = Field(None, gt=0)
    # C: each client's update (its trained tensors minus what the server sent) is scaled to L2 norm <= C.
    clip_norm: float | None = Field(None, gt=0)
    # The delta of the (epsilon, delta) guarantee; keep it well below 1 / (number of clients).
    delta: float = Field(1e-5, gt=0, lt=1)
    # The run stops cleanly (final artifacts written) before a round that would take epsilon above it.
    max_epsilon: float | None = Field(None, gt=0)
    # poisson: each client joins a round with probability q (fed.clients_per_round / clients, else
    # fed.fraction), independently, from a per-run secret; fixed: exactly fed.clients_per_round clients
    # (replace-one neighbours: twice the sensitivity, so a larger epsilon for the same noise).
    sampling: Literal["poisson", "fixed"] = "poisson"
    # Which of dp-accounting's accountants gives epsilon (and calibrates target_epsilon): pld (privacy
    # loss distributions: the tighter bound) or rdp (Renyi DP). Both are valid upper bounds. Fixed-size
    # sampling is accounted with rdp (dp-accounting's PLD does not cover sampling without replacement).
    accountant: Literal["pld", "rdp"] = "pld"

    @model_validator(mode="after")
    def _complete(self) -> DPConfig:
        if not self.enabled:
            refuse_ignored_settings(self, "dp", "the run would not be private")
            return self
        if self.sampling == "fixed" and self.accountant == "pld" and "accountant" in self.model_fields_set:
            raise ValueError(
                "dp.accountant pld does not cover dp.sampling fixed (sampling without replacement): set "
                "dp.accountant: rdp, or dp.sampling: poisson"
            )
        if (self.noise_multiplier is None) == (self.target_epsilon is None):
            raise ValueError(
                "dp.enabled needs exactly one of dp.noise_multiplier (the noise) and dp.target_epsilon "
                "(the epsilon to calibrate the noise for)"
            )
        if self.clip_norm is None:
            raise ValueError(
                "dp.enabled needs dp.clip_norm, the L2 bound on each client's update (a non-DP run's "
                "update norms, e.g. fed.norm_bound's scale, tell what to expect)"
            )
        target, limit = self.target_epsilon, self.max_epsilon
        if target is not None and limit is not None and limit < target:
            raise ValueError(
                f"dp.max_epsilon {limit} is below dp.target_epsilon {target}: the run would stop before "
                "its last round; raise max_epsilon or lower target_epsilon"
            )
        return self


def refuse_ignored_settings(section: BaseModel, name: str, consequence: str) -> None:
    """A section that is off (``enabled: false``) with keys set away from their defaults: those keys would
    be ignored, and whoever set them would believe they act. A ``ValueError`` naming them."""
    changed = [
        f"{name}.{key}"
        for key, field in type(section).model_fields.items()
        if key != "enabled" and getattr(section, key) != field.default
    ]
    if changed:
        raise ValueError(
            f"{', '.join(changed)} {'is' if len(changed) == 1 else 'are'} set but {name}.enabled is false: "
            f"{'it' if len(changed) == 1 else 'they'} would be ignored and {consequence}. Set "
            f"{name}.enabled: true, or remove {'it' if len(changed) == 1 else 'them'}"
        )


class SecAggConfig(Section):
    """Secure aggregation (SecAgg+, Bell et al. 2020): the server learns only the sum of the round's
    client updates (docs/privacy.md)."""

    # Off by default. On: the update task's reply carries only statistics; the update itself travels
    # masked through four protocol stages and only the sum is unmasked.
    enabled: bool = False
    # The share of a round's clients (those that replied to the update task) that must still be there
    # at every stage; below it the round fails with the reason. Above 0.5, so the server can never
    # collect enough shares to unmask both halves of one client.
    threshold: float = Field(0.7, gt=0.5, le=1)
    # k, the clients in each SecAgg+ neighbourhood (the client itself included, made odd): each client
    # masks with, and secret-shares to, only these. null: 2 ceil(log2 n) + 1 of the round's n clients.
    neighbours: int | None = Field(None, ge=3)
    # Bits per quantised value; the sum of a round's clients must fit the 32-bit modulus, so
    # num_clients x 2^bits < 2^32.
    bits: int = Field(20, ge=8, le=30)
    # R: every coordinate of an update is clipped to [-R, R] before quantisation (step 2R / (2^bits - 1)).
    # null: dp.clip_norm under dp, else 1.0.
    clip_range: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _used(self) -> SecAggConfig:
        if not self.enabled:
            refuse_ignored_settings(self, "secagg", "the server would see every update")
        return self


TrackerName = Literal["tensorboard", "wandb", "mlflow"]
"""The experiment trackers ``report_to`` names (the names transformers' ``report_to`` uses)."""

EvalMetric = Literal[
    "rougeL",
    "perplexity",
    "dist3",
    "dist4",
    "exact_match",
    "numeric_accuracy",
    "pass_at_1",
    "acc",
    "acc_norm",
]
# lm-eval's multiple-choice accuracies: they score only records with choices.
CHOICE_METRICS = ("acc", "acc_norm")


class EvalConfig(Section):
    metrics: list[EvalMetric] = ["rougeL", "perplexity"]
    every: int = Field(1, ge=1)
    before: bool = True
    max_examples: int | None = Field(32, ge=1)
    max_new_tokens: int = Field(48, ge=1)
    batch_size: int = Field(8, ge=1)
    temperature: float = Field(0.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    seeds: int = Field(1, ge=1)
    extra_datasets: list[str] = []
    # Client-side (personal) evaluation: every client evaluates its own model on its own held-out
    # split (data.holdout) at every eval round; metrics personal/<name> (mean over clients),
    # personal/<name>_weighted (by held-out size) and each client's own in eval_by_client.
    personal: bool = False


class AlgorithmConfig(Section):
    """Base of an algorithm's own config section (``cfg.<algorithm name>``), defined in its module."""

    modes: ClassVar[tuple[str, ...]] = ("federated",)
    """The ``fed.mode`` values the algorithm implements; any other is a config error before training."""
    personal_eval: ClassVar[bool] = False
    """Whether the algorithm has the client-side evaluation task (``eval.personal``)."""
    requires_personal_eval: ClassVar[bool] = False
    """A method whose models are all personal (no global model): ``eval.personal`` must be on."""
    dp_refused: ClassVar[str | None] = (
        "it does not declare client-level DP support (a method whose server moves its model only by "
        "Algorithm.aggregate of client tensors with the reference state sets dp_refused = None)"
    )
    """Why the method cannot run under ``dp`` (client-level differential privacy); None: its clients are
    sampled by ``Algorithm.sample_clients`` and every client-dependent change of the released model goes
    through ``Algorithm.aggregate(states, weights, reference)``, which clips, noises and accounts."""

    def dp_problem(self) -> str | None:
        """Why the method, so configured, cannot run under ``dp`` (default: ``dp_refused``)."""
        return self.dp_refused

    quantization_refused: ClassVar[str | None] = None
    """Why the method cannot train on a quantised base (``model.quantization``), e.g. because its
    clients' models are built from weights sent over the wire; None: the method loads its LoRA bases
    through ``Resources.model`` and ``model.quantization`` applies to them."""


class FlowerConfig(Section):
    """The Flower deployment (``fed.backend: flower``); see ``fedtune.flower``.

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


class RayConfig(Section):
    """The Ray backend (``fed.backend: ray``): a pool of persistent actors that run the clients' tasks.

    Client ``i`` is served by actor ``i % actors``; each actor loads the base models once and keeps its
    clients' data and state. ``num_cpus`` and ``num_gpus`` are what Ray reserves per actor (fractions
    of a GPU let several actors share one); the actor runs torch with ``int(num_cpus)`` threads.
    """

    # Persistent actors in the pool (more than there are clients: the extra ones are not started).
    actors: int = Field(2, ge=1)
    # CPUs Ray reserves for each actor; its torch thread count is int(num_cpus) (at least 1).
    num_cpus: float = Field(1.0, gt=0)
    # GPUs Ray reserves for each actor (0.5: two actors share a GPU); 0: the actors run on the CPU.
    num_gpus: float = Field(0.0, ge=0)
    # A running Ray cluster to join (`ray start --head` prints it, e.g. 10.0.0.5:6379; `auto`: the one
    # on this machine); null: start a private local instance sized to the actors.
    address: str | None = None


class ExperimentConfig(Section):
    name: str = "experiment"
    seed: int = 0
    algorithm: str = "fedit"
    output_dir: str | None = None
    progress: bool = True
    # Experiment trackers fed with every metrics.jsonl row (``fedtune.tracking``): TensorBoard event files
    # in <run dir>/tensorboard, W&B (offline unless WANDB_MODE says otherwise) and MLflow (a local store
    # in the run directory unless MLFLOW_TRACKING_URI names one). Each needs its extra, e.g.
    # ``pip install 'fedtune[wandb]'``; a resumed run continues the same tracked run.
    report_to: list[TrackerName] = []
    model: ModelConfig = ModelConfig()
    lora: LoraConfig = LoraConfig()
    data: DataConfig = DataConfig()
    train: TrainConfig = TrainConfig()
    fed: FedConfig = FedConfig()
    eval: EvalConfig = EvalConfig()
    flower: FlowerConfig = FlowerConfig()
    ray: RayConfig = RayConfig()
    dp: DPConfig = DPConfig()
    secagg: SecAggConfig = SecAggConfig()

    # The running algorithm's own section is an extra attribute named after it (``cfg.fedbiot``),
    # validated by that algorithm's ``Config`` class; no other algorithm's section is accepted.
    model_config = ConfigDict(extra="allow", validate_assignment=True)

    @model_validator(mode="before")
    @classmethod
    def _algorithm_section(cls, raw: Any) -> Any:
        if not isinstance(raw, dict):
            return raw
        raw = dict(raw)
        algorithm = raw.get("algorithm", cls.model_fields["algorithm"].default)
        problems = _top_level_problems(raw, algorithm)
        if problems:
            raise _problems(problems)
        section_class = config_class(algorithm)
        given = raw.get(algorithm)
        if not isinstance(given, section_class):
            try:
                given = section_class.model_validate({} if given is None else given)
            except ValidationError as exc:
                lines = [_describe(err, "", f"{algorithm}.", section_class) for err in exc.errors()]
                raise PydanticCustomError(
                    CONFIG_PROBLEMS, "{problems}", {"problems": "\n".join(lines)}
                ) from None
        raw[algorithm] = given
        return raw

    @field_validator("report_to", mode="before")
    @classmethod
    def _one_tracker_or_a_list(cls, value: Any) -> Any:
        # ``report_to: wandb`` (or ``report_to=wandb`` on the command line) means [wandb]; repeats count once.
        if isinstance(value, str):
            value = [value]
        return list(dict.fromkeys(value)) if isinstance(value, list) else value

    def section(self, name: str | None = None) -> Any:
        """The running algorithm's config section (``name``, if given, must be that algorithm)."""
        name = name or self.algorithm
        extra = self.__pydantic_extra__ or {}
        if name not in extra:
            raise KeyError(f"no config section {name!r}: the run's algorithm is {self.algorithm!r}")
        return extra[name]

    @model_validator(mode="after")
    def _check_consistency(self) -> ExperimentConfig:
        section = self.section()
        if section.requires_personal_eval and not self.eval.personal:
            raise ValueError(
                f"algorithm {self.algorithm!r} evaluates each client's own model: set eval.personal: true"
            )
        if self.eval.personal and not section.personal_eval:
            raise ValueError(f"eval.personal: algorithm {self.algorithm!r} has no client-side evaluation")
        if self.eval.personal and self.fed.mode == "centralized":
            raise ValueError("eval.personal needs clients: fed.mode centralized has a single one")
        modes = section.modes
        if self.fed.mode not in modes:
            raise ValueError(
                f"fed.mode {self.fed.mode!r} is not supported by algorithm {self.algorithm!r}; "
                f"it supports {', '.join(modes)}"
            )
        problem = _quantization_problem(self, section)
        if problem:
            raise ValueError(problem)
        problem = _dp_problem(self, section) or _secagg_problem(self, section)
        if problem:
            raise ValueError(problem)
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

    @model_validator(mode="after")
    def _check_choice_metrics(self) -> ExperimentConfig:
        problem = _choice_metric_problem(self)
        if problem:
            raise ValueError(problem)
        return self

    def run_dir(self) -> Path:
        return Path(self.output_dir) if self.output_dir else Path("runs") / self.name

    def to_yaml_dict(self) -> dict[str, Any]:
        """Every key with its value, the running algorithm's section included."""
        return self.model_dump(mode="json", by_alias=True)


_SECTIONS = {
    name
    for name, field in ExperimentConfig.model_fields.items()
    if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)
}
_TOP_LEVEL = {field.alias or name for name, field in ExperimentConfig.model_fields.items()}
CONFIG_PROBLEMS = "fedtune_config"


def _problems(lines: list[str]) -> PydanticCustomError:
    """Config problems found outside pydantic's own checks, reported through its error list."""
    return PydanticCustomError(CONFIG_PROBLEMS, "{problems}", {"problems": "\n".join(lines)})


def _quantization_problem(cfg: ExperimentConfig, section: AlgorithmConfig) -> str | None:
    """``model.quantization`` where the method refuses it, without bitsandbytes, or on a device
    bitsandbytes has no kernels for."""
    bits = cfg.model.quantization
    if bits is None:
        return None
    if section.quantization_refused:
        return (
            f"model.quantization {bits}: algorithm {cfg.algorithm!r} cannot train on a quantised base: "
            f"{section.quantization_refused}; remove model.quantization (null)"
        )
    if importlib.util.find_spec("bitsandbytes") is None:
        return (
            f"model.quantization {bits} needs bitsandbytes, which is not installed: "
            "pip install 'fedtune[quant]'"
        )
    device = cfg.model.device.split(":")[0]
    if device not in ("auto", "cpu", "cuda"):
        return f"model.quantization {bits}: bitsandbytes runs on cpu or cuda, not model.device {device!r}"
    return None


def _dp_problem(cfg: ExperimentConfig, section: AlgorithmConfig) -> str | None:
    """What ``dp.enabled`` cannot run with: a method that refuses it, a mode without aggregation, a robust
    aggregator or the median screen (whose choices depend on the other clients' updates, so one client
    could change what many contribute: the sum's sensitivity would no longer be ``dp.clip_norm``).

    ``fed.screen`` left at its default is switched off here; one set explicitly is an error."""
    if not cfg.dp.enabled:
        return None
    if importlib.util.find_spec("dp_accounting") is None:
        return "dp.enabled needs dp-accounting, which is not installed: pip install 'fedtune[dp]'"
    refused = section.dp_problem()
    if refused:
        return (
            f"dp.enabled: algorithm {cfg.algorithm!r} cannot run with client-level differential privacy: "
            f"{refused}; set dp.enabled: false"
        )
    if cfg.fed.mode != "federated":
        return (
            f"dp.enabled: fed.mode {cfg.fed.mode!r} aggregates nothing across clients, so there is no "
            "noised mean to protect them; use fed.mode: federated or dp.enabled: false"
        )
    if cfg.fed.aggregator != "mean":
        return (
            f"dp.enabled: fed.aggregator {cfg.fed.aggregator!r} has no sensitivity bound the accountant "
            "covers; under dp every update is clipped to dp.clip_norm (which bounds a lying client too): "
            "set fed.aggregator: mean"
        )
    if cfg.fed.screen is not None:
        if "screen" in cfg.fed.model_fields_set:
            return (
                "dp.enabled: fed.screen drops a reply by comparing it with the other replies' median, so "
                "one client could change what others contribute and the sum's sensitivity would exceed "
                "dp.clip_norm; under dp clipping bounds every reply instead: set fed.screen: null"
            )
        cfg.fed.screen = None
    return None


def _secagg_problem(cfg: ExperimentConfig, section: AlgorithmConfig) -> str | None:
    """What ``secagg.enabled`` cannot run with: the methods and settings ``dp`` refuses (the protocol sums
    the same updates ``Algorithm.aggregate`` combines), per-reply screening (the server sees no single
    reply) and a sum that would overflow the 32-bit modulus."""
    if not cfg.secagg.enabled:
        return None
    refused = section.dp_problem()
    if refused:
        return (
            f"secagg.enabled: algorithm {cfg.algorithm!r} cannot aggregate securely: {refused}; "
            "set secagg.enabled: false"
        )
    if cfg.fed.mode != "federated":
        return f"secagg.enabled: fed.mode {cfg.fed.mode!r} has no sum of client updates to protect"
    if cfg.fed.aggregator != "mean":
        return (
            f"secagg.enabled: fed.aggregator {cfg.fed.aggregator!r} needs every update, and the server only "
            "learns their sum: set fed.aggregator: mean"
        )
    if cfg.fed.screen is not None:
        if "screen" in cfg.fed.model_fields_set:
            return (
                "secagg.enabled: fed.screen compares single replies, which the server no longer sees (the "
                "clients clip and check their own updates): set fed.screen: null"
            )
        cfg.fed.screen = None
    clients = cfg.data.partition.num_clients
    per_round = cfg.fed.clients_per_round
    expected = per_round if per_round is not None else max(1, round(cfg.fed.fraction * clients))
    if expected < 2:
        key = (
            f"fed.clients_per_round = {per_round}"
            if per_round is not None
            else f"fed.fraction = {cfg.fed.fraction:g} of {clients} clients"
        )
        return (
            f"secagg.enabled: {key} gives rounds of one client, whose secure sum would be its own update "
            "(the protocol leaves a lone client out, so no round would aggregate anything): sample at "
            "least 2 clients a round"
        )
    if clients * ((1 << cfg.secagg.bits) - 1) >= 1 << 32:
        most = max(bits for bits in range(1, 33) if clients * ((1 << bits) - 1) < 1 << 32)
        return (
            f"secagg.bits {cfg.secagg.bits}: the sum of {clients} clients' values overflows the 32-bit "
            f"modulus; use secagg.bits <= {most}"
        )
    return None


def _choice_metric_problem(cfg: ExperimentConfig) -> str | None:
    """``acc`` / ``acc_norm`` asked of a built-in dataset without choices, named by its config key.

    Files are not opened here: a record without choices there stops the evaluation instead.
    """
    wanted = [metric for metric in cfg.eval.metrics if metric in CHOICE_METRICS]
    if not wanted:
        return None
    tasks = {info.name: info.task for info in list_builtin()}
    evaluated = {"data.eval_dataset": cfg.data.eval_dataset} if cfg.data.eval_dataset else {}
    if not cfg.data.eval_dataset or cfg.eval.personal:
        evaluated["data.dataset"] = cfg.data.dataset
    evaluated.update({f"eval.extra_datasets[{i}]": name for i, name in enumerate(cfg.eval.extra_datasets)})
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


def _top_level_problems(raw: dict[str, Any], algorithm: Any) -> list[str]:
    """Unknown top-level keys, an unknown algorithm, and sections of algorithms that are not running."""
    names = algorithm_names()
    problems = []
    if algorithm not in names:
        close = difflib.get_close_matches(str(algorithm), names, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        problems.append(
            f"config key 'algorithm': unknown algorithm {algorithm!r}{hint}; registered: {', '.join(names)}"
        )
    for key in raw:
        if key in _TOP_LEVEL or key == algorithm:
            continue
        section = raw[key]
        if key in names:
            field = sorted(section)[0] if isinstance(section, dict) and section else None
            shown = f"{key}.{field}" if field else key
            problems.append(
                f"config key '{shown}' belongs to algorithm '{key}', but algorithm is "
                f"'{algorithm}' (remove the '{key}' section or set algorithm: {key})"
            )
            continue
        choices = [*_known_keys(ExperimentConfig), *names]
        suggestion = difflib.get_close_matches(key, choices, n=1, cutoff=0.6)
        hint = f" (did you mean '{suggestion[0]}'?)" if suggestion else ""
        problems.append(f"unknown config key '{key}'{hint}")
    return problems


def _known_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    keys = []
    for name, field in model.model_fields.items():
        key = prefix + (field.alias or name)
        keys.append(key)
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            keys.extend(_known_keys(annotation, key + "."))
    return keys


def _describe(error: Any, source: str, prefix: str = "", schema: type[BaseModel] | None = None) -> str:
    """One validation error as ``source: config key 'dotted.key': what is wrong`` (lines, if several)."""
    lead = f"{source}: " if source else ""
    if error["type"] == CONFIG_PROBLEMS:
        return "\n".join(lead + line for line in str(error["msg"]).splitlines())
    key = prefix + (".".join(str(part) for part in error["loc"]) or "<root>")
    if error["type"] == "extra_forbidden":
        known = _known_keys(schema or ExperimentConfig, prefix)
        suggestion = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
        hint = f" (did you mean '{suggestion[0]}'?)" if suggestion else ""
        return f"{lead}unknown config key '{key}'{hint}"
    got = error.get("input")
    shown = "" if isinstance(got, dict) else f", got {got!r}"
    return f"{lead}config key '{key}': {error['msg']}{shown}"


def validate_config(raw: dict[str, Any], source: str = "config") -> ExperimentConfig:
    """The validated config; a section set to null (``fedpt=null`` on the command line) is dropped."""
    sections = _SECTIONS | set(algorithm_names())
    raw = {key: value for key, value in raw.items() if not (value is None and key in sections)}
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
