"""Dynamic masking: a whole batch re-masked with TF ops inside the tf.data pipeline.

- ``dynamic_mask_batch(batch, seed, masking) -> batch``.

It first restores the original tokens from the record's ``masked_lm_ids`` (so any static
records, including the original tool's, can be re-masked), then gives each example a fresh
selection with stateless RNG from ``seed``, under the same rules as static_sequence.py. With
``whole_word_mask`` whole words are taken in random order while they fit the budget; unlike
static masking, the first word that does not fit ends the selection (a prefix rule has a closed
vectorized form; skipping needs a sequential loop), so slightly fewer than 15% of tokens may be
selected.

It runs where TensorFlow is already loaded (inside a tf.data map) and imports it lazily.
"""

from __future__ import annotations

from bert_jax.data.masking.settings import MaskingConfig


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
    # The one rule (``MaskingConfig.num_to_predict``), as a table over every count a row can have.
    rule = tf.constant(masking.num_to_predict_table(seq_length), dtype=tf.int32)
    num_to_predict = tf.gather(rule, num_candidates)

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
