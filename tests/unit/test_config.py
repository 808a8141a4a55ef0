from __future__ import annotations

from pathlib import Path

import pytest

from fedtune.config import ConfigError, load_config, validate_config


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    return path


def test_defaults_validate() -> None:
    cfg = validate_config({})
    assert cfg.algorithm == "fedit"
    assert cfg.fed.rounds >= 1


def test_overrides_are_typed_and_nested(tmp_path: Path) -> None:
    path = write(tmp_path, "name: x\nfed:\n  rounds: 2\n")
    cfg = load_config(
        path, ["fed.rounds=5", "train.lr=0.5", "lora.target_modules=[q_proj]", "data.schema=dolly"]
    )
    assert cfg.fed.rounds == 5
    assert cfg.train.lr == 0.5
    assert cfg.lora.target_modules == ["q_proj"]
    assert cfg.data.schema_ == "dolly"


def test_unknown_key_suggests_the_right_one(tmp_path: Path) -> None:
    path = write(tmp_path, "train:\n  lrr: 0.1\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert "train.lrr" in str(err.value)
    assert "did you mean 'train.lr'" in str(err.value)
    assert str(path) in str(err.value)


def test_misspelt_override_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"did you mean 'fed\.rounds'"):
        load_config(write(tmp_path, ""), ["fed.round=3"])


def test_wrong_type_names_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"config key 'fed\.rounds'.*'many'"):
        load_config(write(tmp_path, "fed:\n  rounds: many\n"))


def test_unknown_algorithm_lists_registered(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="fedit"):
        load_config(write(tmp_path, "algorithm: fedsomething\n"))


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "absent.yaml")


def test_bad_override_form(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="key=value"):
        load_config(write(tmp_path, ""), ["fed.rounds"])


def test_non_mapping_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="mapping"):
        load_config(write(tmp_path, "- a\n- b\n"))


def test_shipped_configs_validate() -> None:
    root = Path(__file__).resolve().parents[2] / "configs"
    paths = sorted(root.rglob("*.yaml"))
    assert paths
    for path in paths:
        load_config(path)


@pytest.mark.parametrize(("algorithm", "mode"), [("fedbiot", "standalone"), ("fedpt", "centralized")])
def test_a_mode_the_algorithm_does_not_implement_is_a_config_error(algorithm: str, mode: str) -> None:
    with pytest.raises(ConfigError, match=rf"fed.mode '{mode}' is not supported by algorithm '{algorithm}'"):
        validate_config({"algorithm": algorithm, "fed": {"mode": mode}})


def test_every_algorithm_declares_the_modes_it_supports() -> None:
    from fedtune.algorithms.registry import algorithm_names, get_algorithm

    for name in algorithm_names():
        modes = get_algorithm(name).Config.modes
        assert "federated" in modes and set(modes) <= {"federated", "standalone", "centralized"}


@pytest.mark.parametrize(
    ("algorithm", "override", "key"),
    [
        ("fedit", "fedbiot.dropout=0.3", "fedbiot.dropout"),
        ("fedpt", "fedit.prox_mu=0.1", "fedit.prox_mu"),
        ("fedpt", "fedit.server_lr=0.5", "fedit.server_lr"),
        ("fedbiot", "fedpt.alpha=1.5", "fedpt.alpha"),
    ],
)
def test_a_key_of_an_algorithm_that_is_not_running_is_an_error(
    algorithm: str, override: str, key: str, tmp_path: Path
) -> None:
    path = write(tmp_path, f"algorithm: {algorithm}\n")
    with pytest.raises(ConfigError, match=rf"config key '{key}' belongs to algorithm"):
        load_config(path, [override])


def test_a_run_config_written_with_every_section_still_loads(tmp_path: Path) -> None:
    import yaml

    from fedtune.config import dump_config, load_run_config

    cfg = validate_config({"algorithm": "fedpt", "fedpt": {"alpha": 1.5}})
    dump_config(cfg, tmp_path / "config.yaml")
    assert "fedit" not in yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert load_run_config(tmp_path).fedpt.alpha == 1.5
    # A run directory from before: every algorithm's section, with its defaults.
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json", by_alias=True)))
    assert load_run_config(tmp_path).fedpt.alpha == 1.5


def test_a_section_set_to_null_is_dropped(tmp_path: Path) -> None:
    path = write(tmp_path, "algorithm: fedpt\nfedpt:\n  alpha: 1.5\n")
    cfg = load_config(path, ["algorithm=fedit", "fedpt=null"])
    assert cfg.algorithm == "fedit" and cfg.section().prox_mu == 0.0
    with pytest.raises(KeyError, match="no config section 'fedpt'"):
        cfg.section("fedpt")


@pytest.mark.parametrize("override", ["fed.rounds=true", "train.batch_size=false", "train.lr=true"])
def test_a_boolean_where_a_number_belongs_is_a_type_error(override: str, tmp_path: Path) -> None:
    key = override.split("=")[0]
    with pytest.raises(ConfigError, match=rf"config key '{key}': .*boolean"):
        load_config(write(tmp_path, ""), [override])


def test_booleans_still_set_boolean_keys(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, ""), ["eval.before=false"]).eval.before is False


def test_clients_per_round_above_the_number_of_clients_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"fed.clients_per_round = 9 is larger than data.partition.num_clients"
    ):
        load_config(write(tmp_path, ""), ["fed.clients_per_round=9"])


def test_an_algorithm_section_gets_the_same_key_checks(tmp_path: Path) -> None:
    path = write(tmp_path, "algorithm: fedbiot\nfedbiot:\n  dropuot: 0.3\n")
    with pytest.raises(
        ConfigError, match=r"unknown config key 'fedbiot.dropuot' \(did you mean 'fedbiot.dropout'"
    ):
        load_config(path)
    with pytest.raises(ConfigError, match=r"config key 'fedbiot.dropout': .*less than 1"):
        load_config(write(tmp_path, "algorithm: fedbiot\nfedbiot:\n  dropout: 1.5\n"))
    with pytest.raises(ConfigError, match=r"unknown config key 'fedbiott' \(did you mean 'fedbiot'"):
        load_config(write(tmp_path, "algorithm: fedit\nfedbiott: {}\n"))


def test_the_running_algorithms_section_is_validated_by_its_own_config_class() -> None:
    from fedtune.algorithms.fedbiot import FedBiOTConfig

    cfg = validate_config({"algorithm": "fedbiot", "fedbiot": {"dropout": 0.5}})
    assert isinstance(cfg.section(), FedBiOTConfig) and cfg.fedbiot.dropout == 0.5
    assert cfg.to_yaml_dict()["fedbiot"]["dropout"] == 0.5
    assert "fedpt" not in cfg.to_yaml_dict()


def test_an_algorithm_registered_at_run_time_brings_its_section(tmp_path: Path) -> None:
    from fedtune.algorithms.fedavgm import FedAvgM, FedAvgMConfig
    from fedtune.plugins import register

    class Lookahead(FedAvgMConfig):
        steps: int = 2

    @register
    class FedLookahead(FedAvgM):
        name = "fedlookahead"
        Config = Lookahead  # type: ignore[assignment]

    cfg = validate_config({"algorithm": "fedlookahead", "fedlookahead": {"steps": 3}})
    assert cfg.section().steps == 3 and cfg.section().momentum == 0.9


def test_the_ray_section_validates_each_key(tmp_path: Path) -> None:
    path = write(tmp_path, "fed:\n  backend: ray\n")
    cfg = load_config(path, ["ray.actors=4", "ray.num_gpus=0.5", "ray.address=10.0.0.5:6379"])
    assert (cfg.fed.backend, cfg.ray.actors, cfg.ray.num_cpus) == ("ray", 4, 1.0)
    assert (cfg.ray.num_gpus, cfg.ray.address) == (0.5, "10.0.0.5:6379")
    assert validate_config({}).ray.address is None
    with pytest.raises(ConfigError, match=r"unknown config key 'ray.actor' \(did you mean 'ray.actors'"):
        load_config(path, ["ray.actor=2"])
    for bad in ("ray.actors=0", "ray.num_cpus=0", "ray.num_gpus=-1"):
        with pytest.raises(ConfigError, match=rf"config key '{bad.split('=')[0]}'"):
            load_config(path, [bad])
