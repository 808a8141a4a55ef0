"""The HTTP logit source's pure parts (the residual fill, URL checks, usage) and the serve host rule."""

from __future__ import annotations

import math

import pytest
import torch

from fedtune.proxy.api_url import check_api_url, is_api_url
from fedtune.proxy.http_source import APIUsage, fill_residual
from fedtune.serve.launch import BindRefused, check_bind, is_loopback


def test_fill_spreads_the_residual_mass_uniformly_over_the_unnamed_ids() -> None:
    known = {0: math.log(0.5), 3: math.log(0.2)}
    top = fill_residual([known], width=5, top_k=2)
    probs = top.logprobs.exp()[0]
    assert probs[0].item() == pytest.approx(0.5) and probs[3].item() == pytest.approx(0.2)
    for unseen in (1, 2, 4):
        assert probs[unseen].item() == pytest.approx(0.3 / 3)
    assert probs.sum().item() == pytest.approx(1.0)
    assert top.known.tolist() == [[True, False, False, True, False]]


def test_an_unnamed_id_is_never_likelier_than_the_top_k() -> None:
    # Top-1 (id 0) holds 0.1 and the label (id 1, named although outside the top-1) 0.01: the residual
    # 0.89 over the 2 unnamed ids would give each 0.445, more than the top-1 itself. They are capped at it.
    top = fill_residual([{0: math.log(0.1), 1: math.log(0.01)}], width=4, top_k=1)
    assert top.logprobs[0, 2].item() == pytest.approx(math.log(0.1))
    assert top.logprobs[0, 1].item() == pytest.approx(math.log(0.01))


def test_full_knowledge_is_returned_as_is_and_ids_past_the_width_only_count_in_the_mass() -> None:
    exact = torch.log_softmax(torch.randn(6), dim=0)
    row = {i: float(v) for i, v in enumerate(exact)}
    top = fill_residual([row], width=4, top_k=6)
    torch.testing.assert_close(top.logprobs[0], exact[:4])
    assert bool(top.known.all())
    # Everything named: no mass left for ids 2 and 3; they get the floor, below every named id.
    saturated = fill_residual([{0: math.log(0.7), 1: math.log(0.3)}], width=4, top_k=2)
    assert saturated.logprobs[0, 2].item() < math.log(0.3)
    assert math.isfinite(saturated.logprobs[0, 2].item())


def test_api_urls_are_checked() -> None:
    assert is_api_url("http://127.0.0.1:8000/v1") and not is_api_url("smollm2-360m-instruct")
    assert check_api_url("https://host.example:9000/v1/") == "https://host.example:9000/v1"
    for bad, what in [
        ("ftp://host/v1", "http:// or https://"),
        ("http:///v1", "no host"),
        ("http://host:99999/v1", "bad port"),
        ("http://host/v1?x=1", "no query"),
    ]:
        with pytest.raises(ValueError, match=what):
            check_api_url(bad)


def test_usage_differences_become_metrics() -> None:
    after = APIUsage(requests=5, retries=1, bytes_up=100, bytes_down=1000, seconds=2.5)
    before = APIUsage(requests=2, bytes_up=40, bytes_down=400, seconds=1.0)
    assert (after - before).metrics() == {
        "api_requests": 3,
        "api_retries": 1,
        "api_bytes_up": 60,
        "api_bytes_down": 600,
        "api_seconds": 1.5,
    }


def test_serving_beyond_loopback_needs_the_flag_and_warns() -> None:
    for host in ("127.0.0.1", "127.3.2.1", "::1", "localhost"):
        assert is_loopback(host) and check_bind(host, False, None) == []
    for host in ("0.0.0.0", "192.168.1.5", "::", "example.org"):
        assert not is_loopback(host)
        with pytest.raises(BindRefused, match="--allow-remote"):
            check_bind(host, False, "key")
    warnings = check_bind("0.0.0.0", True, None)
    assert len(warnings) == 2 and "no API key" in warnings[1]
    assert len(check_bind("0.0.0.0", True, "key")) == 1
