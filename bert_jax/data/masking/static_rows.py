"""Static masking of many rows at once: array operations, exactly the draws of ``mask_ids``.

Public API:

- ``mask_rows(input_ids, lengths, masking, rng) -> (masked_ids, masked_lm_positions,
  masked_lm_ids, num_predictions)``: ``static_sequence.mask_ids`` applied to every row in row
  order with one ``rng``. The results are identical and ``rng`` is left in the identical state; the
  outputs are padded arrays (positions and ids 0 past ``num_predictions``).

Why it exists: masking a row with ``mask_ids`` is mostly the per-call overhead of NumPy's
Generator (``choice``, ``random``, ``integers``), which made it the largest stage of ``data
prepare`` with several dupe passes (figures in docs/performance.md, data preparation).

How it stays exact. The Generator's PCG64 is read once per batch (``random_raw``), and what
NumPy does with those 64-bit outputs for the three calls is replayed on arrays
(numpy/random/_generator.pyx and distributions.c):

- a bounded integer in [0, r] takes one 32-bit draw ``u`` and is ``(u * (r + 1)) >> 32``
  (Lemire's method); it is redrawn when the low 32 bits of that product are below
  ``(2**32 - (r + 1)) % (r + 1)``, and r == 0 draws nothing;
- a 32-bit draw is the low half of a fresh 64-bit output; the high half waits in the bit
  generator and is the next 32-bit draw, even when doubles are drawn in between;
- a double is one whole 64-bit output ``x``: ``(x >> 11) * 2**-53``;
- ``choice(n, k, replace=False)`` with n <= 10,000 is Floyd's algorithm (a bounded draw in
  [0, j] for j from n - k to n - 1, taking j itself when the draw is already taken), then a
  Fisher-Yates shuffle of the k picks (bounded draws in [0, i], i from k - 1 down to 1). The
  positions are sorted afterwards, so the shuffle only counts for the draws it uses.

Only the order of the draws is sequential (how many replacements a row draws depends on its
doubles), so one short Python loop walks it and the rest runs on arrays. A row whose draws meet
a redraw (about one in 10^5 rows with a 30k vocabulary) is masked by ``mask_ids`` itself on the
Generator set to that row's state, and the batch goes on after it. Other bit generators,
whole-word masking and rows of over 10,000 candidates (NumPy's ``choice`` then shuffles
instead) are masked row by row with ``mask_ids``. tests/test_data_row_masking.py compares both
paths with ``mask_ids``, redraws included, so a NumPy that draws differently fails there.
"""

from __future__ import annotations

import sys

import numpy as np

from bert_jax.data.masking.settings import MaskingConfig
from bert_jax.data.masking.static_sequence import mask_ids

_FLOYD_MAX_POPULATION = 10_000  # NumPy's choice uses Floyd's algorithm up to this population
# Rows masked from one stream: a redraw makes the rows after it start again from a new one.
_WINDOW = 2048
_LOW_32 = np.uint64(0xFFFFFFFF)
_TWO_32 = np.uint64(1 << 32)
_DOUBLE_SCALE = 1.0 / 9007199254740992.0  # 2**-53


class _Stream:
    """A PCG64's next raw outputs as 32-bit halves and doubles, and setting its state back.

    Raw index ``offset`` is the first output drawn here; when the bit generator held a waiting
    high half, it sits in a placeholder at index 0 so that every 32-bit draw is ``halves[u]``
    (``halves[2 * j]`` the low, ``halves[2 * j + 1]`` the high half of output ``j``).
    """

    def __init__(self, bit_generator, count: int):
        self.bit_generator = bit_generator
        self.start_state = bit_generator.state
        waiting = bool(self.start_state["has_uint32"])
        raw = bit_generator.random_raw(count)
        if waiting:
            head = np.uint64(self.start_state["uinteger"]) << np.uint64(32)
            raw = np.concatenate([np.asarray([head], dtype=np.uint64), raw])
        self.offset = int(waiting)
        self.raw = raw
        if sys.byteorder == "little":
            self.halves = raw.view(np.uint32)
        else:
            self.halves = np.stack([raw & _LOW_32, raw >> np.uint64(32)], axis=1).ravel()
        self.doubles = (raw >> np.uint64(11)).astype(np.float64) * _DOUBLE_SCALE

    def set_state(self, position: int, wait: int, last: int) -> None:
        """The bit generator as after drawing raw outputs up to ``position``, with the half at
        index ``wait`` waiting (none if negative); ``last`` is the last half that waited (the
        bit generator keeps it after use; -1: the one it had before)."""
        bit_generator = self.bit_generator
        bit_generator.state = self.start_state
        bit_generator.advance(position - self.offset)  # clears the waiting half
        state = bit_generator.state
        state["has_uint32"] = int(wait >= 0)
        state["uinteger"] = int(self.halves[last]) if last >= 0 else self.start_state["uinteger"]
        bit_generator.state = state


def _bounded(halves: np.ndarray, index: np.ndarray, excl: np.ndarray):
    """Lemire draws in [0, excl): the values and whether NumPy would have redrawn."""
    excl = excl.astype(np.uint64)
    product = halves[index].astype(np.uint64) * excl
    redraw = (product & _LOW_32) < (_TWO_32 - excl) % excl
    return (product >> np.uint64(32)).astype(np.int64), redraw


def _ragged_arange(counts: np.ndarray) -> np.ndarray:
    """``concatenate([arange(c) for c in counts])``."""
    total = int(counts.sum())
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    return np.arange(total, dtype=np.int64) - starts


def mask_rows(
    input_ids: np.ndarray,
    lengths: np.ndarray,
    masking: MaskingConfig,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``mask_ids`` on each row ``input_ids[i, :lengths[i]]`` in order (module docstring).

    Returns int32 arrays: masked ids [N, L] (columns past a row's length unchanged), positions
    and original ids [N, max_predictions_per_seq] (ascending, then 0), and the number of
    predictions per row [N].
    """
    input_ids = np.asarray(input_ids)
    lengths = np.asarray(lengths, dtype=np.int64)
    num_rows, width = input_ids.shape
    slots = masking.max_predictions_per_seq
    masked = input_ids.astype(np.int32)  # a copy
    positions = np.zeros((num_rows, slots), dtype=np.int32)
    labels = np.zeros((num_rows, slots), dtype=np.int32)
    num_predictions = np.zeros(num_rows, dtype=np.int32)
    if num_rows == 0:
        return masked, positions, labels, num_predictions
    columns = np.arange(width)
    in_row = columns < lengths[:, None]
    table = masking.never_mask_table
    row_by_row = (
        masking.word_start_table is not None
        or type(rng.bit_generator) is not np.random.PCG64
        or int(input_ids.min()) < 0
        or int(input_ids.max()) >= table.shape[0]
    )
    if not row_by_row:
        candidate = in_row & ~table[input_ids]
        population = candidate.sum(axis=1)
        row_by_row = int(population.max()) > _FLOYD_MAX_POPULATION
    outputs = (masked, positions, labels, num_predictions)
    if row_by_row:
        for row in range(num_rows):
            _mask_one(input_ids, lengths, row, masking, rng, outputs)
        return outputs
    picks = masking.num_to_predict_table(width)[population]
    start = 0
    while start < num_rows:
        end = min(start + _WINDOW, num_rows)
        rows = slice(start, end)
        redrawn = start + _mask_fast(
            input_ids[rows],
            candidate[rows],
            population[rows],
            picks[rows],
            masking,
            rng,
            tuple(output[rows] for output in outputs),
        )
        if redrawn < end:
            _mask_one(input_ids, lengths, redrawn, masking, rng, outputs)
            redrawn += 1
        start = redrawn
    return outputs


def _mask_one(input_ids, lengths, row, masking, rng, outputs) -> None:
    """``mask_ids`` on one row, written into ``outputs``."""
    masked, positions, labels, num_predictions = outputs
    ids, row_positions, row_labels = mask_ids(input_ids[row, : lengths[row]].tolist(), masking, rng)
    count = len(row_positions)
    masked[row, : lengths[row]] = ids
    positions[row, :count] = row_positions
    labels[row, :count] = row_labels
    num_predictions[row] = count


def _mask_fast(input_ids, candidate, n, k, masking, rng, outputs) -> int:
    """Mask the rows from one stream; returns the first row that met a redraw (not written,
    ``rng`` set to where it starts) or the number of rows (``rng`` set past them)."""
    masked, positions, labels, num_predictions = outputs
    count = len(k)
    # Per row, in this order: ``choice`` (Floyd's bounded draws, none for j == 0, i.e. when
    # k == n, then the shuffle's k - 1), k doubles, one bounded draw per random replacement.
    starts_at_zero = (k == n) & (k > 0)
    choice_draws = np.where(k > 0, 2 * k - 1 - starts_at_zero, 0)
    replacement_range = int(masking.ordinary_ids.shape[0]) - 1  # 0: ``integers`` draws nothing
    # Raw outputs a row needs: at most (a + 1) / 2 + k + (m + 1) / 2 with a < 2k and m <= k.
    stream = _Stream(rng.bit_generator, int((3 * k + 2).sum()) + 2)
    waited = stream.offset  # 1: the first 32-bit draw is the half that was waiting
    doubles = stream.doubles
    doubles_before = np.cumsum(k) - k

    # The one sequential part: how many replacements each row draws depends on where its
    # doubles are, which depends on how many 32-bit draws came before (two per raw output).
    if replacement_range > 0:
        _, to_random = masking.outcomes(doubles)
        random_before = np.concatenate([[0], np.cumsum(to_random)]).tolist()
        counts = []
        drawn = waited + 1  # 32-bit draws so far (+ waited + 1, for the rounding below)
        for a, picked, before in zip(choice_draws.tolist(), k.tolist(), doubles_before.tolist()):
            first = (drawn + a) // 2 + before  # raw index of the row's first double
            m = random_before[first + picked] - random_before[first]
            counts.append(m)
            drawn += a + m
        replacements = np.asarray(counts, dtype=np.int64)
    else:
        replacements = np.zeros(count, dtype=np.int64)
    per_row = choice_draws + replacements
    draws_before = np.cumsum(per_row) - per_row
    total_draws = int(per_row.sum())

    # Where every 32-bit draw is in ``halves``: draw d (counted from the waiting half, if
    # any) is half (d & 1) of the raw output split for it, which comes after d >> 1 earlier
    # splits and the doubles drawn before that split.
    runs = np.stack([choice_draws, replacements], axis=1).ravel()
    split_after = np.repeat(np.stack([doubles_before, doubles_before + k], axis=1).ravel(), runs)
    d = np.arange(total_draws, dtype=np.int64) + waited
    high = d & 1
    split_after = np.where(high == 1, np.concatenate([[0], split_after[:-1]]), split_after)
    draw_half = 2 * ((d >> 1) + split_after) + high
    halves = stream.halves

    def state_before(draws: int, doubles_drawn: int) -> tuple[int, int, int]:
        """(next raw index, waiting half index or -1, last half that waited or -1)."""
        if draws:
            last = int(draw_half[draws - 1]) | 1
        else:
            last = 1 if waited else -1
        position = (draws + waited + 1) // 2 + doubles_drawn
        return position, (last if (draws + waited) & 1 else -1), last

    redraw = np.zeros(count, dtype=bool)
    # Floyd's algorithm, one step for all rows at a time; ``taken`` is by candidate index.
    taken = np.zeros(candidate.shape, dtype=bool)
    for t in range(int(k.max())):
        active = np.flatnonzero(k > t)
        j = n[active] - k[active] + t
        draw = np.maximum(draws_before[active] + t - starts_at_zero[active], 0)
        value, again = _bounded(halves, draw_half[draw], j + 1)
        value = np.where(j == 0, 0, value)
        redraw[active] |= again & (j > 0)
        taken[active, np.where(taken[active, value], j, value)] = True
    # The shuffle's draws, in [0, i] for i from k - 1 down to 1: only their redraws matter.
    shuffled = np.maximum(k - 1, 0)
    step = _ragged_arange(shuffled)
    first_shuffle = draws_before + k - starts_at_zero
    _, again = _bounded(
        halves, draw_half[np.repeat(first_shuffle, shuffled) + step], np.repeat(k, shuffled) - step
    )
    redraw[np.repeat(np.arange(count), shuffled)[again]] = True

    # Selected positions (ascending), their doubles and random replacements.
    rank = np.cumsum(candidate, axis=1) - 1
    selected = candidate & np.take_along_axis(taken, np.maximum(rank, 0), axis=1)
    sel_rows, sel_columns = np.nonzero(selected)
    slot = _ragged_arange(k)
    first_double = (draws_before + choice_draws + waited + 1) // 2 + doubles_before
    draw = doubles[np.repeat(first_double, k) + slot]
    to_mask, to_replace = masking.outcomes(draw)
    replace_rows = sel_rows[to_replace]
    if replacement_range > 0:
        nth = _ragged_arange(replacements)
        first_replacement = draws_before + choice_draws
        value, again = _bounded(
            halves,
            draw_half[np.repeat(first_replacement, replacements) + nth],
            np.full(len(nth), replacement_range + 1),
        )
        redraw[replace_rows[again]] = True
    else:
        value = np.zeros(len(replace_rows), dtype=np.int64)
    replacement = masking.ordinary_ids[value]

    bad = np.flatnonzero(redraw)
    done = int(bad[0]) if len(bad) else count
    if done < count:  # where that row's draws start
        stream.set_state(*state_before(int(draws_before[done]), int(doubles_before[done])))
    else:
        stream.set_state(*state_before(total_draws, int(k.sum())))
    keep = sel_rows < done
    out_rows, out_columns = sel_rows[keep], sel_columns[keep]
    labels[out_rows, slot[keep]] = input_ids[out_rows, out_columns]
    positions[out_rows, slot[keep]] = out_columns
    mask_here = to_mask & keep
    masked[sel_rows[mask_here], sel_columns[mask_here]] = masking.mask_id
    replace_keep = replace_rows < done
    masked[replace_rows[replace_keep], sel_columns[to_replace][replace_keep]] = replacement[
        replace_keep
    ]
    num_predictions[:done] = k[:done]
    return done
