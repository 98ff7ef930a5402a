"""Masked-LM masking, static (one sequence, host Python) and dynamic (TF ops, a whole batch).

Public API:

- ``MaskingConfig.from_tokenizer(tokenizer, masked_lm_prob=0.15, max_predictions_per_seq=20,
  whole_word_mask=False)``: what masking needs to know from the tokenizer.
- ``mask_instance(input_ids, masking, rng) -> (masked_input_ids, masked_lm_positions,
  masked_lm_ids)``: static masking of one sequence; ``mask_ids`` is the same on Python lists
  (``row_masking.mask_rows`` masks many rows at once with exactly its draws; instance creation
  uses that).
- ``dynamic_mask_batch(batch, seed, masking) -> batch``: re-masking inside the tf.data pipeline.
- ``MaskingConfig.outcomes(draws) -> (to_mask, to_random)``: how a uniform draw becomes [MASK],
  a random token or the same token, the one rule of all three paths (floats, NumPy, tf).

The defaults (15%, 20 predictions, the 80/10/10 shares) are data/objectives.py's.

Semantics (Devlin et al. and google-research/bert's create_pretraining_data.py): masking selects
``max(1, round(masked_lm_prob * n))`` of the ``n`` non-special tokens (capped by
``max_predictions_per_seq``); [CLS], [SEP] and [PAD] are never selected. Each selected token
becomes [MASK] (80%), a random ordinary token (10%) or stays (10%).

Deliberate differences from the original, each a fix of a known flaw:

- ``n`` counts non-special tokens only (the original counted [CLS] and the two [SEP]s).
- Random replacements come from ``tokenizer.ordinary_ids`` (the original could insert [CLS],
  [SEP], [MASK] or [unused*]).
- With ``whole_word_mask``, the 80/10/10 decision is made once per word (the original decided
  per sub-token), and a word never continues across a [SEP].

Dynamic masking first restores the original tokens from the record's ``masked_lm_ids`` (so any
static records, including the original tool's, can be re-masked), then gives each example a fresh
selection with stateless RNG from ``seed``. With ``whole_word_mask`` whole words are taken in
random order while they fit the budget; unlike static masking, the first word that does not fit
ends the selection (a prefix rule has a closed vectorized form; skipping needs a sequential
loop), so slightly fewer than 15% of tokens may be selected.

The static part never imports TensorFlow; the dynamic part runs where TensorFlow is already loaded
(inside a tf.data map) and imports it lazily.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from bert_jax.data.objectives import (
    MASKED_LM_PROB,
    MAX_PREDICTIONS_PER_SEQ,
    PAPER_SHARES,
    SHARE_KEYS,
)
from bert_jax.data.tokenizer import Tokenizer
from bert_jax.runtime.errors import UserError

# The paper's MASK/SAME/RND shares, defined in data/objectives.py (the names are kept for code
# that imports them). Other mixes (its Table 8) are MaskingConfig's shares; every masking path
# turns a draw into an outcome with MaskingConfig.outcomes.
MASK_SHARE = PAPER_SHARES["mask_share"]
RANDOM_SHARE = PAPER_SHARES["random_share"]
SAME_SHARE = PAPER_SHARES["same_share"]


def check_shares(mask: float, same: float, random: float, names=("mask", "same", "random")):
    """UserError (one line, naming the setting) unless each share is in [0, 1] and they sum to 1.

    `names`: how the caller spells the three settings (config keys or command-line flags)."""
    for name, value in zip(names, (mask, same, random)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UserError(f"{name}={value!r} must be a number in [0, 1]")
        if not 0.0 <= float(value) <= 1.0:
            raise UserError(f"{name}={value} must be in [0, 1]")
    total = float(mask) + float(same) + float(random)
    if abs(total - 1.0) > 1e-6:
        raise UserError(
            f"{names[0]}={mask} + {names[1]}={same} + {names[2]}={random} must sum to 1, "
            f"got {total:g}"
        )


@dataclass(frozen=True)
class MaskingConfig:
    """What masking needs from the tokenizer, plus the masking hyperparameters."""

    masked_lm_prob: float
    max_predictions_per_seq: int
    mask_id: int
    never_mask_table: np.ndarray  # bool[vocab]: [CLS], [SEP], [PAD]
    ordinary_ids: np.ndarray  # int32 ids a random replacement may take
    word_start_table: np.ndarray | None  # bool[vocab] when whole-word masking, else None
    cls_id: int
    sep_id: int
    pad_id: int
    vocab_size: int
    # Shares of the selected tokens that become [MASK] and a random ordinary token (the rest
    # stay unchanged): one uniform draw d per unit, [MASK] if d < mask_share, random if
    # d < mask_share + random_share.
    mask_share: float = MASK_SHARE
    random_share: float = RANDOM_SHARE

    @property
    def random_below(self) -> float:
        # Computed as the defaults always were (0.8 + 0.1), so 80/10/10 draws the same bits.
        return self.mask_share + self.random_share

    def outcomes(self, draws):
        """``(to_mask, to_random)`` for uniform draws in [0, 1), one per selected unit: [MASK]
        below ``mask_share``, a random ordinary token below ``mask_share + random_share``, else
        unchanged.

        The one place a draw becomes [MASK], random or same, for every masking path: ``draws``
        may be a Python float (``mask_ids``), a NumPy array (``row_masking``) or a TensorFlow
        tensor (``dynamic_mask_batch``); the results are bools of the same kind.
        """
        mask_below, random_below = self.mask_share, self.random_below
        return draws < mask_below, (draws >= mask_below) & (draws < random_below)

    @classmethod
    def from_tokenizer(
        cls,
        tokenizer: Tokenizer,
        masked_lm_prob: float = MASKED_LM_PROB,
        max_predictions_per_seq: int = MAX_PREDICTIONS_PER_SEQ,
        whole_word_mask: bool = False,
        mask_share: float = MASK_SHARE,
        same_share: float = SAME_SHARE,
        random_share: float = RANDOM_SHARE,
        share_names=SHARE_KEYS,
    ) -> MaskingConfig:
        check_shares(mask_share, same_share, random_share, share_names)
        if not 0.0 < masked_lm_prob < 1.0:
            raise UserError(f"masked_lm_prob must be in (0, 1), got {masked_lm_prob}")
        if max_predictions_per_seq < 1:
            raise UserError(f"max_predictions_per_seq must be >= 1, got {max_predictions_per_seq}")
        never_mask = np.zeros(tokenizer.vocab_size, dtype=bool)
        never_mask[[tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id]] = True
        ordinary_ids = tokenizer.ordinary_ids
        if ordinary_ids.size == 0:
            raise UserError("the tokenizer has no ordinary tokens to use as random replacements")
        return cls(
            masked_lm_prob=float(masked_lm_prob),
            max_predictions_per_seq=int(max_predictions_per_seq),
            mask_id=tokenizer.mask_id,
            never_mask_table=never_mask,
            ordinary_ids=ordinary_ids,
            word_start_table=tokenizer.word_start_table.copy() if whole_word_mask else None,
            cls_id=tokenizer.cls_id,
            sep_id=tokenizer.sep_id,
            pad_id=tokenizer.pad_id,
            vocab_size=tokenizer.vocab_size,
            mask_share=float(mask_share),
            random_share=float(random_share),
        )

    @property
    def whole_word_mask(self) -> bool:
        return self.word_start_table is not None

    # Plain-Python views of the tables for ``mask_ids`` (one sequence at a time).
    @functools.cached_property
    def never_mask_ids(self) -> frozenset[int]:
        return frozenset(np.flatnonzero(self.never_mask_table).tolist())

    @functools.cached_property
    def ordinary_id_list(self) -> list[int]:
        return self.ordinary_ids.tolist()

    @functools.cached_property
    def word_start_list(self) -> list[bool] | None:
        return None if self.word_start_table is None else self.word_start_table.tolist()

    def num_to_predict(self, num_candidates: int) -> int:
        if num_candidates <= 0:
            return 0
        wanted = max(1, int(round(num_candidates * self.masked_lm_prob)))
        return min(self.max_predictions_per_seq, wanted, num_candidates)


def mask_instance(
    input_ids: np.ndarray,
    masking: MaskingConfig,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Masked-LM corruption of one unpadded sequence.

    Returns (masked input ids, masked_lm_positions ascending, masked_lm_ids = original ids there),
    int32 arrays; ``mask_ids`` on lists.
    """
    masked, positions, labels = mask_ids(np.asarray(input_ids).tolist(), masking, rng)
    return (
        np.asarray(masked, dtype=np.int32),
        np.asarray(positions, dtype=np.int32),
        np.asarray(labels, dtype=np.int32),
    )


def mask_ids(
    input_ids: list[int],
    masking: MaskingConfig,
    rng: np.random.Generator,
    candidates: list[int] | None = None,
) -> tuple[list[int], list[int], list[int]]:
    """``mask_instance`` on a list of ids: (masked ids, positions ascending, original ids there).

    ``candidates``, when the caller knows them, are the positions of the tokens that are not
    [CLS], [SEP] or [PAD], ascending (found here otherwise).

    Plain Python apart from the draws (one sequence is short: per-call NumPy overhead would cost
    more than the work). The draws are fixed for a seed: ``choice`` of the positions (or a
    ``permutation`` of the words), ``random`` per selected token (per word), ``integers`` for
    the random replacements.
    """
    if candidates is None:
        candidates = _candidates(input_ids, masking.never_mask_ids)
    num_to_predict = masking.num_to_predict(len(candidates))
    if num_to_predict == 0:
        return list(input_ids), [], []
    if masking.word_start_table is None:
        picks = rng.choice(len(candidates), size=num_to_predict, replace=False).tolist()
        positions = sorted([candidates[pick] for pick in picks])
        token_draws = rng.random(num_to_predict).tolist()
    else:
        positions, token_draws = _select_words(input_ids, candidates, num_to_predict, masking, rng)

    labels = [input_ids[p] for p in positions]
    masked = list(input_ids)
    to_random = []
    mask_id, outcomes = masking.mask_id, masking.outcomes
    for position, draw in zip(positions, token_draws):
        to_mask, to_replace = outcomes(draw)
        if to_mask:
            masked[position] = mask_id
        elif to_replace:
            to_random.append(position)
    if to_random:
        ordinary = masking.ordinary_id_list
        for position in to_random:
            # One scalar draw at a time: the same numbers as one ``size=`` call, at a fifth of
            # the overhead for the few replacements of a sequence.
            masked[position] = ordinary[rng.integers(0, len(ordinary))]
    return masked, positions, labels


def _candidates(input_ids: list[int], never_mask: frozenset[int]) -> list[int]:
    """Positions of the tokens that may be masked, ascending; the scans run in C (list.index)."""
    special = []
    for token in never_mask:
        start = 0
        try:
            while True:
                start = input_ids.index(token, start) + 1
                special.append(start - 1)
        except ValueError:
            pass
    candidates: list[int] = []
    start = 0
    for position in sorted(special):
        candidates.extend(range(start, position))
        start = position + 1
    candidates.extend(range(start, len(input_ids)))
    return candidates


def _select_words(
    input_ids: list[int],
    candidates: list[int],
    num_to_predict: int,
    masking: MaskingConfig,
    rng: np.random.Generator,
) -> tuple[list[int], list[float]]:
    """Whole words in a random order, skipping any that would overflow the budget.

    Returns the selected positions (ascending) and one uniform draw per position, shared by the
    tokens of a word.
    """
    # A word starts at a word-start id or right after a special token (never across [SEP]).
    word_start = masking.word_start_list
    words: list[list[int]] = []
    previous = -2
    for position in candidates:
        if word_start[input_ids[position]] or position != previous + 1 or not words:
            words.append([position])
        else:
            words[-1].append(position)
        previous = position
    chosen = [False] * len(words)
    total = 0
    for word in rng.permutation(len(words)).tolist():
        if total >= num_to_predict:
            break
        size = len(words[word])
        # Like the original: a word that would overflow the budget is skipped, not split.
        if total + size > num_to_predict:
            continue
        chosen[word] = True
        total += size
    word_draws = rng.random(len(words)).tolist()
    positions: list[int] = []
    token_draws: list[float] = []
    for word, draw, is_chosen in zip(words, word_draws, chosen):
        if is_chosen:
            positions.extend(word)
            token_draws.extend([draw] * len(word))
    return positions, token_draws


def dynamic_mask_batch(batch: dict, seed, masking: MaskingConfig) -> dict:
    """Re-mask a parsed batch with TF ops (no Python per example); ``seed`` is an int64 [2].

    Returns a new batch dict with ``input_ids`` and the ``masked_lm_*`` features replaced.
    """
    import tensorflow as tf

    input_ids = batch["input_ids"]
    input_mask = batch["input_mask"]
    batch_size = tf.shape(input_ids)[0]
    seq_length = input_ids.shape[1]
    num_slots = masking.max_predictions_per_seq

    # Undo the static masking: put the original ids back at the predicted positions.
    record_positions = batch["masked_lm_positions"]
    was_predicted = batch["masked_lm_weights"] > 0
    rows = tf.broadcast_to(tf.range(batch_size)[:, None], tf.shape(record_positions))
    indices = tf.stack([rows, record_positions], axis=-1)
    input_ids = tf.tensor_scatter_nd_update(
        input_ids,
        tf.boolean_mask(indices, was_predicted),
        tf.boolean_mask(batch["masked_lm_ids"], was_predicted),
    )

    never_mask = tf.constant(masking.never_mask_table)
    candidates = tf.logical_and(input_mask > 0, tf.logical_not(tf.gather(never_mask, input_ids)))
    num_candidates = tf.reduce_sum(tf.cast(candidates, tf.int32), axis=1)
    wanted = tf.cast(
        tf.round(tf.cast(num_candidates, tf.float32) * masking.masked_lm_prob), tf.int32
    )
    num_to_predict = tf.minimum(tf.minimum(tf.maximum(wanted, 1), num_slots), num_candidates)

    seeds = tf.random.experimental.stateless_split(tf.cast(seed, tf.int64), 4)
    positions = tf.range(seq_length)[None, :]
    if masking.word_start_table is None:
        # Token level: the num_to_predict candidates with the highest random scores. Scores are
        # random integers times L plus the position, so they never tie.
        random_bits = tf.random.stateless_uniform(
            [batch_size, seq_length],
            seed=seeds[0],
            minval=0,
            maxval=(2**31 - 1) // seq_length,  # keeps bits * L + position within int32
            dtype=tf.int32,
        )
        scores = tf.where(candidates, random_bits * seq_length + positions, -1)
        top_scores, _ = tf.math.top_k(scores, k=num_slots)
        kth_index = tf.maximum(num_to_predict - 1, 0)
        threshold = tf.gather(top_scores, kth_index, batch_dims=1)
        selected = candidates & (scores >= threshold[:, None]) & (num_to_predict > 0)[:, None]
        token_draws = tf.random.stateless_uniform([batch_size, seq_length], seed=seeds[1])
    else:
        selected, token_draws = _select_whole_words(
            input_ids, candidates, num_to_predict, masking, seeds
        )
    ordinary = tf.constant(masking.ordinary_ids)
    random_ids = tf.gather(
        ordinary,
        tf.random.stateless_uniform(
            [batch_size, seq_length],
            seed=seeds[2],
            minval=0,
            maxval=int(masking.ordinary_ids.shape[0]),
            dtype=tf.int32,
        ),
    )
    draws_to_mask, draws_to_random = masking.outcomes(token_draws)
    to_mask = selected & draws_to_mask
    to_random = selected & draws_to_random
    masked_ids = tf.where(to_mask, masking.mask_id, tf.where(to_random, random_ids, input_ids))

    # Selected positions, ascending, padded with position 0 / id 0 / weight 0.
    priority = tf.where(selected, seq_length - positions, 0)
    top_priority, _ = tf.math.top_k(priority, k=num_slots)
    slot_valid = top_priority > 0
    masked_lm_positions = tf.where(slot_valid, seq_length - top_priority, 0)
    masked_lm_ids = tf.where(slot_valid, tf.gather(input_ids, masked_lm_positions, batch_dims=1), 0)
    out = dict(batch)
    out["input_ids"] = masked_ids
    out["masked_lm_positions"] = masked_lm_positions
    out["masked_lm_ids"] = masked_lm_ids
    out["masked_lm_weights"] = tf.cast(slot_valid, tf.float32)
    return out


def _select_whole_words(input_ids, candidates, num_to_predict, masking: MaskingConfig, seeds):
    """Whole words in random order while they fit the budget (the prefix rule, module docstring).

    A word starts at a word-start id or after a non-candidate (so never across [SEP]). Returns
    the selected tokens [B, L] and one uniform draw per token, shared by the tokens of a word.
    """
    import tensorflow as tf

    batch_size = tf.shape(input_ids)[0]
    seq_length = input_ids.shape[1]
    previous_is_candidate = tf.pad(candidates[:, :-1], [[0, 0], [1, 0]])
    word_start = tf.gather(tf.constant(masking.word_start_table), input_ids)
    starts = candidates & (word_start | tf.logical_not(previous_is_candidate))
    word_of_token = tf.cumsum(tf.cast(starts, tf.int32), axis=1) - 1
    word_of_token = tf.where(candidates, word_of_token, seq_length)  # sentinel for non-words
    num_words = tf.reduce_sum(tf.cast(starts, tf.int32), axis=1)
    word_sizes = tf.math.bincount(
        word_of_token, minlength=seq_length + 1, maxlength=seq_length + 1, axis=-1
    )[:, :seq_length]
    word_scores = tf.random.stateless_uniform([batch_size, seq_length], seed=seeds[0])
    word_exists = tf.range(seq_length)[None, :] < num_words[:, None]
    word_scores = tf.where(word_exists, word_scores, 2.0)
    order = tf.argsort(word_scores, axis=1)
    sizes_in_order = tf.gather(word_sizes, order, batch_dims=1)
    fits_in_order = tf.cumsum(sizes_in_order, axis=1) <= num_to_predict[:, None]
    fits_in_order &= tf.gather(word_exists, order, batch_dims=1)
    word_chosen = tf.gather(fits_in_order, tf.argsort(order, axis=1), batch_dims=1)
    word_chosen = tf.pad(word_chosen, [[0, 0], [0, 1]])  # the sentinel word is never chosen
    selected = tf.gather(word_chosen, word_of_token, batch_dims=1)
    word_draws = tf.random.stateless_uniform([batch_size, seq_length + 1], seed=seeds[1])
    token_draws = tf.gather(word_draws, word_of_token, batch_dims=1)
    return selected, token_draws
