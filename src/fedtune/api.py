"""fedtune from Python: run a config, resume a run, load a finished run's final model.

    import fedtune

    history = fedtune.run("configs/test/fedit-tiny.yaml", output_dir="runs/try", fed={"rounds": 2})
    fedtune.resume("runs/try")                      # after an interruption: the same metrics
    final = fedtune.load("runs/try")                # e.g. base model + final adapter
    prompt = build_prompt(Record("Define 'harbor'.", output=""), final.cfg.data.template, final.tokenizer)
    final.generate([prompt], max_new_tokens=32, temperature=0.0, top_p=1.0, seed=0)  # templated prompts

(``Record`` from ``fedtune.data.records``, ``build_prompt`` from ``fedtune.data.templates``;
``fedtune.artifacts.generate_from_run`` templates the prompts itself.)

Overrides are the config's keys: ``seed=1``, ``fed={"rounds": 2}`` or, as on the command line,
``**{"fed.rounds": 2}``. The modules behind these functions load on first use, so ``import fedtune``
stays light.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedtune.algorithms.final import FinalModel
    from fedtune.config import ExperimentConfig

Row = dict[str, Any]


def override_list(overrides: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Keyword overrides as the command line's ``key=value`` strings (nested dicts become dotted keys)."""
    found: list[str] = []
    for key, value in overrides.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping):
            found += override_list(value, f"{dotted}.")
        else:
            found.append(f"{dotted}={json.dumps(value)}")
    return found


def run(
    config: str | Path | ExperimentConfig,
    *,
    output_dir: str | Path | None = None,
    quiet: bool = False,
    **overrides: Any,
) -> list[Row]:
    """Run ``config`` (a YAML path or a loaded config) with ``overrides``; the metrics rows, one per round.

    ``output_dir`` defaults to the config's ``output_dir`` (``runs/<name>``); ``quiet`` silences the
    progress display and the summary table.
    """
    from rich.console import Console

    from fedtune.config import ExperimentConfig, apply_overrides, load_config, validate_config
    from fedtune.runner import Runner

    if isinstance(config, ExperimentConfig):
        raw = apply_overrides(config.to_yaml_dict(), override_list(overrides))
        cfg = validate_config(raw, source="the config passed to fedtune.run")
    else:
        cfg = load_config(config, override_list(overrides))
    console = Console(quiet=True) if quiet else None
    return Runner(cfg, Path(output_dir) if output_dir else None, console=console).run()


def resume(run_dir: str | Path, *, quiet: bool = False) -> list[Row]:
    """Continue the run in ``run_dir`` from its last complete round; all its metrics rows."""
    from rich.console import Console

    from fedtune.runner import resume_experiment

    return resume_experiment(Path(run_dir), console=Console(quiet=True) if quiet else None)


def load(run_dir: str | Path, variant: str | None = None, **options: Any) -> FinalModel:
    """The final model of the finished run in ``run_dir`` (``variant`` and ``options`` as for
    ``fedtune eval --variant NAME --option KEY=VALUE``): ``.evaluate(records)``,
    ``.generate(prompts, ...)``."""
    from fedtune.artifacts import load_final

    return load_final(Path(run_dir), variant, {key: str(value) for key, value in options.items()})
