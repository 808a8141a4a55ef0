"""FedPT's maths on fixed numbers worked out by hand: the proxy-tuned teacher of eq. 3 and the
distillation loss of eq. 5 (FedPT, Alg. 1 steps 4 and 5).

Sizes: two labelled positions (N = 2), a shared vocabulary of V = 2 ids; the small LM has one id more
(V_s = 3), the large LM two (V_l = 4): columns past V never enter the teacher.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace

import pytest
import torch

from fedtune.algorithms.fedpt.distillation import frozen_teacher, kd_loss, proxy_teacher

# Labels -100, 5, 6: positions 0 and 1 predict a labelled token (rows 0, 1 of the logits).
BATCH = {
    "input_ids": torch.tensor([[1, 5, 6]]),
    "attention_mask": torch.ones(1, 3, dtype=torch.long),
    "labels": torch.tensor([[-100, 5, 6]]),
}
Z_LARGE = torch.tensor([[1.0, 2.0, 9.0, 9.0], [0.0, -1.0, 9.0, 9.0]])  # z_l0 [N, V_l]
Z_BASE = torch.tensor([[0.5, 1.0, 7.0], [2.0, 0.0, 7.0]])  # z_s0 [N, V_s]: the small LM, LoRA off
Z_TUNED = torch.tensor([[1.5, 0.0, 7.0], [1.0, 1.0, 7.0]])  # z_sbar [N, V_s]: the aggregated small LM


class SmallLM(torch.nn.Module):
    """A small LM whose logits at the labelled positions are ``Z_TUNED``, or ``Z_BASE`` with its
    adapter disabled (the last position's row is never read)."""

    def __init__(self) -> None:
        super().__init__()
        self.adapter = True
        self.calls = 0

    @contextmanager
    def disable_adapter(self) -> Iterator[None]:
        self.adapter = False
        try:
            yield
        finally:
            self.adapter = True

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> SimpleNamespace:
        self.calls += 1
        rows = Z_TUNED if self.adapter else Z_BASE
        return SimpleNamespace(logits=torch.cat([rows, torch.zeros(1, 3)])[None])


class LargeLM:
    """The black-box large LM: its logits at the labelled positions are ``Z_LARGE``."""

    def labelled_logits(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return Z_LARGE.clone()


def test_the_teacher_is_eq_3_the_large_lm_shifted_by_alpha_times_what_tuning_changed() -> None:
    small = SmallLM()

    frozen = frozen_teacher(small, LargeLM(), BATCH, alpha=2.0, vocab_width=2)
    teacher = proxy_teacher(frozen, Z_TUNED, alpha=2.0, vocab_width=2)

    # C = z_l0 - 2 z_s0 = [[1 - 1, 2 - 2], [0 - 4, -1 - 0]]
    torch.testing.assert_close(frozen, torch.tensor([[0.0, 0.0], [-4.0, -1.0]]))
    # z_l0 + 2 (z_sbar - z_s0) = [[1 + 2 * 1, 2 + 2 * -1], [0 + 2 * -1, -1 + 2 * 1]]
    torch.testing.assert_close(teacher, torch.tensor([[3.0, 0.0], [-2.0, 1.0]]))
    assert small.adapter  # the adapter is back on after the base forward


def test_at_alpha_0_the_teacher_is_the_large_lm_and_the_small_lm_never_runs() -> None:
    small = SmallLM()

    frozen = frozen_teacher(small, LargeLM(), BATCH, alpha=0.0, vocab_width=2)
    teacher = proxy_teacher(frozen, Z_TUNED, alpha=0.0, vocab_width=2)

    torch.testing.assert_close(teacher, torch.tensor([[1.0, 2.0], [0.0, -1.0]]))
    assert small.calls == 0


def test_the_distillation_loss_is_eq_5_per_token() -> None:
    # Student rows: softmax over V_s = 3 -> [1/4, 1/4, 1/2] and [3/5, 1/5, 1/5]; over the shared V = 2
    # -> [1/2, 1/2] and [3/4, 1/4]. Teacher rows: softmax [3/4, 1/4] and [1/2, 1/2].
    student = torch.tensor([[0.0, 0.0, math.log(2.0)], [math.log(3.0), 0.0, 0.0]])
    targets = torch.tensor([0, 1])
    teacher = torch.tensor([[math.log(3.0), 0.0], [0.0, 0.0]])

    loss, ce, kl = kd_loss(student, targets, teacher, kd_lambda=0.1, vocab_width=2)

    # CE over the student's own vocabulary: -log(1/4) and -log(1/5), per token.
    ce_by_hand = (math.log(4.0) + math.log(5.0)) / 2
    # KL(teacher || student) over V, per token: 3/4 log(3/4 / 1/2) + 1/4 log(1/4 / 1/2) at the first
    # position, 1/2 log(1/2 / 3/4) + 1/2 log(1/2 / 1/4) at the second.
    first = 0.75 * math.log(1.5) + 0.25 * math.log(0.5)
    second = 0.5 * math.log(2 / 3) + 0.5 * math.log(2.0)
    kl_by_hand = (first + second) / 2
    assert ce == pytest.approx(ce_by_hand, rel=1e-6)
    assert kl == pytest.approx(kl_by_hand, rel=1e-6)
    assert loss.item() == pytest.approx(0.9 * ce_by_hand + 0.1 * kl_by_hand, rel=1e-6)


@pytest.mark.parametrize(("kd_lambda", "term"), [(0.0, "ce"), (1.0, "kl")])
def test_lambda_0_is_plain_fine_tuning_and_lambda_1_pure_distillation(kd_lambda: float, term: str) -> None:
    student = torch.tensor([[0.0, 0.0, math.log(2.0)], [math.log(3.0), 0.0, 0.0]])
    teacher = torch.tensor([[math.log(3.0), 0.0], [0.0, 0.0]])

    loss, ce, kl = kd_loss(student, torch.tensor([0, 1]), teacher, kd_lambda=kd_lambda, vocab_width=2)

    assert loss.item() == pytest.approx(ce if term == "ce" else kl, rel=1e-6)
