"""An index of a target vocabulary for the exact nearest-string search of the MinED vocabulary map
(`fedtune.align.vocab`): minimum Levenshtein distance, ties to the smallest target string (Python
``str`` order), then to the smallest id. Compiled with numba.

Strings are arrays of code points (Python orders ``str`` by code point, lone surrogates included).
Targets are numbered by their *rank*, their position in tie-rule order, so that comparing ranks is
the tie rule; ids come back only in the answer. For every character feature ``(c, j)`` ("at least j
copies of character c") the index lists the targets having it, by length and within a length by
rank, each entry with a 64-bit signature of the target's characters (bit ``bit[c]`` for character c;
the 63 most frequent characters have a bit each, the others share the last).

Search for a source s of L characters, its features f_1..f_L rarest first (a character no target has
enough copies of has an empty list). Bounds, all below the edit distance: the length difference;
``max(L, len(t))`` minus the characters s and t have in common as multisets (the *multiset bound*,
each character kept by an alignment is one of those); the same with the signature in place of t's
characters (the *signature bound*: a character of s counts as common when t has its bit). Prefix
filter: if ``lev(s, t) <= k < L``, t misses at most k of s's features, so it is in the list of one
of f_1..f_{k+1}, at a length within ``L +- k``.

- Round 0: the exact match, by binary search in f_1's list at length L (rank order is string order).
- Before round 1: a target sharing no character with s is in none of s's lists and at distance
  ``max(L, len(t))`` exactly. The first target in rank order among those of at most
  ``m = max(L, shortest target)`` characters is within distance m and ranked before every such
  target at the least distance, so it stands for all of them: it is verified first, and its
  distance D bounds the search (D, the best distance so far, only decreases).
- Round k = 1, 2, ...: the lists that the prefix filter adds (f_{k+1}, if k < L, at lengths
  ``L +- k``; f_1..f_k at lengths ``L - k`` and ``L + k``; f_1 also at L in round 1). An entry whose
  signature bound exceeds D is passed over; one whose bound b is above k waits for round b (a list
  per bound); else the multiset bound, likewise, then the distance (bit-parallel, Myers/Hyyrö; a
  plain dynamic programme above 64 characters). After round k every target within distance k has
  been verified, so the search ends once D <= k. In the round where D = k, a target ranked after the
  best cannot win (it is at distance >= k) and, lists being in rank order, the rest of the list is
  skipped: a source with thousands of ties (a script that shares only the space with the target
  vocabulary) looks at a few of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numba
import numpy as np

_ONE = np.uint64(1)
_BITS = 64
"""Sources up to this many characters use the one-word bit-parallel distance; longer ones the DP."""
_PARALLEL_FROM = 8192
"""Fewer sources than this are searched by one thread whatever ``workers`` says."""


def code_points(strings: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """All strings' code points, concatenated (int32), and the offsets of each string (int64 [n + 1])."""
    joined = "".join(strings).encode("utf-32-le", "surrogatepass")
    codes = np.frombuffer(joined, dtype="<u4").astype(np.int32)
    offsets = np.zeros(len(strings) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, strings), dtype=np.int64, count=len(strings)), out=offsets[1:])
    return codes, offsets


@numba.njit(cache=True)
def _key(codes: np.ndarray, offsets: np.ndarray, string: int, depth: int) -> int:
    """Code points ``depth``, ``depth + 1``, ``depth + 2`` of a string packed in one integer that
    sorts like them (each code point + 1 in 21 bits; 0: the string has ended)."""
    key = 0
    for position in range(depth, depth + 3):
        at = offsets[string] + position
        key = (key << 21) | (codes[at] + 1 if at < offsets[string + 1] else 0)
    return key


@numba.njit(cache=True)
def _sort_runs(order: np.ndarray, keys: np.ndarray, codes: np.ndarray, offsets: np.ndarray) -> None:
    """``order`` is sorted by ``keys`` (code points 0-2); sort every run of equal keys by the
    following code points, three at a time (most significant first), and a run of equal strings
    (their key shows that they have ended) by id. ``keys`` is overwritten."""
    segments = np.empty((order.size + 1, 3), dtype=np.int64)  # start, end, depth of runs to sort
    count = 0
    start = 0
    while start < order.size:
        end = start + 1
        while end < order.size and keys[end] == keys[start]:
            end += 1
        if end - start > 1:
            segments[count, 0], segments[count, 1] = start, end
            segments[count, 2] = 3 if keys[start] & 0x1FFFFF else -1
            count += 1
        start = end
    while count > 0:
        count -= 1
        start, end, depth = segments[count, 0], segments[count, 1], segments[count, 2]
        if depth < 0:  # equal strings: by id
            for i in range(start, end):
                keys[i] = order[i]
        else:
            for i in range(start, end):
                keys[i] = _key(codes, offsets, order[i], depth)
        if end - start <= 16:  # insertion sort of (key, order) pairs
            for i in range(start + 1, end):
                key, item = keys[i], order[i]
                j = i - 1
                while j >= start and keys[j] > key:
                    keys[j + 1], order[j + 1] = keys[j], order[j]
                    j -= 1
                keys[j + 1], order[j + 1] = key, item
        else:
            by_key = np.argsort(keys[start:end])
            order[start:end] = order[start:end][by_key]
            keys[start:end] = keys[start:end][by_key]
        if depth < 0:
            continue
        low = start
        while low < end:
            high = low + 1
            while high < end and keys[high] == keys[low]:
                high += 1
            if high - low > 1:
                segments[count, 0], segments[count, 1] = low, high
                segments[count, 2] = depth + 3 if keys[low] & 0x1FFFFF else -1
                count += 1
            low = high


def tie_order(codes: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """String ids in tie-rule order (by string, equal strings by id): a sort on the first three
    code points packed in one integer, then `_sort_runs`."""
    lengths = np.diff(offsets)
    keys = np.zeros(lengths.size, dtype=np.int64)
    for position in range(3):
        present = lengths > position
        column = np.zeros(lengths.size, dtype=np.int64)
        column[present] = codes[offsets[:-1][present] + position].astype(np.int64) + 1  # 0: no character
        keys = (keys << 21) | column  # code points < 2**21
    order = np.argsort(keys)
    _sort_runs(order, keys[order], codes, offsets)
    return order


@numba.njit(cache=True)
def _dense_alphabet(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Each code point's dense id (order of first appearance), the table code point -> dense id
    (-1: not in the alphabet), and the alphabet's size."""
    table = np.full(0x110000, -1, dtype=np.int32)
    dense = np.empty(codes.size, dtype=np.int32)
    size = 0
    for position in range(codes.size):
        code = codes[position]
        if table[code] < 0:
            table[code] = size
            size += 1
        dense[position] = table[code]
    return dense, table, size


@numba.njit(cache=True)
def _gather(values: np.ndarray, offsets: np.ndarray, order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Strings ``order[0], order[1], ...`` of (``values``, ``offsets``), concatenated; their offsets."""
    new_offsets = np.zeros(order.size + 1, dtype=np.int64)
    for i in range(order.size):
        new_offsets[i + 1] = new_offsets[i] + offsets[order[i] + 1] - offsets[order[i]]
    new_values = np.empty(values.size, dtype=values.dtype)
    for i in range(order.size):
        at = offsets[order[i]]
        for position in range(new_offsets[i], new_offsets[i + 1]):
            new_values[position] = values[at]
            at += 1
    return new_values, new_offsets


@numba.njit(cache=True)
def _postings(
    dense: np.ndarray, offsets: np.ndarray, by_length: np.ndarray, bit: np.ndarray, alphabet: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The feature lists of targets numbered by rank: feature (c, 1) is ``first[c]``, (c, j) is
    ``first[c] + j - 1`` for j <= ``most[c]``; its list is ``entries[start[f]:start[f + 1]]``, filled
    in ``by_length`` order (by length, then rank), an entry being ``(rank, signature)``. The list's
    part of targets of length ``lengths[d]`` begins at ``begins[d]``, for d in
    ``directory[f]:directory[f + 1]``."""
    count = np.zeros(alphabet, dtype=np.int64)
    most = np.zeros(alphabet, dtype=np.int64)
    feature = np.empty(dense.size, dtype=np.int64)
    targets = offsets.size - 1
    signatures = np.zeros(targets, dtype=np.uint64)
    for target in range(targets):
        signature = np.uint64(0)
        for position in range(offsets[target], offsets[target + 1]):
            char = dense[position]
            count[char] += 1
            feature[position] = count[char]
            most[char] = max(most[char], count[char])
            signature |= _ONE << np.uint64(bit[char])
        signatures[target] = signature
        for position in range(offsets[target], offsets[target + 1]):
            count[dense[position]] = 0
    first = np.zeros(alphabet + 1, dtype=np.int64)
    first[1:] = np.cumsum(most)
    start = np.zeros(first[alphabet] + 1, dtype=np.int64)
    for position in range(dense.size):
        feature[position] += first[dense[position]] - 1
        start[feature[position] + 1] += 1
    start = np.cumsum(start)
    fill = start[:-1].copy()
    entries = np.empty((dense.size, 2), dtype=np.uint64)
    for target in by_length:
        for position in range(offsets[target], offsets[target + 1]):
            at = fill[feature[position]]
            entries[at, 0] = target
            entries[at, 1] = signatures[target]
            fill[feature[position]] = at + 1
    # The length directory: where each length begins in each list.
    features = start.size - 1
    directory = np.zeros(features + 1, dtype=np.int64)
    lengths = np.empty(dense.size, dtype=np.int64)
    begins = np.empty(dense.size, dtype=np.int64)
    size = 0
    for f in range(features):
        previous = -1
        for at in range(start[f], start[f + 1]):
            target = entries[at, 0]
            length = offsets[target + 1] - offsets[target]
            if length != previous:
                lengths[size] = length
                begins[size] = at
                size += 1
                previous = length
        directory[f + 1] = size
    return first, most, start, entries, directory, lengths[:size].copy(), begins[:size].copy()


@numba.njit(cache=True, inline="always")
def _popcount(x: np.uint64) -> int:
    x = x - ((x >> np.uint64(1)) & np.uint64(0x5555555555555555))
    x = (x & np.uint64(0x3333333333333333)) + ((x >> np.uint64(2)) & np.uint64(0x3333333333333333))
    x = (x + (x >> np.uint64(4))) & np.uint64(0x0F0F0F0F0F0F0F0F)
    return int((x * np.uint64(0x0101010101010101)) >> np.uint64(56))


@numba.njit(cache=True, inline="always")
def _distance_bits(
    peq: np.ndarray, pattern_length: int, text: np.ndarray, text_start: int, text_end: int, cutoff: int
) -> int:
    """Levenshtein distance of a pattern of 1..64 characters (``peq[c]``: the bit mask of its
    positions holding character c) to ``text[text_start:text_end]``, or ``cutoff + 1`` when it
    exceeds ``cutoff`` (Myers/Hyyrö bit-parallel, one column per text character)."""
    size = text_end - text_start
    if abs(size - pattern_length) > cutoff:
        return cutoff + 1
    vp = ~np.uint64(0)
    vn = np.uint64(0)
    last = _ONE << np.uint64(pattern_length - 1)
    score = pattern_length
    for j in range(size):
        eq = peq[text[text_start + j]]
        xv = eq | vn
        xh = (((eq & vp) + vp) ^ vp) | eq
        hp = vn | ~(xh | vp)
        hn = vp & xh
        if hp & last:
            score += 1
        elif hn & last:
            score -= 1
        if score - (size - j - 1) > cutoff:  # each remaining character lowers it by one at most
            return cutoff + 1
        hp = (hp << _ONE) | _ONE
        hn = hn << _ONE
        vp = hn | ~(xv | hp)
        vn = hp & xv
    return score


@numba.njit(cache=True)
def _distance_table(
    source: np.ndarray, source_start: int, source_end: int, text: np.ndarray, text_start: int, text_end: int,
    cutoff: int,
) -> int:  # fmt: skip
    """`_distance_bits` for any lengths: the dynamic programme, one row at a time."""
    rows, columns = source_end - source_start, text_end - text_start
    if abs(rows - columns) > cutoff:
        return cutoff + 1
    previous = np.arange(columns + 1)
    current = np.empty(columns + 1, dtype=previous.dtype)
    for i in range(1, rows + 1):
        current[0] = i
        char = source[source_start + i - 1]
        row_min = i
        for j in range(1, columns + 1):
            substitution = previous[j - 1] + (0 if char == text[text_start + j - 1] else 1)
            value = min(previous[j] + 1, current[j - 1] + 1, substitution)
            current[j] = value
            row_min = min(row_min, value)
        if row_min > cutoff:
            return cutoff + 1
        previous, current = current, previous
    return min(previous[columns], cutoff + 1)


@numba.njit(cache=True, inline="always")
def _compare(a: np.ndarray, a_start: int, b: np.ndarray, b_start: int, length: int) -> int:
    """-1, 0 or 1 as ``a[a_start:][:length]`` sorts before, equal to or after ``b[b_start:][:length]``."""
    for i in range(length):
        if a[a_start + i] != b[b_start + i]:
            return -1 if a[a_start + i] < b[b_start + i] else 1
    return 0


@numba.njit(cache=True, inline="always")
def _bag_bound(
    source_count: np.ndarray, used: np.ndarray, target: np.ndarray, start: int, end: int, length: int
) -> int:
    """The multiset bound: ``max(L, len(t))`` minus the characters in common as multisets."""
    common = 0
    for position in range(start, end):
        char = target[position]
        if used[char] < source_count[char]:
            used[char] += 1
            common += 1
    for position in range(start, end):
        used[target[position]] = 0
    return max(length, end - start) - common


@numba.njit(cache=True)
def _nearest(
    source: np.ndarray,
    raw_source: np.ndarray,
    source_offsets: np.ndarray,
    target: np.ndarray,
    raw_target: np.ndarray,
    target_offsets: np.ndarray,
    bit: np.ndarray,
    first: np.ndarray,
    most: np.ndarray,
    start: np.ndarray,
    entries: np.ndarray,
    directory: np.ndarray,
    lengths: np.ndarray,
    begins: np.ndarray,
    shortest_up_to: np.ndarray,
    result: np.ndarray,
    part: int,
    parts: int,
) -> None:
    """``result[i]``: the rank of the nearest target of source i (module docstring), for the sources
    i = part, part + parts, ... Targets are numbered by rank; ``source`` and ``target`` hold dense
    character ids (-1: in no target), ``raw_*`` the code points; ``shortest_up_to[n]`` is the first
    target in rank order among those of at most n characters."""
    alphabet = max(most.size, 1)
    stamp = np.zeros(target_offsets.size - 1, dtype=np.int32)
    peq = np.zeros(alphabet, dtype=np.uint64)
    source_count = np.zeros(alphabet, dtype=np.int64)
    used = np.zeros(alphabet, dtype=np.int64)
    weights = np.zeros(64, dtype=np.int64)
    longest = shortest_up_to.size - 1
    shortest = 0
    while shortest_up_to[shortest] < 0:
        shortest += 1
    source_longest = 0
    for index in range(source_offsets.size - 1):
        source_longest = max(source_longest, source_offsets[index + 1] - source_offsets[index])
    # Candidates whose bound exceeds the round they were met in wait in per-bound linked lists; an
    # entry ~t (negative) is a target whose multiset bound is known and that is stamped already.
    # A source meets each list entry once, and waits a target at most once more after its multiset bound.
    head = np.full(max(source_longest, longest) + 2, -1, dtype=np.int64)
    waiting = np.empty(entries.shape[0] + stamp.size, dtype=np.int64)
    waiting_next = np.empty(entries.shape[0] + stamp.size, dtype=np.int64)
    for index in range(part, source_offsets.size - 1, parts):
        mark = index + 1
        s_start, s_end = source_offsets[index], source_offsets[index + 1]
        length = s_end - s_start
        features = np.full(length, -1, dtype=np.int64)
        sizes = np.zeros(length, dtype=np.int64)
        for i in range(length):
            char = source[s_start + i]
            if char >= 0:
                source_count[char] += 1
                weights[bit[char]] += 1
                if source_count[char] <= most[char]:
                    features[i] = first[char] + source_count[char] - 1
                    sizes[i] = start[features[i] + 1] - start[features[i]]
        features = features[np.argsort(sizes, kind="mergesort")]
        # sum_j popcount(signature & masks[j]) counts the source's characters whose bit the target has.
        heaviest = weights.max()
        masks = np.zeros(heaviest, dtype=np.uint64)
        for b in range(64):
            for j in range(weights[b]):
                masks[j] |= _ONE << np.uint64(b)
        bits = 0 < length <= _BITS
        if bits:
            for i in range(length):
                if source[s_start + i] >= 0:
                    peq[source[s_start + i]] |= _ONE << np.uint64(i)
        best = np.int64(-1)
        if length > 0 and features[0] >= 0:  # round 0: the exact match, if any
            f = features[0]
            for d in range(directory[f], directory[f + 1]):
                if lengths[d] == length:
                    low = begins[d]
                    high = begins[d + 1] if d + 1 < directory[f + 1] else start[f + 1]
                    while low < high:  # the first entry whose string is >= the source
                        middle = (low + high) // 2
                        candidate = np.int64(entries[middle, 0])
                        if _compare(raw_target, target_offsets[candidate], raw_source, s_start, length) < 0:
                            low = middle + 1
                        else:
                            high = middle
                    end = begins[d + 1] if d + 1 < directory[f + 1] else start[f + 1]
                    if low < end:
                        candidate = np.int64(entries[low, 0])
                        if _compare(raw_target, target_offsets[candidate], raw_source, s_start, length) == 0:
                            best = candidate
                    break
        if best < 0:
            best = shortest_up_to[min(max(length, shortest), longest)]
            t_start, t_end = target_offsets[best], target_offsets[best + 1]
            limit = max(length, shortest) + longest + 1  # above any distance
            if bits:
                best_distance = _distance_bits(peq, length, target, t_start, t_end, limit)
            else:
                best_distance = _distance_table(source, s_start, s_end, target, t_start, t_end, limit)
            stamp[best] = mark
            head[: best_distance + 1] = -1
            waiting_size = 0
            k = 0
            while best_distance > k:
                k += 1
                entry = head[k]
                while entry >= 0:
                    candidate = waiting[entry]
                    entry = waiting_next[entry]
                    if candidate < 0:
                        candidate = ~candidate
                    elif stamp[candidate] == mark:
                        continue
                    else:
                        stamp[candidate] = mark
                        t_start, t_end = target_offsets[candidate], target_offsets[candidate + 1]
                        bound = _bag_bound(source_count, used, target, t_start, t_end, length)
                        if bound > k:
                            if bound <= best_distance:
                                waiting[waiting_size] = ~candidate
                                waiting_next[waiting_size] = head[bound]
                                head[bound] = waiting_size
                                waiting_size += 1
                            continue
                    if best_distance == k and candidate > best:
                        continue
                    t_start, t_end = target_offsets[candidate], target_offsets[candidate + 1]
                    if bits:
                        distance = _distance_bits(peq, length, target, t_start, t_end, best_distance)
                    else:
                        distance = _distance_table(
                            source, s_start, s_end, target, t_start, t_end, best_distance
                        )
                    if distance < best_distance or (distance == best_distance and candidate < best):
                        best, best_distance = candidate, distance
                for i in range(min(k + 1, length)):
                    f = features[i]
                    if f < 0:
                        continue
                    # Feature i joins in round max(i, 1) over L +- k; later rounds add two new lengths.
                    joins = k == max(i, 1)
                    for d in range(directory[f], directory[f + 1]):
                        list_length = lengths[d]
                        if abs(list_length - length) > k or (not joins and abs(list_length - length) < k):
                            continue
                        end = begins[d + 1] if d + 1 < directory[f + 1] else start[f + 1]
                        for position in range(begins[d], end):
                            candidate = np.int64(entries[position, 0])
                            if best_distance == k and candidate > best:
                                break  # at distance >= k and ranked after the best: so is the rest
                            common = 0
                            for j in range(heaviest):
                                common += _popcount(entries[position, 1] & masks[j])
                            bound = max(length, list_length) - min(common, list_length)
                            if bound > best_distance:
                                continue
                            if bound > k:  # met again in round `bound` if still in the running
                                waiting[waiting_size] = candidate
                                waiting_next[waiting_size] = head[bound]
                                head[bound] = waiting_size
                                waiting_size += 1
                                continue
                            if stamp[candidate] == mark:
                                continue
                            stamp[candidate] = mark
                            t_start, t_end = target_offsets[candidate], target_offsets[candidate + 1]
                            bound = _bag_bound(source_count, used, target, t_start, t_end, length)
                            if bound > k:
                                if bound <= best_distance:
                                    waiting[waiting_size] = ~candidate
                                    waiting_next[waiting_size] = head[bound]
                                    head[bound] = waiting_size
                                    waiting_size += 1
                                continue
                            if bits:
                                distance = _distance_bits(peq, length, target, t_start, t_end, best_distance)
                            else:
                                distance = _distance_table(
                                    source, s_start, s_end, target, t_start, t_end, best_distance
                                )
                            if distance < best_distance or (distance == best_distance and candidate < best):
                                best, best_distance = candidate, distance
        for i in range(length):
            char = source[s_start + i]
            if char >= 0:
                source_count[char] = 0
                peq[char] = 0
                weights[bit[char]] = 0
        result[index] = best


@numba.njit(cache=True, parallel=True)
def _nearest_parallel(
    source: np.ndarray,
    raw_source: np.ndarray,
    source_offsets: np.ndarray,
    target: np.ndarray,
    raw_target: np.ndarray,
    target_offsets: np.ndarray,
    bit: np.ndarray,
    first: np.ndarray,
    most: np.ndarray,
    start: np.ndarray,
    entries: np.ndarray,
    directory: np.ndarray,
    lengths: np.ndarray,
    begins: np.ndarray,
    shortest_up_to: np.ndarray,
    result: np.ndarray,
    parts: int,
) -> None:
    """`_nearest` on ``parts`` interleaved shares of the sources, one per thread."""
    for part in numba.prange(parts):
        _nearest(
            source, raw_source, source_offsets, target, raw_target, target_offsets, bit, first, most,
            start, entries, directory, lengths, begins, shortest_up_to, result, part, parts,
        )  # fmt: skip


@dataclass(frozen=True)
class TargetIndex:
    """A target vocabulary prepared for `nearest` (module docstring). Targets are numbered by rank."""

    by_rank: np.ndarray
    """The target id of each rank."""
    raw: np.ndarray
    dense: np.ndarray
    offsets: np.ndarray
    table: np.ndarray
    bit: np.ndarray
    first: np.ndarray
    most: np.ndarray
    start: np.ndarray
    entries: np.ndarray
    directory: np.ndarray
    lengths: np.ndarray
    begins: np.ndarray
    shortest_up_to: np.ndarray

    @classmethod
    def build(cls, target_strings: Sequence[str]) -> TargetIndex:
        if not target_strings:
            raise ValueError("the target vocabulary is empty")
        codes, offsets = code_points(target_strings)
        by_rank = tie_order(codes, offsets)
        raw, offsets = _gather(codes, offsets, by_rank)
        sizes = np.diff(offsets)
        narrow = np.int16 if sizes.max() < 2**15 else np.int64  # 16 bits: numpy's radix sort
        by_length = np.argsort(sizes.astype(narrow), kind="stable")  # by length, then rank
        dense, table, alphabet = _dense_alphabet(raw)
        # Signature bits: the 63 most frequent characters one each, all others bit 63.
        frequent = np.argsort(-np.bincount(dense, minlength=alphabet), kind="stable")
        bit = np.full(alphabet, 63, dtype=np.int64)
        bit[frequent[:63]] = np.arange(min(63, alphabet))
        first, most, start, entries, directory, lengths, begins = _postings(
            dense, offsets, by_length, bit, alphabet
        )
        # The first target in rank order of each length, then of each length or less (-1: none).
        sorted_sizes = sizes[by_length]
        group_starts = np.concatenate(([0], np.flatnonzero(np.diff(sorted_sizes)) + 1))
        leaders = np.full(int(sizes.max()) + 1, sizes.size, dtype=np.int64)
        leaders[sorted_sizes[group_starts]] = by_length[group_starts]
        shortest_up_to = np.minimum.accumulate(leaders)
        shortest_up_to[shortest_up_to == sizes.size] = -1
        return cls(
            by_rank=by_rank, raw=raw, dense=dense, offsets=offsets, table=table, bit=bit, first=first,
            most=most, start=start, entries=entries, directory=directory, lengths=lengths, begins=begins,
            shortest_up_to=shortest_up_to,
        )  # fmt: skip

    def nearest(self, source_strings: Sequence[str], workers: int = 1) -> np.ndarray:
        """int64 [len(source_strings)]: each source's nearest target id by the tie rule; ``workers``
        threads when there are many sources."""
        codes, offsets = code_points(source_strings)
        ranks = np.empty(len(source_strings), dtype=np.int64)
        arguments = (
            self.table[codes], codes, offsets, self.dense, self.raw, self.offsets, self.bit, self.first,
            self.most, self.start, self.entries, self.directory, self.lengths, self.begins,
            self.shortest_up_to, ranks,
        )  # fmt: skip
        threads = min(workers, numba.config.NUMBA_NUM_THREADS)  # type: ignore[attr-defined]
        if threads <= 1 or len(source_strings) < _PARALLEL_FROM:
            _nearest(*arguments, 0, 1)
        else:
            import torch  # numba's OpenMP layer shares torch's libgomp (below)

            torch_threads = torch.get_num_threads()
            previous = numba.get_num_threads()
            numba.set_num_threads(threads)
            try:
                _nearest_parallel(*arguments, threads)
            finally:
                numba.set_num_threads(previous)
                # numba's first threaded launch in a process sets OpenMP to numba's thread count (every
                # CPU), which torch then computes on for the rest of the process: give it back its own
                torch.set_num_threads(torch_threads)
        return self.by_rank[ranks]
