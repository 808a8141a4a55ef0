"""FedBiOT on the wire: the payload prefixes and the layer layout a client rebuilds its emulator from."""

from __future__ import annotations

import numpy as np

from fedtune.fl.payload import Payload
from fedtune.models.surgery import (
    LayerSplit,
)

FROZEN = "frozen/"
EMULATOR = "emulator/"
LAYOUT = "layout/"


def split_from_layout(msg: Payload) -> LayerSplit:
    def ints(key: str) -> tuple[int, ...]:
        return tuple(int(i) for i in np.asarray(msg[LAYOUT + key]).tolist())

    kept, bottom, emulator = ints("kept"), ints("adapter_bottom"), ints("emulator")
    top = tuple(i for i in kept if i not in set(bottom) | set(emulator))
    return LayerSplit(int(msg[LAYOUT + "num_layers"]), bottom, top, emulator, emulator)


def layout_payload(split: LayerSplit) -> Payload:
    return {
        LAYOUT + "num_layers": split.num_layers,
        LAYOUT + "kept": np.asarray(split.kept, dtype=np.int32),
        LAYOUT + "adapter_bottom": np.asarray(split.adapter_bottom, dtype=np.int32),
        LAYOUT + "emulator": np.asarray(split.emulator, dtype=np.int32),
    }
