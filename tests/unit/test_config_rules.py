"""The cross-section rules are pure checks; switching the median screen off under dp or secagg is a step
of validation of its own."""

from __future__ import annotations

import pytest

from fedtune.config import ConfigError, DPConfig, FedConfig, PartitionConfig, SecAggConfig, validate_config
from fedtune.config.rules import dp_problem, screen_left_on, secagg_problem
from fedtune.plugins import config_class

DP_ON = {"enabled": True, "noise_multiplier": 1.0, "clip_norm": 1.0}


def test_the_dp_and_secagg_checks_leave_a_default_screen_as_it_is() -> None:
    # Prepare: everything dp and secagg accept, with the screen at its default
    section = config_class("fedit")()
    fed = FedConfig()
    dp, secagg = DPConfig(**DP_ON), SecAggConfig(enabled=True)
    # Execute
    problems = (
        dp_problem("fedit", section, dp, fed),
        secagg_problem("fedit", section, secagg, fed, PartitionConfig()),
    )
    # Assert: no problem, and the check changed nothing
    assert problems == (None, None)
    assert fed.screen == 10.0 and "screen" not in fed.model_fields_set


@pytest.mark.parametrize(
    ("dp", "secagg", "fed", "left_on"),
    [
        (DPConfig(**DP_ON), SecAggConfig(), FedConfig(), True),
        (DPConfig(), SecAggConfig(enabled=True), FedConfig(), True),
        (DPConfig(), SecAggConfig(), FedConfig(), False),
        (DPConfig(**DP_ON), SecAggConfig(), FedConfig(screen=None), False),
    ],
)
def test_screen_left_on_is_the_default_screen_under_dp_or_secagg(
    dp: DPConfig, secagg: SecAggConfig, fed: FedConfig, left_on: bool
) -> None:
    assert screen_left_on(dp, secagg, fed) is left_on


@pytest.mark.parametrize(
    "overrides", [{"dp": DP_ON}, {"secagg": {"enabled": True}}, {"dp": DP_ON, "secagg": {}}]
)
def test_validation_switches_the_default_screen_off_and_a_dumped_config_validates_the_same(
    overrides: dict,
) -> None:
    # Execute
    cfg = validate_config(dict(overrides))
    again = validate_config(cfg.to_yaml_dict())
    # Assert
    assert cfg.fed.screen is None and again.fed.screen is None
    assert again == cfg


@pytest.mark.parametrize("section", ["dp", "secagg"])
def test_a_screen_set_explicitly_under_dp_or_secagg_is_refused(section: str) -> None:
    raw = {section: DP_ON if section == "dp" else {"enabled": True}, "fed": {"screen": 5}}
    with pytest.raises(ConfigError, match=rf"{section}\.enabled: fed\.screen .*set fed\.screen: null"):
        validate_config(raw)


@pytest.mark.parametrize(
    ("device", "num_gpus", "refused"),
    [
        ("cuda:1", 1, True),
        ("cuda:3", 0.5, True),
        ("cuda:0", 1, False),
        ("cuda", 1, False),
        ("cuda:1", 0, False),
    ],
)
def test_a_gpu_index_that_ray_actors_cannot_see_is_refused(
    device: str, num_gpus: float, refused: bool
) -> None:
    # Ray shows an actor that reserves GPUs only its own, as cuda:0
    raw = {"model": {"device": device}, "fed": {"backend": "ray"}, "ray": {"num_gpus": num_gpus}}
    if refused:
        with pytest.raises(ConfigError, match=rf"model.device '{device}' with fed.backend ray .*as cuda:0"):
            validate_config(raw)
    else:
        assert validate_config(raw).model.device == device
    assert validate_config({**raw, "fed": {"backend": "simulation"}}).model.device == device
