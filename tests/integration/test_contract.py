"""The contract every registered algorithm must satisfy, on its tiny config."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedtune.algorithms.final import FinalModelError
from fedtune.algorithms.registry import algorithm_names, get_algorithm
from fedtune.artifacts import load_final
from fedtune.fl.checkpoint import latest_checkpoint, load_checkpoint
from fedtune.fl.payload import Payload
from fedtune.rundata import prepare_data
from tests.integration.helpers import quiet_runner, stable, tiny_config

ALGORITHMS = algorithm_names()


class Interrupt(BaseException):
    """Stands for the process dying: not an Exception, so nothing inside the run catches it."""


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_same_seed_same_metrics_and_state(algorithm: str, tmp_path: Path) -> None:
    cfg = tiny_config(algorithm)
    first = quiet_runner(cfg, tmp_path / "a").run()
    second = quiet_runner(cfg, tmp_path / "b").run()
    assert stable(first) == stable(second)
    state_a = load_checkpoint(latest_checkpoint(tmp_path / "a"))  # type: ignore[arg-type]
    state_b = load_checkpoint(latest_checkpoint(tmp_path / "b"))  # type: ignore[arg-type]
    assert_trees_equal(state_a["algorithm"], state_b["algorithm"])
    # Every peft adapter the run leaves names its base model (a null one does not load elsewhere).
    for saved in (tmp_path / "a" / "artifacts").rglob("adapter_config.json"):
        assert json.loads(saved.read_text())["base_model_name_or_path"], saved
    # The finished run's final model, through the method's own hook: it scores test records, or the
    # method says why it has no single final model.
    try:
        final = load_final(tmp_path / "a")
    except FinalModelError as exc:
        assert "final model" in str(exc)
    else:
        records = prepare_data(cfg).eval_records[:2]
        assert all(np.isfinite(v) for v in final.evaluate(records).metrics.values())


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_resume_equals_uninterrupted(algorithm: str, tmp_path: Path) -> None:
    cfg = tiny_config(algorithm, "fed.rounds=3")
    full = quiet_runner(cfg, tmp_path / "full").run()

    def die_in_round_2(client: str, task: str, rnd: int) -> None:
        if rnd == 2:
            raise Interrupt

    with pytest.raises(Interrupt):
        quiet_runner(cfg, tmp_path / "cut", before_task=die_in_round_2).run()
    rows = [json.loads(line) for line in (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [0, 1]
    resumed = quiet_runner(cfg, tmp_path / "cut").run(resume=True)
    on_disk = [json.loads(line) for line in (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()]
    # Clients restarted with the server may be sent again what they had cached: more bytes in the
    # first resumed round (never fewer), everything else identical.
    resent = get_algorithm(algorithm).resends_after_restart
    for key in resent:
        assert resumed[2][key] >= full[2][key], key
    assert without(stable(resumed), resent, 2) == without(stable(full), resent, 2)
    assert without(stable(on_disk), resent, 2) == without(stable(full), resent, 2)


def without(rows: list[dict[str, Any]], keys: tuple[str, ...], index: int) -> list[dict[str, Any]]:
    return [{k: v for k, v in row.items() if i != index or k not in keys} for i, row in enumerate(rows)]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_bad_and_failed_replies_are_dropped_and_recorded(algorithm: str, tmp_path: Path) -> None:
    cfg = tiny_config(algorithm, "fed.min_replies=2")
    clients = sorted(cfg_clients(cfg))

    def crash(client: str, task: str, rnd: int) -> None:
        if client == clients[0] and rnd == 1:
            raise RuntimeError("disk full")

    def poison(client: str, task: str, rnd: int, reply: Payload) -> Payload:
        if client == clients[1] and rnd == 1:
            # Float arrays turn NaN (integer ones, e.g. packed masks, cannot hold one).
            return {k: np.full_like(v, np.nan) if is_float(v) else v for k, v in reply.items()}
        return reply

    history = quiet_runner(cfg, tmp_path / "run", before_task=crash, after_task=poison).run()
    first = history[1]
    assert first["failed"] == {clients[0]: "RuntimeError: disk full"}
    assert "NaN" in first["rejected"][clients[1]]
    assert all(np.isfinite(v) for v in history[-1]["eval"].values())
    assert history[2]["failed"] == {} and history[2]["rejected"] == {}


def is_float(value: object) -> bool:
    return isinstance(value, np.ndarray) and value.dtype.kind == "f"


def private_texts(cfg: Any) -> set[str]:
    """The clients' own training texts (longer than 8 characters): what must never cross the wire."""
    from fedtune.rundata import prepare_data

    clients = prepare_data(cfg).clients.values()
    return {t for recs in clients for r in recs for t in (r.instruction, r.output) if len(t) > 8}


def leaks(payload: Payload, texts: set[str], tokenizer: Any) -> list[str]:
    """The keys of ``payload`` that carry a private text: as a string, as token ids or as raw bytes."""
    found = []
    for key, value in payload.items():
        readable: list[str] = []
        if isinstance(value, str):
            readable.append(value)
        elif isinstance(value, np.ndarray) and value.dtype.kind in "iu":
            if value.dtype == np.uint8:
                readable.append(value.tobytes().decode("utf-8", "ignore"))
            ids = value.reshape(-1, value.shape[-1]) if value.ndim > 1 else value.reshape(1, -1)
            vocab = len(tokenizer)
            readable += [tokenizer.decode([int(i) for i in row if 0 <= i < vocab]) for row in ids]
        if any(t in text for text in readable for t in texts):
            found.append(key)
    return found


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_no_raw_client_text_in_traffic(algorithm: str, tmp_path: Path) -> None:
    from fedtune.resources import Resources

    cfg = tiny_config(algorithm)
    texts = private_texts(cfg)
    resources = Resources(cfg)
    tokenizer = resources.tokenizer(resources.base_spec)  # also a classifier's (no LM head needed)
    seen: list[tuple[str, str, Payload]] = []

    def tap(direction: str, client: str, task: str, rnd: int, payload: Payload) -> None:
        seen.append((direction, task, payload))

    quiet_runner(cfg, tmp_path / "run", tap=tap).run()
    assert {direction for direction, _, _ in seen} == {"down", "up"}
    for direction, task, payload in seen:
        assert not leaks(payload, texts, tokenizer), (direction, task)
        for key, value in payload.items():
            if isinstance(value, np.ndarray):
                assert value.dtype.kind in "fiub", f"{key} has dtype {value.dtype}"


def test_the_leak_check_sees_strings_token_ids_and_bytes() -> None:
    from fedtune.resources import Resources

    cfg = tiny_config("fedit")
    texts = private_texts(cfg)
    _, tokenizer = Resources(cfg).base_lm()
    secret = sorted(texts)[0]
    ids = np.asarray(
        tokenizer.encode(f"a prefix {secret} and more", add_special_tokens=False), dtype=np.int32
    )

    assert leaks({"note": f"x {secret}"}, texts, tokenizer) == ["note"]
    assert leaks({"ids": ids}, texts, tokenizer) == ["ids"]
    assert leaks({"batch": np.stack([ids, ids]).astype(np.int64)}, texts, tokenizer) == ["batch"]
    assert leaks({"raw": np.frombuffer(secret.encode(), dtype=np.uint8)}, texts, tokenizer) == ["raw"]
    assert leaks({"w": np.zeros(4, dtype=np.float32), "n": 3}, texts, tokenizer) == []


def cfg_clients(cfg: Any) -> list[str]:
    from fedtune.rundata import prepare_data

    return list(prepare_data(cfg).clients)


def assert_trees_equal(a: Any, b: Any) -> None:
    """Equal trees, except wall-clock readings (a "seconds" entry in a log kept in the state)."""
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            if key != "seconds":
                assert_trees_equal(a[key], b[key])
    elif isinstance(a, list):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_trees_equal(x, y)
    elif isinstance(a, np.ndarray):
        np.testing.assert_array_equal(a, b)
    else:
        assert a == b


LIES: dict[str, Any] = {"num_examples": 10**9, "train_loss": -1e9, "tokens": -(10**9)}
"""A client reporting what its statistics cannot be: an inflated weight, a negative loss or count."""


@pytest.mark.parametrize("lie", sorted(LIES))
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_client_lying_about_its_statistics_is_rejected(algorithm: str, lie: str, tmp_path: Path) -> None:
    cfg = tiny_config(algorithm, "fed.rounds=1", "eval.before=false")
    liar = sorted(cfg_clients(cfg))[0]
    lied_about: list[str] = []

    def inflate(client: str, task: str, rnd: int, reply: Payload) -> Payload:
        if client == liar and lie in reply:
            lied_about.append(task)
            return {**reply, lie: LIES[lie]}
        return reply

    def crash(client: str, task: str, rnd: int) -> None:
        if client == liar and task in lied_about:  # absent from exactly the tasks it lied in
            raise RuntimeError("gone")

    lied = quiet_runner(cfg, tmp_path / "lied", after_task=inflate).run()
    if not lied_about:
        pytest.skip(f"{algorithm}'s replies report no {lie}")
    quiet_runner(cfg, tmp_path / "absent", before_task=crash).run()
    assert lie in lied[1]["rejected"][liar]
    # The aggregate is the one without that client.
    state_lied = load_checkpoint(latest_checkpoint(tmp_path / "lied"))  # type: ignore[arg-type]
    state_absent = load_checkpoint(latest_checkpoint(tmp_path / "absent"))  # type: ignore[arg-type]
    assert_trees_equal(state_lied["algorithm"], state_absent["algorithm"])


UPDATE_SETTINGS: dict[str, tuple[str, ...]] = {
    "fedmkt": ("fedmkt.clients=[tiny-qwen2]", "fedmkt.slm_fedavg=true")
}
"""Settings under which a method's fit replies carry tensors the server averages."""


@pytest.mark.parametrize("attack", ["scaled", "one_huge_entry"])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_client_sending_a_huge_update_is_screened_out_by_default(
    algorithm: str, attack: str, tmp_path: Path
) -> None:
    # Prepare: the default config (no fed.norm_bound); one client blows up its fit reply's arrays.
    cfg = tiny_config(algorithm, "fed.rounds=1", "eval.before=false", *UPDATE_SETTINGS.get(algorithm, ()))
    liar = sorted(cfg_clients(cfg))[0]

    def blow_up(value: np.ndarray) -> np.ndarray:
        if attack == "scaled":
            return (value * 1e6).astype(value.dtype)
        huge = value.copy()
        huge.flat[0] = 3e38
        return huge

    def lie(client: str, task: str, rnd: int, reply: Payload) -> Payload:
        if client != liar or task != "fit":
            return reply
        return {k: blow_up(v) if is_float(v) and v.size else v for k, v in reply.items()}

    def crash(client: str, task: str, rnd: int) -> None:
        if client == liar and task == "fit":
            raise RuntimeError("gone")

    # Execute
    lied = quiet_runner(cfg, tmp_path / "lied", after_task=lie).run()
    quiet_runner(cfg, tmp_path / "absent", before_task=crash).run()

    # Assert: rejected with the screen's reason, and the aggregate is the one without that client
    assert "fed.screen" in lied[1]["rejected"][liar]
    state_lied = load_checkpoint(latest_checkpoint(tmp_path / "lied"))  # type: ignore[arg-type]
    state_absent = load_checkpoint(latest_checkpoint(tmp_path / "absent"))  # type: ignore[arg-type]
    assert_trees_equal(state_lied["algorithm"], state_absent["algorithm"])


def largest_float(tree: Any) -> float:
    """The largest |value| of any float array in a state tree."""
    if isinstance(tree, dict):
        return max((largest_float(v) for v in tree.values()), default=0.0)
    if isinstance(tree, list):
        return max((largest_float(v) for v in tree), default=0.0)
    if is_float(tree) and tree.size:
        return float(np.abs(tree).max())
    return 0.0


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_robust_aggregator_absorbs_a_huge_update(algorithm: str, tmp_path: Path) -> None:
    # Prepare: no screen, the coordinate-wise median; one client sends its update x 1e6.
    if algorithm == "perfit":
        pytest.skip(
            "PerFIT's median is per entry over its holders: an entry held by 1-2 clients is not protected"
        )
    settings = ("fed.rounds=1", "eval.before=false", "fed.screen=null", "fed.aggregator=median")
    cfg = tiny_config(algorithm, *settings, *UPDATE_SETTINGS.get(algorithm, ()))
    liar = sorted(cfg_clients(cfg))[0]

    def scale(client: str, task: str, rnd: int, reply: Payload) -> Payload:
        if client != liar or task != "fit":
            return reply
        return {k: (v * 1e6).astype(v.dtype) if is_float(v) else v for k, v in reply.items()}

    # Execute
    quiet_runner(cfg, tmp_path / "lied", after_task=scale).run()
    quiet_runner(cfg, tmp_path / "honest").run()

    # Assert: the aggregate stays within 2x of the honest run's largest value (a mean would be ~1e6x)
    lied = load_checkpoint(latest_checkpoint(tmp_path / "lied"))["algorithm"]  # type: ignore[arg-type]
    honest = load_checkpoint(latest_checkpoint(tmp_path / "honest"))["algorithm"]  # type: ignore[arg-type]
    assert 0 < largest_float(lied) <= 2 * largest_float(honest)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_the_norm_bound_applies_to_every_method_that_aggregates_tensors(
    algorithm: str, tmp_path: Path
) -> None:
    # Prepare: the adaptive screen off, an absolute bound; one client scales its fit reply x 1e6.
    settings = ("fed.rounds=1", "eval.before=false", "fed.screen=null", "fed.norm_bound=50")
    cfg = tiny_config(algorithm, *settings, *UPDATE_SETTINGS.get(algorithm, ()))
    liar = sorted(cfg_clients(cfg))[0]
    scaled: list[str] = []

    def scale(client: str, task: str, rnd: int, reply: Payload) -> Payload:
        if client != liar or task != "fit":
            return reply
        floats = {k for k, v in reply.items() if is_float(v) and v.size}
        scaled.extend(floats)
        return {k: (v * 1e6).astype(v.dtype) if k in floats else v for k, v in reply.items()}

    def crash(client: str, task: str, rnd: int) -> None:
        if client == liar and task == "fit":
            raise RuntimeError("gone")

    # Execute
    lied = quiet_runner(cfg, tmp_path / "lied", after_task=scale).run()
    quiet_runner(cfg, tmp_path / "absent", before_task=crash).run()

    # Assert: rejected by the bound, and the aggregate is the one without that client
    assert scaled, f"{algorithm}'s fit reply holds no float arrays"
    assert "update norm" in lied[1]["rejected"][liar] and "fed.norm_bound" in lied[1]["rejected"][liar]
    state_lied = load_checkpoint(latest_checkpoint(tmp_path / "lied"))  # type: ignore[arg-type]
    state_absent = load_checkpoint(latest_checkpoint(tmp_path / "absent"))  # type: ignore[arg-type]
    assert_trees_equal(state_lied["algorithm"], state_absent["algorithm"])


EVAL_LIES: dict[str, Any] = {"nan_metric": float("nan"), "count_huge": 10**9, "count_negative": -3}
"""A client evaluation reporting what it cannot have measured: a NaN metric, or more or fewer records
than the client holds."""


@pytest.mark.parametrize("lie", sorted(EVAL_LIES))
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_lying_evaluation_reply_is_rejected_and_left_out(algorithm: str, lie: str, tmp_path: Path) -> None:
    # Prepare: client evaluation on; the first client lies in every evaluation reply it sends.
    if not get_algorithm(algorithm).Config.personal_eval:
        pytest.skip(f"{algorithm} evaluates on the server only: no client evaluation replies")
    cfg = tiny_config(algorithm, "fed.rounds=1", "eval.personal=true", "eval.before=false")
    liar = sorted(cfg_clients(cfg))[0]
    lied_in: list[str] = []

    def lie_about(client: str, task: str, rnd: int, reply: Payload) -> Payload:
        if client != liar or not task.startswith("evaluate"):
            return reply
        lied_in.append(task)
        if lie == "nan_metric":
            metric = sorted(k for k in reply if k.startswith("metric/"))[0]
            return {**reply, metric: EVAL_LIES[lie]}
        return {**reply, "num_eval_examples": EVAL_LIES[lie]}

    # Execute
    history = quiet_runner(cfg, tmp_path / "run", after_task=lie_about).run()

    # Assert: the liar's reply rejected with a reason, left out of the row, and every value finite
    row = history[1]
    assert lied_in, f"{algorithm} sent no client evaluation task"
    assert liar in row["rejected"] and liar not in row.get("eval_by_client", {})
    assert row["eval_by_client"], "the honest clients' evaluations are kept"
    assert all(np.isfinite(v) for v in row["eval"].values() if isinstance(v, float))
