"""The whole experiment config: the top-level keys, every common section, and the running algorithm's own
section (``fedbiot:`` ...), validated by the ``Config`` class ``fedtune.plugins`` finds for it without
importing the algorithm. The cross-section rules (``rules``) run after the sections are valid."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator

from fedtune.config.base import Section, config_problems
from fedtune.config.data import DataConfig
from fedtune.config.deploy import FlowerConfig, RayConfig
from fedtune.config.eval import EvalConfig
from fedtune.config.fed import FedConfig
from fedtune.config.model import LoraConfig, ModelConfig
from fedtune.config.parse import describe, top_level_problems
from fedtune.config.privacy import DPConfig, SecAggConfig
from fedtune.config.rules import (
    choice_metric_problem,
    dp_problem,
    mode_problem,
    personal_eval_problem,
    quantization_problem,
    ray_device_problem,
    replies_problem,
    screen_left_on,
    secagg_problem,
)
from fedtune.config.train import TrainConfig
from fedtune.plugins import config_class

TrackerName = Literal["tensorboard", "wandb", "mlflow"]
"""The experiment trackers ``report_to`` names (the names transformers' ``report_to`` uses)."""


class ExperimentConfig(Section):
    name: str = "experiment"
    """The run's name; the run directory is `runs/<name>` unless `output_dir` is set."""
    seed: int = 0
    """Every random choice (sampling, partitions, dropout, evaluation subsets) derives from it."""
    algorithm: str = "fedit"
    """The method that runs; its own section (below) is validated by its config class."""
    output_dir: str | None = None
    """The run directory (default `runs/<name>`)."""
    progress: bool = True
    """Show progress: bars on a terminal; elsewhere (a pipe, a log, CI) one plain line per phase and per
    finished client task."""
    report_to: list[TrackerName] = Field(default_factory=list)
    """Experiment trackers fed with every metrics.jsonl row (``fedtune.tracking``): TensorBoard event files
    in <run dir>/tensorboard, W&B (offline unless WANDB_MODE says otherwise) and MLflow (a local store
    in the run directory unless MLFLOW_TRACKING_URI names one). Each needs its extra, e.g.
    ``pip install 'fedtune[wandb]'``; a resumed run continues the same tracked run."""
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
        problems = top_level_problems(raw, algorithm, cls)
        if problems:
            raise config_problems(problems)
        section_class = config_class(algorithm)
        given = raw.get(algorithm)
        if not isinstance(given, section_class):
            try:
                given = section_class.model_validate({} if given is None else given)
            except ValidationError as exc:
                lines = [describe(err, "", section_class, f"{algorithm}.") for err in exc.errors()]
                raise config_problems(lines) from None
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
        algorithm, section = self.algorithm, self.section()
        problem = (
            personal_eval_problem(algorithm, section, self.eval, self.fed, self.data)
            or mode_problem(algorithm, section, self.fed)
            or quantization_problem(algorithm, section, self.model)
            or dp_problem(algorithm, section, self.dp, self.fed)
            or secagg_problem(algorithm, section, self.secagg, self.fed, self.data.partition)
            or replies_problem(self.fed, self.data.partition)
            or ray_device_problem(self.fed, self.ray, self.model)
        )
        if problem:
            raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _screen_off_under_dp_or_secagg(self) -> ExperimentConfig:
        # The median screen compares single replies, which dp's sensitivity bound and secagg's sum rule out;
        # set explicitly it was refused above, left at its default it is switched off here.
        if screen_left_on(self.dp, self.secagg, self.fed):
            self.fed.screen = None
        return self

    @model_validator(mode="after")
    def _check_choice_metrics(self) -> ExperimentConfig:
        problem = choice_metric_problem(self.eval, self.data)
        if problem:
            raise ValueError(problem)
        return self

    def run_dir(self) -> Path:
        return Path(self.output_dir) if self.output_dir else Path("runs") / self.name

    def to_yaml_dict(self) -> dict[str, Any]:
        """Every key with its value, the running algorithm's section included."""
        return self.model_dump(mode="json", by_alias=True)
