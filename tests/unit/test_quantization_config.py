"""``model.quantization``: validated with the run's config, carried by every spec that loads a LoRA base."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

from fedtune.algorithms.fedmkt.client import slm_spec
from fedtune.algorithms.fedpt.final import large_source
from fedtune.config import ConfigError
from fedtune.resources import Resources, model_spec
from tests.integration.helpers import tiny_config


@pytest.mark.parametrize("algorithm", ["fedbiot", "fedpft"])
def test_a_method_that_cannot_quantise_says_why_at_validation(algorithm: str) -> None:
    with pytest.raises(ConfigError, match=rf"model\.quantization 4: algorithm '{algorithm}' cannot"):
        tiny_config(algorithm, "model.quantization=4")


def test_only_4_8_or_null_are_accepted() -> None:
    with pytest.raises(ConfigError, match=r"model\.quantization"):
        tiny_config("fedit", "model.quantization=3")
    assert tiny_config("fedit", "model.quantization=null").model.quantization is None


def test_without_bitsandbytes_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name == "bitsandbytes" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(ConfigError, match=r"pip install 'fedtune\[quant\]'"):
        tiny_config("fedit", "model.quantization=8")


def test_a_device_bitsandbytes_cannot_run_on_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"model\.quantization 4: bitsandbytes runs on cpu or cuda"):
        tiny_config("fedit", "model.quantization=4", "model.device=mps")


def test_client_specs_carry_it_and_fedpts_large_model_does_not() -> None:
    fedmkt = tiny_config("fedmkt", "model.quantization=4")
    assert {slm_spec(fedmkt, client).quantization for client in ("c00", "c01")} == {4}
    assert model_spec(fedmkt.model, fedmkt.seed).quantization == 4

    fedpt = tiny_config("fedpt", "model.quantization=8")
    resources = Resources(fedpt)
    large_source(fedpt, resources)  # the server's black-box large LM: loaded unquantised
    assert resources.loads == [
        model_spec(fedpt.model, fedpt.seed)
        .replace(name="tiny-llama-L4-H64", dtype="fp32", gguf_file=None, quantization=None)
        .key
        + " (fedpt/large)"
    ]
