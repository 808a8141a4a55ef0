"""fedtune from Python: run, resume and load, as the package exports them."""

from __future__ import annotations

from pathlib import Path

import pytest

import fedtune
from fedtune.api import override_list
from fedtune.config import ConfigError
from fedtune.rundata import prepare_data
from tests.integration.helpers import ROOT, stable, tiny_config

CONFIG = ROOT / "configs" / "test" / "fedit-tiny.yaml"


def test_keyword_overrides_become_the_command_lines_keys() -> None:
    overrides = {"seed": 3, "fed": {"rounds": 2, "wire_dtype": "fp16"}, "eval.metrics": ["perplexity"]}

    assert override_list(overrides) == [
        "seed=3",
        "fed.rounds=2",
        'fed.wire_dtype="fp16"',
        'eval.metrics=["perplexity"]',
    ]


def test_run_resume_and_load_from_python(tmp_path: Path) -> None:
    # Execute
    history = fedtune.run(
        CONFIG, output_dir=tmp_path / "run", quiet=True, fed={"rounds": 1}, eval={"before": False}
    )
    again = fedtune.resume(tmp_path / "run", quiet=True)
    final = fedtune.load(tmp_path / "run")
    records = prepare_data(tiny_config("fedit")).eval_records

    # Assert
    assert [row["round"] for row in history] == [0, 1] and stable(again) == stable(history)
    assert final.evaluate(records).metrics["perplexity"] == pytest.approx(history[1]["eval"]["perplexity"])
    texts = final.generate(["Define 'cat'."], max_new_tokens=3, temperature=0.0, top_p=1.0, seed=0)
    assert len(texts) == 1 and isinstance(texts[0], str)


def test_a_bad_override_names_its_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"fed\.roundz"):
        fedtune.run(CONFIG, output_dir=tmp_path / "run", quiet=True, fed={"roundz": 1})
