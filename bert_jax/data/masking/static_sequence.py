"""Static masking of one sequence (host Python), as google-research/bert's
create_pretraining_data.py does it.

- ``mask_instance(input_ids, masking, rng) -> (masked_input_ids, masked_lm_positions,
  masked_lm_ids)``; ``mask_ids`` is the same on Python lists (static_rows.py masks many rows at
  once with exactly its draws; instance creation uses that).

Semantics (Devlin et al. and google-research/bert's create_pretraining_data.py): masking selects
``max(1, round(masked_lm_prob * n))`` of the ``n`` non-special tokens (capped by
``max_predictions_per_seq``; ``MaskingConfig.num_to_predict``, every path's count); [CLS],
[SEP] and [PAD] are never selected. Each selected token becomes [MASK] (80%), a random ordinary
token (10%) or stays (10%).

Deliberate differences from the original, each a fix of a known flaw:

- ``n`` counts non-special tokens only (the original counted [CLS] and the two [SEP]s).
- Random replacements come from ``tokenizer.ordinary_ids`` (the original could insert [CLS],
  [SEP], [MASK] or [unused*]).
- With ``whole_word_mask``, the 80/10/10 decision is made once per word (the original decided
  per sub-token), and a word never continues across a [SEP].

Never imports TensorFlow.
"""

from __future__ import annotations

import numpy as np

from bert_jax.data.masking.settings import MaskingConfig


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
