"""Validating a config loads each method's config class alone (``fedtune.algorithm_configs``), never the
method itself: the check runs in a fresh interpreter, since this one has imported every algorithm."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from fedtune.plugins import BUILTIN

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import json, sys
from fedtune.config import load_config
loaded = {}
for name in json.loads(sys.argv[1]):
    load_config(f"configs/test/{name}-tiny.yaml")
    loaded[name] = sorted(m for m in sys.modules if m.startswith("fedtune.algorithms"))
print(json.dumps(loaded))
"""


def test_validating_each_methods_config_imports_only_its_config_module() -> None:
    # Execute
    names = sorted(BUILTIN)
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(names)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src"), "HF_HUB_OFFLINE": "1"},
        timeout=120,
        check=True,
    )
    loaded = json.loads(done.stdout)
    # Assert: the algorithms package, each method's (lazy) package and its config module; nothing else
    allowed = {"fedtune.algorithms"} | {
        f"fedtune.algorithms.{n}{part}" for n in names for part in ("", ".config")
    }
    # Shared config bases: FedAdam's, FedYogi's and FedAdagrad's sections subclass fedopt's; HetLoRA's and
    # FlexLoRA's hetrank's.
    allowed |= {
        f"fedtune.algorithms.{shared}{part}" for shared in ("fedopt", "hetrank") for part in ("", ".config")
    }
    for name in names:
        assert f"fedtune.algorithms.{name}.config" in loaded[name]
        assert set(loaded[name]) <= allowed, f"validating {name} imported {set(loaded[name]) - allowed}"
