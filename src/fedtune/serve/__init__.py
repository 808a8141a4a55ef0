"""``fedtune serve``: an OpenAI-compatible HTTP server for a model or a finished run.

- A model (a zoo, derived or tiny name, or a model directory): its next-token log-probabilities through
  the part of vLLM's API a black-box logit source uses (``logits``), what ``fedpt.large_model:
  http://...`` talks to (``fedtune.proxy.http_source``).
- A finished run directory: its final model, as its method defines it, behind ``/v1/chat/completions``
  and ``/v1/completions`` with streaming (``run``).

Both listen on loopback unless ``--allow-remote`` says otherwise, and take an optional bearer token
(``launch``); errors answer in OpenAI's shape (``app``). See docs/serving.md.
"""

from fedtune.serve.app import build_app
from fedtune.serve.launch import BackgroundServer, check_bind, is_loopback
from fedtune.serve.logits import LogitsService, logits_service
from fedtune.serve.run import RunService, run_service

__all__ = [
    "BackgroundServer",
    "LogitsService",
    "RunService",
    "build_app",
    "check_bind",
    "is_loopback",
    "logits_service",
    "run_service",
]
