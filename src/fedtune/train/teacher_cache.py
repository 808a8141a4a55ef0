"""Teacher-output cache: outputs of frozen models on a fixed (public) set, computed once per run.

A distillation that runs every round against a frozen teacher (FedPT's ``z_l0 - alpha * z_s0``; a
frozen LLM's logits on the public set) needs the teacher's outputs only once. ``TeacherCache``
keeps them per batch index in memory or on disk (fp16 or fp32), keyed by a fingerprint of
everything they depend on, so a resumed run reads them back instead of recomputing.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor


class TeacherCache:
    """The frozen teacher part per distillation batch: computed once, then served from RAM or disk.

    ``disk`` keeps one ``.npy`` per batch under ``directory`` with a fingerprint of everything the
    values depend on; a different fingerprint (other models, alpha, data) clears the directory.
    """

    def __init__(self, mode: str, directory: Path, fingerprint: Mapping[str, Any], dtype: str) -> None:
        self.mode = mode
        self.directory = directory
        self.dtype = np.float16 if dtype == "fp16" else np.float32
        self._memory: dict[int, np.ndarray] = {}
        self.compute_seconds = 0.0
        if mode == "disk":
            meta = directory / "meta.json"
            wanted = json.dumps(dict(fingerprint), sort_keys=True)
            if not meta.is_file() or meta.read_text() != wanted:
                shutil.rmtree(directory, ignore_errors=True)
                directory.mkdir(parents=True)
                meta.write_text(wanted)

    def get(self, index: int, compute: Callable[[], Tensor]) -> Tensor:
        if self.mode == "memory" and index in self._memory:
            return torch.from_numpy(self._memory[index].astype(np.float32))
        path = self.directory / f"batch{index:05d}.npy"
        if self.mode == "disk" and path.is_file():
            return torch.from_numpy(np.load(path).astype(np.float32))
        start = time.perf_counter()
        values = compute().float().cpu().numpy().astype(self.dtype)
        self.compute_seconds += time.perf_counter() - start
        if self.mode == "memory":
            self._memory[index] = values
        elif self.mode == "disk":
            staging = path.with_suffix(".tmp.npy")
            np.save(staging, values)
            os.replace(staging, path)
        return torch.from_numpy(values.astype(np.float32))
