"""A process's copy of the global model, kept at a version of the seed/scalar history.

The global model at version v is the initial weights with the first v rounds of the history replayed
(``maths.replay``). Every party holds it this way: the server (for evaluation and, when cheaper, to
send it) and each client process (to train from it). A process loads its model once and only ever
moves it forward; a client's local steps happen inside ``local_steps``, which puts the version's
weights back afterwards, bit for bit.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import numpy as np
import torch

from fedtune.algorithms.fedkseed.maths import add_direction, replay
from fedtune.fl.payload import tensor_to_array


class ReplicaGap(RuntimeError):
    """The history sent does not reach back to the version this process holds (it restarted)."""


class SeedReplica:
    """``params`` (a model's named parameters, updated in place) at ``version`` rounds of the history."""

    def __init__(self, params: Mapping[str, torch.Tensor], seeds: np.ndarray, lr: float) -> None:
        self.params = dict(params)
        self.seeds = np.asarray(seeds, dtype=np.int64)
        self.lr = lr
        self.version = 0

    @property
    def tensors(self) -> list[torch.Tensor]:
        return list(self.params.values())

    def catch_up(self, start: int, rows: np.ndarray) -> None:
        """Move to version ``start + len(rows)`` given the history's rows from round ``start + 1`` on."""
        end = start + len(rows)
        if not start <= self.version <= end:
            raise ReplicaGap(
                f"fedkseed: this process holds the model at version {self.version}, and the history sent "
                f"covers versions {start} to {end}: it restarted since the server last reached it "
                "(the server sends the whole history next time)"
            )
        replay(self.tensors, self.seeds, rows[self.version - start :], self.lr)
        self.version = end

    def load(self, arrays: Mapping[str, np.ndarray], version: int) -> None:
        """Take the model of ``version`` as sent (``arrays`` keyed like ``params``)."""
        with torch.no_grad():
            for name, param in self.params.items():
                param.copy_(torch.from_numpy(np.asarray(arrays[name])))
        self.version = version

    def arrays(self) -> dict[str, np.ndarray]:
        return {name: tensor_to_array(p).copy() for name, p in self.params.items()}  # bf16 -> fp32

    def num_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.params.values())

    @contextmanager
    def local_steps(self, restore: str = "copy") -> Iterator[list[tuple[int, float]]]:
        """Step on ``self.tensors`` locally, recording each step ``(seed, scale)`` (``w += scale z(seed)``)
        in the list this yields; the version's weights are put back on exit.

        ``restore="copy"``: from a copy on the host taken on entry, bit for bit (one model's size of host
        memory). ``restore="undo"``: by the recorded steps taken back in reverse order, with no copy; the
        weights come back up to rounding (a few ulps per step), so the next client of this process, a
        resumed run or another backend may start from other last bits.
        """
        saved = (
            {name: p.detach().to("cpu", copy=True) for name, p in self.params.items()}
            if restore == "copy"
            else None
        )
        taken: list[tuple[int, float]] = []
        try:
            yield taken
        finally:
            with torch.no_grad():
                if saved is not None:
                    for name, param in self.params.items():
                        param.copy_(saved[name])
                else:
                    for seed, scale in reversed(taken):
                        add_direction(self.tensors, seed, -scale)
