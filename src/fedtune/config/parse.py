"""From text to a raw config and from pydantic's errors back to the user: YAML files, dotted ``key=value``
overrides, and each problem as ``source: config key 'dotted.key': what is wrong`` with a "did you mean"."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from fedtune.config.base import CONFIG_PROBLEMS, ConfigError
from fedtune.plugins import algorithm_names
from fedtune.suggest import closest


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


def known_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every dotted key of ``model``, nested sections' included (``fed``, ``fed.rounds``, ...)."""
    keys = []
    for name, field in model.model_fields.items():
        key = prefix + (field.alias or name)
        keys.append(key)
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            keys.extend(known_keys(annotation, key + "."))
    return keys


def top_level_problems(raw: dict[str, Any], algorithm: Any, schema: type[BaseModel]) -> list[str]:
    """Unknown top-level keys of ``schema``, an unknown algorithm, and sections of algorithms that are not
    running."""
    names = algorithm_names()
    top_level = {field.alias or name for name, field in schema.model_fields.items()}
    problems = []
    if algorithm not in names:
        close = closest(str(algorithm), names)
        hint = f" (did you mean '{close}'?)" if close else ""
        problems.append(
            f"config key 'algorithm': unknown algorithm {algorithm!r}{hint}; registered: {', '.join(names)}"
        )
    for key in raw:
        if key in top_level or key == algorithm:
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
        suggestion = closest(key, [*known_keys(schema), *names])
        hint = f" (did you mean '{suggestion}'?)" if suggestion else ""
        problems.append(f"unknown config key '{key}'{hint}")
    return problems


def describe(error: Any, source: str, schema: type[BaseModel], prefix: str = "") -> str:
    """One validation error of ``schema`` as ``source: config key 'dotted.key': what is wrong`` (lines, if
    several); ``prefix`` is where the schema sits in the config (``fedpt.``)."""
    lead = f"{source}: " if source else ""
    if error["type"] == CONFIG_PROBLEMS:
        return "\n".join(lead + line for line in str(error["msg"]).splitlines())
    key = prefix + (".".join(str(part) for part in error["loc"]) or "<root>")
    if error["type"] == "extra_forbidden":
        suggestion = closest(key, known_keys(schema, prefix))
        hint = f" (did you mean '{suggestion}'?)" if suggestion else ""
        return f"{lead}unknown config key '{key}'{hint}"
    got = error.get("input")
    shown = "" if isinstance(got, dict) else f", got {got!r}"
    return f"{lead}config key '{key}': {error['msg']}{shown}"
