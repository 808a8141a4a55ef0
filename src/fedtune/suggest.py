"""The "did you mean" of every error about an unknown name (a config key, an algorithm, a dataset, a model).

It imports nothing of fedtune, so every layer may use it.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def closest(word: str, choices: Iterable[str], cutoff: float = 0.6) -> str | None:
    """The choice most like ``word`` (difflib's similarity ratio at least ``cutoff``); None if none is."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=cutoff)
    return close[0] if close else None
