"""The experiment config: one validated schema, YAML files plus dotted ``key=value`` overrides.

Unknown keys are errors with a "did you mean"; wrong types name the full dotted key.
``algorithm:`` picks the method; its own section (``fedbiot:`` ...) is validated by the ``Config``
class that the algorithm's module defines (``fedtune.plugins`` finds it), and a section of any other
algorithm is an error.

Layout: a module per section (``model``, ``data``, ``train``, ``fed``, ``eval``, ``privacy`` for dp and
secagg, ``deploy`` for flower and ray), ``algorithm`` (the base of a method's section), ``experiment``
(the whole schema), ``rules`` (what one section requires of another), ``parse`` (YAML, overrides, error
messages) and ``load`` (files and run directories to validated configs). Every section class is a plain
pydantic model; a key's documentation is the string under its field (``docs/config.md`` is generated
from them).
"""

from fedtune.config.algorithm import AlgorithmConfig
from fedtune.config.base import ConfigError, Section
from fedtune.config.data import DataConfig, PartitionConfig
from fedtune.config.deploy import FlowerConfig, RayConfig
from fedtune.config.eval import CHOICE_METRICS, EvalConfig, EvalMetric
from fedtune.config.experiment import ExperimentConfig, TrackerName
from fedtune.config.fed import FedConfig
from fedtune.config.load import dump_config, load_config, load_run_config, validate_config
from fedtune.config.model import LoraConfig, ModelConfig
from fedtune.config.parse import apply_overrides, parse_override, read_yaml
from fedtune.config.privacy import DPConfig, SecAggConfig
from fedtune.config.train import TrainConfig

__all__ = [
    "CHOICE_METRICS",
    "AlgorithmConfig",
    "ConfigError",
    "DPConfig",
    "DataConfig",
    "EvalConfig",
    "EvalMetric",
    "ExperimentConfig",
    "FedConfig",
    "FlowerConfig",
    "LoraConfig",
    "ModelConfig",
    "PartitionConfig",
    "RayConfig",
    "SecAggConfig",
    "Section",
    "TrackerName",
    "TrainConfig",
    "apply_overrides",
    "dump_config",
    "load_config",
    "load_run_config",
    "parse_override",
    "read_yaml",
    "validate_config",
]
