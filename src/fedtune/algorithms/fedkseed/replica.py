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

from fedtune.algorithms.fedkseed.maths import replay


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
        return {name: p.detach().cpu().numpy().copy() for name, p in self.params.items()}

    def num_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.params.values())

    @contextmanager
    def local_steps(self) -> Iterator[list[torch.Tensor]]:
        """The parameters to step on locally; the version's weights are restored on exit.

        A copy on the host restores them exactly: undoing the steps (adding back each lr g z) would
        leave rounding residue, and the next client of this process would start from other bits.
        """
        saved = {name: p.detach().to("cpu", copy=True) for name, p in self.params.items()}
        try:
            yield self.tensors
        finally:
            with torch.no_grad():
                for name, param in self.params.items():
                    param.copy_(saved[name])
