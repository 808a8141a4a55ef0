"""A model's next-token log-probabilities over HTTP: the part of vLLM's OpenAI-compatible server that a
black-box logit source needs (``fedtune.proxy.http_source.HTTPLogitSource``).

- ``POST /v1/completions``: ``prompt`` as text or token ids (one or a list), ``max_tokens`` (0 with
  ``echo``: score the prompt only), ``prompt_logprobs=k`` (per prompt position, first ``None``: the
  top-k plus the prompt's own token, keyed by token id as ``{"logprob", "rank", "decoded_token"}``),
  ``logprobs=k`` (OpenAI's legacy per-token lists; with ``return_tokens_as_token_ids`` tokens read
  ``token_id:<id>``), ``temperature``/``top_p``/``seed``/``stop``. ``k = -1`` asks for the whole vocabulary.
  A ``k`` above ``max_logprobs`` (``--max-logprobs``, 20 as vLLM's default; -1: no limit) is a 400 with
  vLLM's message.
- ``POST /tokenize`` (``prompt``, ``add_special_tokens``, ``return_token_strs``) and ``POST /detokenize``
  (``tokens``): what a client checks the tokenizer with.
- ``GET /v1/models``, ``GET /health``.

Log-probabilities are the model's raw distribution (log-softmax of its fp32 logits, as vLLM's default
``raw_logprobs``), before temperature or top-p; ``-inf`` is sent as -9999.0, as vLLM does.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

import torch
from fastapi import FastAPI, Request
from fastapi.responses import Response
from torch import Tensor

from fedtune.decode.generate import cut_at_stop, eos_token_ids, model_device, model_step_fn, sample_next
from fedtune.serve.app import ModelWorker, check_model, json_body, json_response
from fedtune.serve.protocol import (
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
    bad_request,
    completion_body,
    parse,
)

DEFAULT_MAX_LOGPROBS = 20
"""vLLM's default ``--max-logprobs``."""
FLOOR = -9999.0
"""What ``-inf`` log-probabilities are sent as (JSON has no infinity)."""


def _finite(value: float) -> float:
    return value if value > FLOOR else FLOOR


class LogitsService:
    """A causal LM behind the vLLM completions subset (module docstring)."""

    def __init__(
        self, model: Any, tokenizer: Any, name: str, *, max_logprobs: int = DEFAULT_MAX_LOGPROBS
    ) -> None:
        if max_logprobs < -1:
            raise ValueError(f"max_logprobs must be >= 0, or -1 for no limit; got {max_logprobs}")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.vocab_width = int(model.get_output_embeddings().weight.shape[0])
        self.max_logprobs = self.vocab_width if max_logprobs == -1 else max_logprobs
        self.max_model_len: int | None = getattr(model.config, "max_position_embeddings", None)
        self.device = model_device(model)
        self.eos = set(eos_token_ids(model, tokenizer))
        self._decoded: list[str] | None = None
        self._json_parts: tuple[list[str], list[str]] | None = None

    # ----- routes ---------------------------------------------------------------------------------
    def mount(self, app: FastAPI, worker: ModelWorker) -> None:
        @app.post("/v1/completions")
        async def completions(request: Request) -> Response:
            body = parse(CompletionRequest, await json_body(request))
            self.check(body)
            with worker.slot():
                return Response(await worker.run(self.complete_json, body), media_type="application/json")

        @app.post("/tokenize")
        async def tokenize(request: Request) -> Response:
            body = parse(TokenizeRequest, await json_body(request))
            check_model(body.model, self.name)
            return json_response(await worker.run(self.tokenize, body))

        @app.post("/detokenize")
        async def detokenize(request: Request) -> Response:
            body = parse(DetokenizeRequest, await json_body(request))
            check_model(body.model, self.name)
            self._check_ids(body.tokens, "tokens")
            return json_response({"prompt": self.tokenizer.decode(body.tokens)})

    # ----- checks (before any model work) ---------------------------------------------------------
    def check(self, body: CompletionRequest) -> None:
        check_model(body.model, self.name)
        if body.n != 1:
            raise bad_request("n > 1 is not supported by this server", "n")
        if body.stream:
            raise bad_request(
                "stream is not supported by the logits server (`fedtune serve MODEL`)", "stream"
            )
        if body.suffix:
            raise bad_request("suffix is not supported", "suffix")
        for param, what in (("prompt_logprobs", "prompt logprobs"), ("logprobs", "sample logprobs")):
            value = getattr(body, param)
            if value is None:
                continue
            if value < -1:
                raise bad_request(f"`{param}` must be a positive value or -1.", param)
            wanted = self.vocab_width if value == -1 else value
            if wanted > self.max_logprobs:
                raise bad_request(
                    f"Requested {what} of {wanted}, which is greater than max allowed: {self.max_logprobs}",
                    param,
                )
        max_tokens = 16 if body.max_tokens is None else body.max_tokens
        if max_tokens == 0 and not body.echo:
            raise bad_request("max_tokens=0 needs echo=true (to score the prompt only)", "max_tokens")
        for prompt in body.prompts():
            if isinstance(prompt, list):
                if not prompt:
                    raise bad_request("a prompt has no tokens", "prompt")
                self._check_ids(prompt, "prompt")
                length = len(prompt)
            elif not prompt:
                raise bad_request("a prompt is empty", "prompt")
            else:
                length = 0  # checked after tokenizing
            self._check_length(length, max_tokens)

    def _check_ids(self, ids: list[int], param: str) -> None:
        bad = [i for i in ids if not 0 <= i < self.vocab_width]
        if bad:
            raise bad_request(f"token id {bad[0]} is out of vocabulary (size {self.vocab_width})", param)

    def _check_length(self, prompt_tokens: int, max_tokens: int) -> None:
        if self.max_model_len is not None and prompt_tokens + max_tokens > self.max_model_len:
            raise bad_request(
                f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the prompt, {max_tokens} for the "
                "completion). Please reduce the length of the prompt or max_tokens.",
                "max_tokens",
            )

    # ----- work (on the model worker) -------------------------------------------------------------
    def decoded(self) -> list[str]:
        """Every id's own text (``decoded_token``), built once."""
        if self._decoded is None:
            self._decoded = self.tokenizer.batch_decode([[i] for i in range(self.vocab_width)])
        return self._decoded

    def tokenize(self, body: TokenizeRequest) -> dict[str, Any]:
        ids = self.tokenizer(body.prompt, add_special_tokens=body.add_special_tokens)["input_ids"]
        strs = self.tokenizer.convert_ids_to_tokens(ids) if body.return_token_strs else None
        return {"count": len(ids), "max_model_len": self.max_model_len, "tokens": ids, "token_strs": strs}

    def complete(self, body: CompletionRequest) -> dict[str, Any]:
        """The response to a completion request (checked by ``check``)."""
        parsed: dict[str, Any] = json.loads(self.complete_json(body))
        return parsed

    def complete_json(self, body: CompletionRequest) -> str:
        """The response as JSON text. Prompt log-probabilities (large: every position's top k) are
        written from per-id fragments built once, not through ``json.dumps`` of nested dicts."""
        raw: dict[str, str] = {}
        response = self._response(body, raw)
        text = json.dumps(response, separators=(",", ":"))
        for marker, fragment in raw.items():
            text = text.replace(json.dumps(marker), fragment, 1)
        return text

    def _response(self, body: CompletionRequest, raw: dict[str, str]) -> dict[str, Any]:
        max_tokens = 16 if body.max_tokens is None else body.max_tokens
        choices, prompt_total, completion_total = [], 0, 0
        for index, prompt in enumerate(body.prompts()):
            if isinstance(prompt, list):
                ids, text = list(prompt), None
            else:
                ids, text = (
                    self.tokenizer(prompt, add_special_tokens=body.add_special_tokens)["input_ids"],
                    prompt,
                )
                if not ids:
                    raise bad_request("a prompt has no tokens after tokenizing", "prompt")
                self._check_length(len(ids), max_tokens)
            choice, generated = self._choice(body, index, ids, text, max_tokens, raw)
            choices.append(choice)
            prompt_total += len(ids)
            completion_total += generated
        return completion_body(self.name, choices, prompt_total, completion_total)

    def _choice(
        self,
        body: CompletionRequest,
        index: int,
        ids: list[int],
        text: str | None,
        max_tokens: int,
        raw: dict[str, str],
    ) -> tuple[dict[str, Any], int]:
        k_prompt = self._k(body.prompt_logprobs)
        k_sample = self._k(body.logprobs)
        prompt_lp = None
        if k_prompt is not None or (body.echo and k_sample is not None):
            prompt_lp = self._prompt_logprobs(ids)
        tokens, token_lps, finish, out_text = self._generate(body, ids, max_tokens)
        choice: dict[str, Any] = {"index": index, "text": out_text, "logprobs": None, "finish_reason": finish}
        choice["stop_reason"] = None
        if k_prompt is not None:
            assert prompt_lp is not None
            marker = f"\x00prompt_logprobs:{index}"
            raw[marker] = self._prompt_logprobs_json(prompt_lp, k_prompt, ids)
            choice["prompt_logprobs"] = marker
        if body.echo:
            choice["text"] = (self.tokenizer.decode(ids) if text is None else text) + out_text
        if k_sample is not None:
            choice["logprobs"] = self._legacy_logprobs(body, ids, prompt_lp, tokens, token_lps, k_sample)
        return choice, len(tokens)

    def _k(self, value: int | None) -> int | None:
        if value is None:
            return None
        return self.vocab_width if value == -1 else min(value, self.vocab_width)

    def _prompt_logprobs(self, ids: list[int]) -> Tensor:
        """``[L, V]`` log-probabilities of the token after each prompt position."""
        with torch.inference_mode():
            logits = self.model(input_ids=torch.tensor([ids], device=self.device)).logits[0]
            return torch.log_softmax(logits.float(), dim=-1).cpu()

    def _generate(
        self, body: CompletionRequest, ids: list[int], max_tokens: int
    ) -> tuple[list[int], list[Tensor], str, str]:
        """Up to ``max_tokens`` new tokens, their ``[V]`` log-probabilities, the finish reason, the text."""
        if max_tokens == 0:
            return [], [], "length", ""
        temperature = 1.0 if body.temperature is None else body.temperature
        top_p = 1.0 if body.top_p is None else body.top_p
        seed = secrets.randbits(31) if body.seed is None else body.seed
        generator = torch.Generator(device=self.device).manual_seed(seed)
        stops = body.stop_strings()
        step = model_step_fn(self.model)
        new_ids = torch.tensor([ids], device=self.device)
        mask = torch.ones_like(new_ids)
        positions = torch.arange(len(ids), device=self.device)[None]
        tokens: list[int] = []
        lps: list[Tensor] = []
        finish, text = "length", ""
        with torch.inference_mode():
            for _ in range(max_tokens):
                logits = step(new_ids, mask, positions)
                token = int(sample_next(logits, temperature, top_p, generator)[0])
                lps.append(torch.log_softmax(logits[0].float(), dim=-1).cpu())
                tokens.append(token)
                if token in self.eos:
                    finish = "stop"
                    break
                text = self.tokenizer.decode(tokens, skip_special_tokens=True)
                if stops and any(s in text for s in stops):
                    finish = "stop"
                    break
                new_ids = torch.tensor([[token]], device=self.device)
                positions = positions[:, -1:] + 1
                mask = torch.cat([mask, mask.new_ones((1, 1))], dim=1)
        text = cut_at_stop(self.tokenizer.decode(tokens, skip_special_tokens=True), stops)
        return tokens, lps, finish, text

    def _fragments(self) -> tuple[list[str], list[str]]:
        """Per id, the JSON text before its log-probability and after its rank."""
        if self._json_parts is None:
            decoded = self.decoded()
            self._json_parts = (
                [f'"{i}":{{"logprob":' for i in range(self.vocab_width)],
                [f',"decoded_token":{json.dumps(d)}}}' for d in decoded],
            )
        return self._json_parts

    def _prompt_logprobs_json(self, prompt_lp: Tensor, k: int, ids: list[int]) -> str:
        """``[null, {id: {logprob, rank, decoded_token}}, ...]``: per position the top ``k`` (ranked)
        and the prompt's own next token, as ``_entries`` builds them, written as JSON text."""
        before, after = self._fragments()
        rows = prompt_lp[: len(ids) - 1]
        actual = torch.tensor(ids[1:], dtype=torch.long)
        actual_lp = rows.gather(1, actual[:, None])[:, 0]
        actual_rank = (rows > actual_lp[:, None]).sum(dim=1) + 1
        if k > 0:
            top_values, top_ids = rows.topk(k, dim=1)
            values, columns = top_values.tolist(), top_ids.tolist()
        else:
            values, columns = [[] for _ in range(len(ids) - 1)], [[] for _ in range(len(ids) - 1)]

        def entry(token: int, value: float, rank: int) -> str:
            return f'{before[token]}{value if value > FLOOR else FLOOR!r},"rank":{rank}{after[token]}'

        positions = ["null"]
        for row, (vals, cols) in enumerate(zip(values, columns, strict=True)):
            parts = [entry(c, v, rank) for rank, (v, c) in enumerate(zip(vals, cols, strict=True), start=1)]
            token = ids[row + 1]
            if token not in cols:
                parts.append(entry(token, float(actual_lp[row]), int(actual_rank[row])))
            positions.append("{" + ",".join(parts) + "}")
        return "[" + ",".join(positions) + "]"

    def _entries(self, row: Tensor, k: int, actual: int | None) -> dict[str, dict[str, Any]]:
        """vLLM's per-position logprobs: the top ``k`` ids (rank 1 first) plus ``actual`` with its rank."""
        decoded = self.decoded()
        out: dict[str, dict[str, Any]] = {}
        if k > 0:
            values, ids = row.topk(k)
            for rank, (value, token) in enumerate(zip(values.tolist(), ids.tolist(), strict=True), start=1):
                out[str(token)] = {"logprob": _finite(value), "rank": rank, "decoded_token": decoded[token]}
        if actual is not None and str(actual) not in out:
            value = float(row[actual])
            rank = int((row > row[actual]).sum()) + 1
            out[str(actual)] = {"logprob": _finite(value), "rank": rank, "decoded_token": decoded[actual]}
        return out

    def _legacy_logprobs(
        self,
        body: CompletionRequest,
        ids: list[int],
        prompt_lp: Tensor | None,
        tokens: list[int],
        token_lps: list[Tensor],
        k: int,
    ) -> dict[str, Any]:
        """OpenAI's legacy completion ``logprobs``: per token its string, log-probability and top-k."""
        decoded = self.decoded()

        def name(token: int) -> str:
            return f"token_id:{token}" if body.return_tokens_as_token_ids else decoded[token]

        def top(row: Tensor, token: int) -> dict[str, float]:
            return {name(int(t)): entry["logprob"] for t, entry in self._entries(row, k, token).items()}

        names: list[str] = []
        values: list[float | None] = []
        tops: list[dict[str, float] | None] = []
        if body.echo:
            assert prompt_lp is not None
            for i, token in enumerate(ids):
                names.append(name(token))
                values.append(None if i == 0 else _finite(float(prompt_lp[i - 1][token])))
                tops.append(None if i == 0 else top(prompt_lp[i - 1], token))
        for token, row in zip(tokens, token_lps, strict=True):
            names.append(name(token))
            values.append(_finite(float(row[token])))
            tops.append(top(row, token))
        offsets, position = [], 0
        for token in (ids if body.echo else []) + tokens:
            offsets.append(position)
            position += len(decoded[token])
        return {"text_offset": offsets, "token_logprobs": values, "tokens": names, "top_logprobs": tops}


def logits_service(
    name: str,
    *,
    served_name: str | None = None,
    max_logprobs: int = DEFAULT_MAX_LOGPROBS,
    dtype: str = "fp32",
    device: str = "auto",
    seed: int = 0,
    cache_dir: str | None = None,
) -> LogitsService:
    """``name`` (a zoo name, a derived or tiny model, a directory) loaded and wrapped."""
    from pathlib import Path

    from fedtune.models.loading import load_causal_lm

    model, tokenizer = load_causal_lm(
        name, dtype=dtype, device=device, seed=seed, cache_dir=None if cache_dir is None else Path(cache_dir)
    )
    return LogitsService(model, tokenizer, served_name or name, max_logprobs=max_logprobs)
