"""The Ray backend: the same runs as in-process, resume, a killed actor, and the errors a user meets.

One local Ray instance (two CPUs) serves the whole module; each run starts its own two actors and ends
them. Hooks given to the runner travel to the actors pickled, so those that must run there are local
functions that need nothing from this module.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from fedtune.algorithms.registry import algorithm_names, get_algorithm
from fedtune.errors import RunError
from fedtune.fl.checkpoint import latest_checkpoint, load_checkpoint
from tests.integration.flower_support import assert_close
from tests.integration.helpers import ROOT, default_tier, quiet_runner, stable, tiny_config

RAY = ("fed.backend=ray", "ray.actors=2")


class Interrupt(BaseException):
    """Stands for the server dying: not an Exception, so nothing inside the run catches it."""


@pytest.fixture(scope="module")
def ray_instance() -> Iterator[Any]:
    ray = pytest.importorskip("ray")
    started = not ray.is_initialized()
    if started:
        # The actors unpickle the fedtune modules and this test package: both on their path. Ray's
        # memory monitor is off: on a shared machine another job's memory would get our actors killed.
        paths = [str(ROOT), str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]
        env = {"PYTHONPATH": os.pathsep.join(p for p in paths if p), "RAY_memory_monitor_refresh_ms": "0"}
        with pytest.MonkeyPatch.context() as patch:
            for key, value in env.items():
                patch.setenv(key, value)
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    yield ray
    if started:
        ray.shutdown()


# Every registered algorithm, in the default tier: 10-25 s each on two cores, most of it the actors
# starting (importing torch, building the data). Those in helpers.SLOW_ON_SHARED_BACKENDS: slow tier only.
@pytest.mark.parametrize("algorithm", default_tier(algorithm_names()))
def test_ray_run_equals_in_process(algorithm: str, ray_instance: Any, tmp_path: Path) -> None:
    expected = quiet_runner(tiny_config(algorithm), tmp_path / "simulation").run()
    actual = quiet_runner(tiny_config(algorithm, *RAY), tmp_path / "ray").run()
    assert_close(stable(actual), stable(expected))
    assert set(actual[1]["actor_peak_rss_mb"]) == {"actor0", "actor1"}
    states = {}
    for name in ("simulation", "ray"):
        tree = load_checkpoint(latest_checkpoint(tmp_path / name))  # type: ignore[arg-type]
        states[name] = tree["federation"]["clients"]
    assert set(states["ray"]) == set(states["simulation"])
    for client, state in states["simulation"].items():
        assert set(states["ray"][client]) == set(state), client


def test_secure_aggregation_personal_eval_and_fp16_wire_on_ray(ray_instance: Any, tmp_path: Path) -> None:
    # SecAgg+ keeps each client's masked arrays in its state between tasks (on its actor); the
    # clients' held-out splits and the fp16 wire are rebuilt from the config in the actors.
    options = ("secagg.enabled=true", "eval.personal=true", "data.holdout=0.2", "fed.wire_dtype=fp16")
    expected = quiet_runner(tiny_config("fedit", *options), tmp_path / "simulation").run()
    actual = quiet_runner(tiny_config("fedit", *options, *RAY), tmp_path / "ray").run()
    assert_close(stable(actual), stable(expected))
    assert "eval_by_client" in actual[-1]


def test_ray_resume_equals_uninterrupted(
    ray_instance: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # PerFIT keeps each client's mask and values on the client: the state the actors hold must come
    # back through the checkpoint.
    from fedtune.fl.ray_backend import RayFederation

    cfg = tiny_config("perfit", *RAY, "fed.rounds=3")
    full = quiet_runner(cfg, tmp_path / "full").run()
    begin = RayFederation.begin_round

    def die_in_round_2(self: RayFederation, rnd: int) -> None:
        if rnd == 2:
            raise Interrupt
        begin(self, rnd)

    with monkeypatch.context() as patch:
        patch.setattr(RayFederation, "begin_round", die_in_round_2)
        with pytest.raises(Interrupt):
            quiet_runner(cfg, tmp_path / "cut").run()
    resumed = quiet_runner(cfg, tmp_path / "cut").run(resume=True)
    resent = get_algorithm("perfit").resends_after_restart
    assert [row["round"] for row in resumed] == [0, 1, 2, 3]
    assert_close(without(stable(resumed), resent, 2), without(stable(full), resent, 2))


def without(rows: list[dict[str, Any]], keys: tuple[str, ...], index: int) -> list[dict[str, Any]]:
    return [{k: v for k, v in row.items() if i != index or k not in keys} for i, row in enumerate(rows)]


def test_actor_killed_mid_round(ray_instance: Any, tmp_path: Path) -> None:
    # Clients c00 and c02 live on actor 0; its process exits in c00's round-1 task.
    cfg = tiny_config("fedit", *RAY, "fed.min_replies=2", "fed.rounds=3")

    def kill_actor(client: str, task: str, rnd: int) -> None:
        if client == "c00" and rnd == 1:
            os._exit(1)

    history = quiet_runner(cfg, tmp_path / "run", before_task=kill_actor).run()
    first = history[1]
    assert set(first["failed"]) == {"c00", "c02"}
    assert all("ray actor 0 died" in reason for reason in first["failed"].values())
    assert first["num_examples"] > 0
    for row in history[2:]:  # the replaced actor serves its clients again
        assert row["failed"] == {} and row["rejected"] == {}
        assert set(row["clients"]) == {"c00", "c01", "c02", "c03"}
    assert all(np.isfinite(v) for v in history[-1]["eval"].values())


def test_missing_extra_names_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    with pytest.raises(RunError, match=r"pip install 'fedtune\[ray\]'"):
        quiet_runner(tiny_config("fedit", *RAY), tmp_path / "run").run()
    assert not (tmp_path / "run").exists()


def test_unreachable_address_fails_fast_naming_it(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    start = time.monotonic()
    with pytest.raises(RunError, match=r"ray.address '127.0.0.1:1'"):
        quiet_runner(tiny_config("fedit", *RAY, "ray.address=127.0.0.1:1"), tmp_path / "run").run()
    assert time.monotonic() - start < 120  # seconds, not Ray's minutes of retries


def test_cli_runs_and_resumes_on_ray(ray_instance: Any, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from fedtune.cli import app

    config = str(ROOT / "configs" / "test" / "fedit-tiny.yaml")
    cli = CliRunner()
    run_dir = tmp_path / "run"
    result = cli.invoke(app, ["run", config, "fed.rounds=1", "--backend", "ray", "-o", str(run_dir)])
    assert result.exit_code == 0, result.output
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["fed"]["backend"] == "ray"
    result = cli.invoke(app, ["resume", str(run_dir)])  # on Ray again, from the saved config
    assert result.exit_code == 0, result.output
    bad = ["run", config, "ray.address=127.0.0.1:1", "--backend", "ray", "-o", str(tmp_path / "bad")]
    result = cli.invoke(app, bad)
    assert result.exit_code == 2
    assert "ray.address '127.0.0.1:1'" in result.output


def test_a_pool_larger_than_the_instance_is_refused_naming_the_keys() -> None:
    from types import SimpleNamespace

    from fedtune.config import RayConfig
    from fedtune.fl.ray_backend import check_capacity

    instance = SimpleNamespace(cluster_resources=lambda: {"CPU": 4.0, "GPU": 1.0})
    check_capacity(instance, RayConfig(actors=2, num_cpus=2, num_gpus=0.5), 2)
    with pytest.raises(RunError, match=r"ray.actors 3 x ray.num_cpus 2 = 6 CPUs, but the Ray instance has 4"):
        check_capacity(instance, RayConfig(actors=3, num_cpus=2), 3)
    with pytest.raises(RunError, match=r"ray.num_gpus 1 = 2 GPUs"):
        check_capacity(instance, RayConfig(actors=2, num_gpus=1), 2)


def test_an_actor_that_cannot_build_the_run_is_reported_by_its_own_exception() -> None:
    from fedtune.fl.ray_backend import first_line, last_line

    relayed = RuntimeError(
        "The actor died because of an error raised in its creation task, \x1b[36mray::ClientActor"
        '.__init__()\x1b[39m (pid=1)\n  File "x.py", line 6, in __init__\n    raise ValueError\n'
        "ValueError: data.dataset 'x.jsonl': no such file\n"
    )
    assert last_line(relayed) == "ValueError: data.dataset 'x.jsonl': no such file"
    assert first_line(relayed).startswith("The actor died because of an error raised in its creation task")
    assert "\x1b" not in first_line(relayed)


def test_budget_stops_a_ray_run_cleanly(ray_instance: Any, tmp_path: Path) -> None:
    # fedit-tiny's 4 clients cost 33708 bytes a round (tests/golden/metrics.json); room for 2.5 rounds.
    budget = 2.5 * 33708 / 1e6
    history = quiet_runner(
        tiny_config("fedit", *RAY, "fed.rounds=4", f"fed.budget_mb={budget}"), tmp_path
    ).run()
    assert [row["round"] for row in history] == [0, 1, 2]
    assert "eval" in history[2]
    assert (tmp_path / "artifacts" / "adapter" / "adapter_model.safetensors").is_file()
