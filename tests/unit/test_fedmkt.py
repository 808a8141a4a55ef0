"""FedMKT's maths and wire format on fixed tensors."""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedtune.algorithms.fedmkt.transfer import (
    NOT_SELECTED,
    dual_min_ce,
    mixed_loss,
    public_knowledge,
    soft_target_ce,
)
from fedtune.algorithms.fedmkt.wire import (
    DEFLATED,
    Knowledge,
    byte_planes,
    decode_ids,
    encode_ids,
    from_byte_planes,
    from_row_deltas,
    id_bytes,
    knowledge_spec,
    row_deltas,
    unpack_knowledge,
)
from fedtune.data.records import Record
from fedtune.data.tokenize import encode_records, make_batches
from fedtune.fl.validation import ReplySpec, validate_reply
from fedtune.models.tiny import tiny_model
from fedtune.train.losses import response_nll


def test_dual_min_ce_picks_the_least_loss_teacher_only_when_it_beats_the_learner() -> None:
    client_losses = np.array([[1.0, 2.0, 0.5, 0.3], [0.8, 3.0, 0.7, 0.3]])
    local = np.array([0.9, 1.5, 0.4, 1.0])

    choice = dual_min_ce(client_losses, local)

    # sample 0: client 1 (0.8 < 0.9); 1: best 2.0 >= 1.5; 2: best 0.5 >= 0.4; 3: tie -> client 0
    assert choice.tolist() == [1, NOT_SELECTED, NOT_SELECTED, 0]


def test_dual_min_ce_with_one_teacher_keeps_samples_it_predicts_better() -> None:
    assert dual_min_ce(np.array([[0.1, 0.5, 0.3]]), np.array([0.2, 0.5, 0.9])).tolist() == [0, -1, 0]


def test_dual_min_ce_rejects_mismatched_shapes() -> None:
    with pytest.raises(ValueError, match=r"\[K, 2\]"):
        dual_min_ce(np.zeros((2, 3)), np.zeros(2))


def test_soft_target_ce_is_the_cross_entropy_against_the_softmax_of_the_teacher_entries() -> None:
    student = torch.tensor([[1.0, 2.0, 0.5, -1.0], [0.0, 0.0, 0.0, 3.0]])
    ids = torch.tensor([[1, 3, -1], [3, -1, -1]])
    values = torch.tensor([[2.0, 1.0, float("-inf")], [0.0, float("-inf"), float("-inf")]])

    loss = soft_target_ce(student, ids, values)

    log_p = F.log_softmax(student, dim=-1)
    p1, p3 = math.exp(2.0) / (math.exp(2.0) + math.exp(1.0)), math.exp(1.0) / (math.exp(2.0) + math.exp(1.0))
    expected0 = -(p1 * log_p[0, 1] + p3 * log_p[0, 3])
    expected1 = F.cross_entropy(student[1:], torch.tensor([3]))  # a one-hot row is a hard target
    assert torch.allclose(loss, torch.stack([expected0, expected1]), atol=1e-6)


def test_soft_target_ce_rejects_ids_outside_the_student_vocabulary_and_empty_rows() -> None:
    student = torch.zeros(1, 4)
    with pytest.raises(ValueError, match="outside the student"):
        soft_target_ce(student, torch.tensor([[4]]), torch.tensor([[0.0]]))
    with pytest.raises(ValueError, match="no entry"):
        soft_target_ce(student, torch.tensor([[-1]]), torch.tensor([[float("-inf")]]))


def test_mixed_loss_weighs_ce_on_every_position_and_kd_on_selected_ones() -> None:
    torch.manual_seed(0)
    student = torch.randn(3, 5)
    targets = torch.tensor([0, 2, 4])
    ids = torch.tensor([[1, 2], [3, -1], [0, 4]])
    values = torch.tensor([[0.5, 0.1], [1.0, float("-inf")], [0.0, 2.0]])
    selected = torch.tensor([True, False, True])

    loss, ce, kd = mixed_loss(student, targets, ids, values, selected, lam=0.9)

    expected_ce = F.cross_entropy(student, targets, reduction="sum")
    expected_kd = soft_target_ce(student[[0, 2]], ids[[0, 2]], values[[0, 2]]).sum()
    assert torch.allclose(ce, expected_ce)
    assert torch.allclose(kd, expected_kd)
    assert torch.allclose(loss, 0.9 * expected_ce + 0.1 * expected_kd)
    none, _, kd_none = mixed_loss(student, targets, ids, values, torch.zeros(3, dtype=torch.bool), lam=0.0)
    assert float(none) == 0.0 and float(kd_none) == 0.0


def test_mixed_loss_gradient_flows_through_both_terms() -> None:
    student = torch.zeros(1, 3, requires_grad=True)
    loss, _, _ = mixed_loss(
        student, torch.tensor([0]), torch.tensor([[2]]), torch.tensor([[0.0]]), torch.tensor([True]), lam=0.5
    )
    loss.backward()
    assert student.grad is not None
    # d/dz of 0.5 CE(z, 0) + 0.5 CE(z, 2) at z = 0: softmax - (onehot0 + onehot2) / 2
    assert torch.allclose(student.grad, torch.tensor([[1 / 3 - 0.5, 1 / 3, 1 / 3 - 0.5]]))


@pytest.mark.parametrize(
    ("vocab", "width"),
    [(256, 1), (257, 2), (49152, 2), (151665, 3), (262144, 3), (1 << 24, 3), ((1 << 24) + 1, 4)],
)
def test_ids_travel_in_the_fewest_bytes(vocab: int, width: int) -> None:
    assert id_bytes(vocab) == width
    ids = np.array([[0, vocab - 1], [vocab // 2, 1]], dtype=np.int64)
    encoded = encode_ids(ids, vocab)
    assert encoded.nbytes == ids.size * width
    assert np.array_equal(decode_ids(encoded), ids)


def test_knowledge_round_trips_through_the_wire_in_fp16_and_narrow_ids() -> None:
    rng = np.random.default_rng(0)
    counts = [3, 1, 2]
    knowledge = Knowledge(
        np.array([0.5, 1.5, 2.5], dtype=np.float32),
        [rng.integers(0, 300, size=(n, 4)) for n in counts],
        [np.sort(rng.normal(size=(n, 4)), axis=1)[:, ::-1].astype(np.float32) for n in counts],
    )

    payload = knowledge.pack("p/", vocab_size=300)
    spec = ReplySpec(knowledge_spec("p/", counts, 4, 300))
    validate_reply(payload, spec)
    back = unpack_knowledge(payload, "p/", counts, 300, 4)

    assert payload["p/ids"].dtype == np.uint16 and payload["p/values"].dtype == np.float16
    assert sum(np.asarray(v).nbytes for v in payload.values()) == 3 * 4 + 6 * 4 * (2 + 2)
    for sent, got in zip(knowledge.ids, back.ids, strict=True):
        assert np.array_equal(sent, got)
    for sent, got in zip(knowledge.values, back.values, strict=True):
        assert np.allclose(sent, got, atol=2e-3)


@pytest.mark.parametrize(
    ("losses", "values", "reason"),
    [
        ([-1.0, 0.5], [[2.0, 1.0], [0.5, 0.1]], "negative"),
        ([1.0, 0.5], [[65504.0, 1.0], [0.5, 0.1]], "beyond"),
        ([1.0, 0.5], [[1.0, 2.0], [0.5, 0.1]], "descending"),
    ],
)
def test_knowledge_a_model_cannot_produce_is_refused(
    losses: list[float], values: list[list[float]], reason: str
) -> None:
    # A negative loss would win DualMinCE on every sample; garbage logits would be distilled.
    knowledge = Knowledge(
        np.array(losses, dtype=np.float32),
        [np.array([[1, 2]]), np.array([[3, 4]])],
        [np.array([row], dtype=np.float32) for row in values],
    )

    with pytest.raises(ValueError, match=reason):
        unpack_knowledge(knowledge.pack("p/", vocab_size=300), "p/", [1, 1], 300, 2)


def test_unpack_rejects_ids_outside_the_senders_vocabulary_and_wrong_counts() -> None:
    knowledge = Knowledge(
        np.zeros(1, dtype=np.float32), [np.array([[5, 299]])], [np.zeros((1, 2), np.float32)]
    )
    payload = knowledge.pack("p/", vocab_size=300)
    with pytest.raises(ValueError, match="token id 299 of a 290-token"):
        unpack_knowledge(payload, "p/", [1], 290, 2)
    with pytest.raises(ValueError, match="expected uint8"):
        unpack_knowledge(payload, "p/", [1], 200, 2)
    with pytest.raises(ValueError, match=r"expected uint16 \(2, 2\)"):
        unpack_knowledge(payload, "p/", [2], 300, 2)


def test_public_knowledge_gives_each_samples_mean_response_loss_and_top_k() -> None:
    model, tokenizer = tiny_model("llama", seed=1)
    records = [Record("say hi", "hello there"), Record("count", "one two three four"), Record("x", "y")]
    examples = encode_records(records, tokenizer, "alpaca", 64)
    batches = make_batches(examples, 2, int(tokenizer.pad_token_id), seed=0, bucketing=False, shuffle=False)

    losses, ids, values = public_knowledge(model, batches, top_k=3, vocab_size=len(tokenizer))

    for i, example in enumerate(examples):
        single = make_batches([example], 1, 0, seed=0, bucketing=False, shuffle=False)[0]
        with torch.no_grad():
            nll, count = response_nll(model, single)
            logits = model(input_ids=single["input_ids"]).logits[0, :-1]
        assert losses[i] == pytest.approx(float(nll) / count, rel=1e-5)
        labelled = torch.tensor(example.labels[1:]) != -100
        top = logits[labelled].topk(3, dim=-1)
        assert ids[i].shape == (count, 3)
        assert np.array_equal(ids[i], top.indices.numpy())
        assert np.allclose(values[i], top.values.numpy(), atol=1e-5)


def test_compressed_knowledge_round_trips_exactly_and_is_smaller() -> None:
    rng = np.random.default_rng(1)
    counts = [40, 24]
    knowledge = Knowledge(
        np.array([0.5, 1.5], dtype=np.float32),
        [np.sort(rng.integers(0, 5000, size=(n, 16)), axis=1) for n in counts],
        [np.sort(rng.normal(size=(n, 16)), axis=1)[:, ::-1].astype(np.float32) for n in counts],
    )
    plain = knowledge.pack("p/", 5000)
    packed = knowledge.pack("p/", 5000, compress=True)
    validate_reply(packed, ReplySpec(knowledge_spec("p/", counts, 16, 5000, compress=True), allow_extra=True))

    assert set(packed) == {"p/loss", "p/ids.planes.z", "p/values.planes.z"}
    assert sum(v.nbytes for v in packed.values()) < sum(v.nbytes for v in plain.values())
    a, b = unpack_knowledge(plain, "p/", counts, 5000, 16), unpack_knowledge(packed, "p/", counts, 5000, 16)
    assert all(np.array_equal(x, y) for x, y in zip(a.ids, b.ids, strict=True))
    assert all(np.array_equal(x, y) for x, y in zip(a.values, b.values, strict=True))


def test_byte_planes_put_the_nth_byte_of_every_element_together_least_significant_first() -> None:
    words = np.array([0x0102, 0x0304, 0x0506], dtype=np.uint16)
    three = encode_ids(np.array([[0x030201, 0x060504]]), 1 << 20)  # [1, 2, 3] uint8

    assert byte_planes(words, 2).tolist() == [0x02, 0x04, 0x06, 0x01, 0x03, 0x05]
    assert byte_planes(three, 3).tolist() == [0x01, 0x04, 0x02, 0x05, 0x03, 0x06]
    assert from_byte_planes(byte_planes(words, 2), 2).tolist() == [[2, 1], [4, 3], [6, 5]]


@pytest.mark.parametrize("vocab", [256, 49152, 151936, (1 << 24) + 1])
def test_byte_planes_round_trip_ids_of_every_width(vocab: int) -> None:
    rng = np.random.default_rng(vocab)
    encoded = encode_ids(rng.integers(0, vocab, size=(7, 5)), vocab)
    width = id_bytes(vocab)

    planes = byte_planes(encoded, width)
    back = from_byte_planes(planes, width)

    assert planes.dtype == np.uint8 and planes.shape == (encoded.nbytes,)
    assert np.array_equal(back.view(encoded.dtype.newbyteorder("<")).reshape(encoded.shape), encoded)


def test_row_deltas_of_fp16_bit_patterns_round_trip_every_value_exactly() -> None:
    rng = np.random.default_rng(2)
    special = [65504.0, -65504.0, 0.0, -0.0, 6e-8, -6e-8, 1.0, -1.0]
    values = np.concatenate([np.sort(rng.normal(0, 5, size=(6, 8)), axis=1)[:, ::-1], [special]]).astype(
        np.float16
    )
    bits = values.view(np.uint16)

    deltas = row_deltas(bits)
    back = from_row_deltas(deltas)

    assert deltas.dtype == np.uint16 and np.array_equal(deltas[:, 0], bits[:, 0])
    assert int(deltas[0, 1]) == (int(bits[0, 1]) - int(bits[0, 0])) % (1 << 16)
    assert np.array_equal(back.view(np.uint16), bits)  # bit-identical, -0.0 included


def test_deflated_top_k_is_smaller_than_plain_deflate_of_the_same_arrays() -> None:
    # A 152k-token vocabulary (3-byte ids) whose frequent tokens have low ids, as BPE vocabularies
    # do, and descending logits per row: what an LLM broadcasts.
    rng = np.random.default_rng(0)
    vocab, counts, k = 151936, [120, 180], 16
    weights = 1.0 / np.arange(1, vocab + 1) ** 1.1
    ids = rng.choice(vocab, size=(sum(counts), k), p=weights / weights.sum())
    top = rng.normal(18, 3, size=(sum(counts), 1))
    values = (top - np.cumsum(rng.exponential(0.6, size=(sum(counts), k)), axis=1)).astype(np.float32)
    knowledge = Knowledge(np.ones(2, np.float32), [ids[:120], ids[120:]], [values[:120], values[120:]])

    plain = knowledge.pack("p/", vocab)
    packed = knowledge.pack("p/", vocab, compress=True)
    back = unpack_knowledge(packed, "p/", counts, vocab, k)

    deflated = sum(len(zlib.compress(plain[f"p/{n}"].tobytes(), 6)) for n in ("ids", "values"))
    filtered = packed["p/ids" + DEFLATED].nbytes + packed["p/values" + DEFLATED].nbytes
    assert filtered < 0.85 * deflated
    assert np.array_equal(np.concatenate(back.ids), ids)
    assert np.array_equal(np.concatenate(back.values), values.astype(np.float16).astype(np.float32))


def test_deflated_top_k_of_another_size_or_not_deflated_is_rejected_without_inflating_it() -> None:
    knowledge = Knowledge(
        np.zeros(1, np.float32), [np.zeros((2, 2), np.int64)], [np.zeros((2, 2), np.float32)]
    )
    payload = knowledge.pack("p/", 300, compress=True)
    bomb = dict(payload, **{"p/ids.planes.z": np.frombuffer(zlib.compress(bytes(10**7)), np.uint8)})
    with pytest.raises(ValueError, match="inflates to other than the 8 bytes"):
        unpack_knowledge(bomb, "p/", [2], 300, 2)
    garbage = dict(payload, **{"p/values.planes.z": np.arange(9, dtype=np.uint8)})
    with pytest.raises(ValueError, match="not deflated data"):
        unpack_knowledge(garbage, "p/", [2], 300, 2)
    with pytest.raises(ValueError, match="unexpected arrays: p/extra"):
        unpack_knowledge(dict(payload, **{"p/extra": np.zeros(1)}), "p/", [2], 300, 2)
