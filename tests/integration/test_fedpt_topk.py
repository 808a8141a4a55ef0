"""experiments/fedpt_topk.py on the tiny config: the served large model at k = V gives the local row."""

from __future__ import annotations

import json
import math
import socket
from pathlib import Path

from experiments import fedpt_topk

from tests.integration.helpers import ROOT

VOCAB = 262  # the byte-level tiny tokenizer's size


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_the_whole_vocabulary_over_http_scores_as_the_local_source(tmp_path: Path) -> None:
    config = ROOT / "configs" / "test" / "fedpt-tiny.yaml"
    argv = [str(config), "--runs-dir", str(tmp_path / "runs"), "--results-dir", str(tmp_path / "results")]
    argv += ["--ks", str(VOCAB), "--alpha", "1", "--port", str(_free_port()), "--set", "fed.rounds=1"]
    fedpt_topk.main(argv)
    results = json.loads((tmp_path / "results" / "topk-fedpt-tiny.json").read_text())["results"]
    local, http = results["local"], results[f"k{VOCAB}"]
    assert local["seeds"] == http["seeds"] == 1
    for key in ("rougeL", "perplexity"):
        assert math.isclose(local[key]["0"], http[key]["0"], rel_tol=1e-5), key
    # the API's use is counted for the HTTP row only: the teacher's 16 public rows, then the evaluation's
    assert http["teacher_api_requests"]["0"] == 16 and http["eval_api_requests"]["0"] > 0
    assert "teacher_api_requests" not in local
    table = (tmp_path / "results" / "topk-fedpt-tiny.md").read_text()
    assert "| 262 (all) (local source) |" in table and f"| {VOCAB} |" in table
    assert (tmp_path / "runs" / "fedpt-tiny-topk" / "server.log").is_file()
