"""Reading, validating and writing whole configs: a YAML file plus overrides, a run directory's
``config.yaml``, a config dict from elsewhere (a Ray actor, a Flower node)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from fedtune.config.base import ConfigError
from fedtune.config.experiment import ExperimentConfig
from fedtune.config.parse import apply_overrides, describe, read_yaml
from fedtune.plugins import algorithm_names

_SECTIONS = {
    name
    for name, field in ExperimentConfig.model_fields.items()
    if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)
}


def validate_config(raw: dict[str, Any], source: str = "config") -> ExperimentConfig:
    """The validated config; a section set to null (``fedpt=null`` on the command line) is dropped."""
    sections = _SECTIONS | set(algorithm_names())
    raw = {key: value for key, value in raw.items() if not (value is None and key in sections)}
    try:
        return ExperimentConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(
            "\n".join(describe(err, source, ExperimentConfig) for err in exc.errors())
        ) from None


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
