"""The golden runs: one tiny config per algorithm (and per run mode or variant worth pinning).

Their metrics are pinned in ``tests/golden/metrics.json``; ``tests/integration/test_golden.py``
reruns each case and compares. After a change that is meant to move a number, regenerate with

    .venv/bin/python -m tests.golden.regenerate

and say in the commit message why each moved number had to move.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

# case name -> (tiny config, overrides)
CASES: dict[str, tuple[str, tuple[str, ...]]] = {
    "fedit": ("fedit", ()),
    "fedprox": ("fedit", ("fedit.prox_mu=0.5", "fedit.server_lr=0.8")),
    "fedit-standalone": ("fedit", ("fed.mode=standalone",)),
    "fedit-centralized": ("fedit", ("fed.mode=centralized",)),
    "fedpt": ("fedpt", ()),
    "fedbiot": ("fedbiot", ()),
    "offsite-tuning": ("fedbiot", ("fedbiot.split=first_last", "fedbiot.align_steps=0")),
    "fedavgm": ("fedavgm", ()),
    "fedmkt": ("fedmkt", ()),
    "perfit": ("perfit", ()),
    # The earlier reading, kept as an ablation: clients resume from their own values, alpha = lora.alpha.
    "perfit-own": ("perfit", ("perfit.start=own", "perfit.alpha=lora")),
    "fedpft": ("fedpft", ()),
    "fedot": ("fedpft", ("fedpft.submodel=layerdrop",)),
    # FedOT's emulator as cut, not distilled (the ablation; the baseline before #64 distilled it).
    "fedot-undistilled": ("fedpft", ("fedpft.submodel=layerdrop", "fedpft.emulator_distill=false")),
    "fedpetuning": ("fedpft", ("fedpft.submodel=full",)),
    "hetlora": ("hetlora", ()),
    "flexlora": ("flexlora", ()),
    "fedadam": ("fedadam", ()),
    "fedyogi": ("fedyogi", ()),
    "fedadagrad": ("fedadagrad", ()),
    "fedkseed": ("fedkseed", ()),
    "fedkseed-importance": ("fedkseed", ("fedkseed.sampling=importance",)),
}

# Wall-clock and memory readings differ from run to run; everything else is pinned.
VOLATILE = {
    "client_seconds",
    "server_seconds",
    "round_seconds",
    "peak_rss_mb",
    "actor_peak_rss_mb",
    "gpu_peak_mb",
    "client_peak_mem_mb",
    "kd_seconds",
    "teacher_seconds",
    "kd_student_seconds",
    "distill_seconds",
    "secagg_seconds",
    "api_seconds",
}
METRICS_FILE = Path(__file__).with_name("metrics.json")


def run_case(name: str, run_dir: Path) -> list[dict[str, Any]]:
    """The stable metrics rows of one golden case, run in-process in ``run_dir``."""
    from rich.console import Console

    from fedtune.config import load_config
    from fedtune.runner import Runner

    config, overrides = CASES[name]
    cfg = load_config(ROOT / "configs" / "test" / f"{config}-tiny.yaml", list(overrides))
    history = Runner(cfg, run_dir, console=Console(quiet=True)).run()
    return [{k: v for k, v in row.items() if k not in VOLATILE} for row in history]
