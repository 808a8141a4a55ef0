"""What every config section shares: unknown keys are errors, assignments are validated, a boolean is no
number; and the error every config problem ends in."""

from __future__ import annotations

from typing import Any, get_args

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError


class ConfigError(ValueError):
    """A config problem; the message names the file and the dotted key."""


CONFIG_PROBLEMS = "fedtune_config"
"""The pydantic error type of problems found outside pydantic's own checks (already described lines)."""


def config_problems(lines: list[str]) -> PydanticCustomError:
    """Config problems found outside pydantic's own checks, reported through its error list."""
    return PydanticCustomError(CONFIG_PROBLEMS, "{problems}", {"problems": "\n".join(lines)})


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
