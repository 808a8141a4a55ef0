"""Aligning two tokenizations of one text, and carrying top-k logits across (FedMKT, App. B (b)).

`align_sequences` is FuseLLM's / FATE-LLM's ``dtw``: the monotone path from (0, 0) to (S-1, T-1)
with steps (1, 1), (1, 0), (0, 1) minimising the summed cost of its cells, the cost of a cell being
the Levenshtein distance of the two token strings. Cumulative cost ``D[i, j] = C[i, j] +
min(D[i-1, j-1], D[i-1, j], D[i, j-1])``; the path is traced back from the last cell, taking the
first minimum of (diagonal, source step, target step), as FATE-LLM's ``np.argmin`` does.

Deviations from FATE-LLM: the cost is on the canonical strings of `fedtune.align.tokens`, where
FATE-LLM deletes the word-start marker before comparing (we keep it as the space it stands for: a
real character of the text); `one_to_one` asks that both positions appear once in the path, where
FATE-LLM asks it of the target position only and then also requires equal strings or a vocabulary
map hit (`agreeing_matches` applies that check when wanted); `project_topk` gives a one-hot value
of 0.0 (FATE-LLM: 1.0; the same distribution after softmax) and falls back to the one-hot when a
matched source row is all padding.

Speed: `brute_force_align_sequences` is the straightforward O(S*T) Python loop (one edit distance
call per cell), kept as the reference. `align_sequences` computes the distances of the distinct
strings only, in one C call (rapidfuzz), and runs the same recurrence and trace-back compiled
(numba), in integers, so both give the same table and path. (A numpy version, one cumulative
minimum per row, is exact too but spends ~S numpy calls: 10-25x the reference at S = 256-1024.)
"""

from __future__ import annotations

from collections.abc import Sequence

import numba
import numpy as np
from rapidfuzz import process
from rapidfuzz.distance import Levenshtein


def _codes(strings: Sequence[str]) -> tuple[list[str], np.ndarray]:
    """The distinct strings, and each string's index among them."""
    index: dict[str, int] = {}
    codes = [index.setdefault(text, len(index)) for text in strings]
    return list(index), np.asarray(codes, dtype=np.int64)


@numba.njit(cache=True)
def _dtw_path(distances: np.ndarray, source_codes: np.ndarray, target_codes: np.ndarray) -> np.ndarray:
    """The DTW path [P, 2] for the cost ``distances[source_codes[i], target_codes[j]]`` of cell (i, j)."""
    rows, columns = source_codes.size, target_codes.size
    table = np.empty((rows, columns), dtype=np.int64)
    for i in range(rows):
        costs = distances[source_codes[i]]
        for j in range(columns):
            if i == 0:
                best = table[0, j - 1] if j > 0 else 0
            elif j == 0:
                best = table[i - 1, 0]
            else:
                best = min(table[i - 1, j - 1], table[i - 1, j], table[i, j - 1])
            table[i, j] = costs[target_codes[j]] + best
    path = np.empty((rows + columns - 1, 2), dtype=np.int64)
    i, j, steps = rows - 1, columns - 1, 0
    path[0, 0], path[0, 1] = i, j
    while i > 0 or j > 0:
        if i > 0 and j > 0:
            diagonal, up, left = table[i - 1, j - 1], table[i - 1, j], table[i, j - 1]
            if diagonal <= up and diagonal <= left:
                i, j = i - 1, j - 1
            elif up <= left:
                i -= 1
            else:
                j -= 1
        elif i > 0:
            i -= 1
        else:
            j -= 1
        steps += 1
        path[steps, 0], path[steps, 1] = i, j
    return path[: steps + 1][::-1]


def align_sequences(source_strings: list[str], target_strings: list[str]) -> list[tuple[int, int]]:
    """The monotone DTW path between two token string sequences, as (source position, target
    position) pairs from (0, 0) to (S-1, T-1); empty if either sequence is."""
    if not source_strings or not target_strings:
        return []
    source_unique, source_codes = _codes(source_strings)
    target_unique, target_codes = _codes(target_strings)
    distances = process.cdist(source_unique, target_unique, scorer=Levenshtein.distance, dtype=np.int32)
    path = _dtw_path(distances, source_codes, target_codes)
    return [(i, j) for i, j in path.tolist()]


def brute_force_align_sequences(
    source_strings: list[str], target_strings: list[str]
) -> list[tuple[int, int]]:
    """The reference for `align_sequences`: the DTW recurrence cell by cell, in plain Python."""
    if not source_strings or not target_strings:
        return []
    inf = float("inf")
    table = [[inf] * (len(target_strings) + 1) for _ in range(len(source_strings) + 1)]
    table[0][0] = 0
    for i, source in enumerate(source_strings):
        for j, target in enumerate(target_strings):
            cost = Levenshtein.distance(source, target)
            table[i + 1][j + 1] = cost + min(table[i][j], table[i][j + 1], table[i + 1][j])
    i, j = len(source_strings), len(target_strings)
    path = [(i - 1, j - 1)]
    while i > 1 or j > 1:
        # The border of infinities keeps the walk inside the table.
        options = (table[i - 1][j - 1], table[i - 1][j], table[i][j - 1])
        step = options.index(min(options))
        i, j = (i - 1, j - 1) if step == 0 else (i - 1, j) if step == 1 else (i, j - 1)
        path.append((i - 1, j - 1))
    path.reverse()
    return path


def one_to_one(source_strings: list[str], target_strings: list[str]) -> np.ndarray:
    """int64 [T]: for each target position, the source position it is matched with 1:1 on the
    `align_sequences` path (each of the two appears exactly once in the path), else -1."""
    match = np.full(len(target_strings), -1, dtype=np.int64)
    path = align_sequences(source_strings, target_strings)
    if not path:
        return match
    pairs = np.asarray(path, dtype=np.int64)
    source_count = np.bincount(pairs[:, 0], minlength=len(source_strings))
    target_count = np.bincount(pairs[:, 1], minlength=len(target_strings))
    single = (source_count[pairs[:, 0]] == 1) & (target_count[pairs[:, 1]] == 1)
    match[pairs[single, 1]] = pairs[single, 0]
    return match


def agreeing_matches(
    match: np.ndarray,
    source_ids: np.ndarray,
    target_ids: np.ndarray,
    vmap: np.ndarray,
    source_strings: Sequence[str],
    target_strings: Sequence[str],
) -> np.ndarray:
    """FATE-LLM's extra check on 1:1 matches: keep ``match[j] = i`` only if the two tokens have the
    same string or the vocabulary map sends source token i to target token j; else -1. [T] int64."""
    kept = match.copy()
    for j in np.flatnonzero(match >= 0).tolist():
        i = int(match[j])
        same = source_strings[i] == target_strings[j] or vmap[source_ids[i]] == target_ids[j]
        if not same:
            kept[j] = -1
    return kept


def _first_occurrences(ids: np.ndarray) -> np.ndarray:
    """[R, k] bool: the entry is not padding (-1) and its id does not occur earlier in its row."""
    k = ids.shape[1]
    earlier = np.tril(np.ones((k, k), dtype=bool), -1)  # [p, q]: q < p
    repeated = ((ids[:, :, None] == ids[:, None, :]) & earlier).any(axis=2)
    return (ids >= 0) & ~repeated


def project_topk(
    source_ids: np.ndarray,
    source_values: np.ndarray,
    match: np.ndarray,
    vmap: np.ndarray,
    target_ids: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """A sender's top-k on the receiver's positions.

    source_ids, source_values: [S, k] top-k ids (source vocabulary, -1 padding) and logits per
    source position; match: [T] source position of each target position or -1; vmap: source id ->
    target id; target_ids: [T] the target sequence's own ids.
    Returns ids [T, k] int64 (-1 padding) and values [T, k] float32 (-inf padding). A matched row
    holds the source row's ids through ``vmap`` in order, an id already in the row skipped (first
    assignment wins), values carried over. An unmatched row (or one whose source row is all
    padding) is the one-hot ``ids[j, 0] = target_ids[j]``, ``values[j, 0] = 0.0``.
    """
    source_ids = np.asarray(source_ids, dtype=np.int64)
    match = np.asarray(match, dtype=np.int64)
    if source_ids.ndim != 2 or source_ids.shape[1] == 0:
        raise ValueError(f"source_ids must be [S, k] with k >= 1, got shape {source_ids.shape}")
    rows, k = len(match), source_ids.shape[1]
    ids = np.full((rows, k), -1, dtype=np.int64)
    values = np.full((rows, k), -np.inf, dtype=np.float32)
    matched = np.flatnonzero(match >= 0)
    picked = source_ids[match[matched]]
    mapped = np.where(picked >= 0, np.asarray(vmap, dtype=np.int64)[picked.clip(0)], -1)
    keep = _first_occurrences(mapped)
    # A stable sort of "dropped" moves the kept entries to the front in their order.
    order = np.argsort(~keep, axis=1, kind="stable")
    kept = np.take_along_axis(keep, order, axis=1)
    ids[matched] = np.where(kept, np.take_along_axis(mapped, order, axis=1), -1)
    carried = np.asarray(source_values, dtype=np.float32)[match[matched]]
    values[matched] = np.where(kept, np.take_along_axis(carried, order, axis=1), -np.inf)
    one_hot = np.ones(rows, dtype=bool)
    one_hot[matched] = ~kept[:, 0]
    ids[one_hot, 0] = np.asarray(target_ids, dtype=np.int64)[one_hot]
    values[one_hot, 0] = 0.0
    return ids, values
