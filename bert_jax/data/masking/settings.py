"""What masking needs to know, and the one rule that turns a uniform draw into an outcome.

- ``MaskingConfig.from_tokenizer(tokenizer, masked_lm_prob=0.15, max_predictions_per_seq=20,
  whole_word_mask=False)``: the special and ordinary ids, word starts, and the shares.
- ``MaskingConfig.outcomes(draws) -> (to_mask, to_random)``: how a uniform draw becomes [MASK],
  a random token or the same token, the one rule of every path (Python floats in
  static_sequence.py, NumPy in static_rows.py, TensorFlow in dynamic_batch.py).
- ``MaskingConfig.num_to_predict(n)``: how many of a sequence's ``n`` maskable tokens are
  masked, the one rule of every path; ``num_to_predict_table(max_n)`` is the same rule as an
  array for the paths that work on arrays (a NumPy index in static_rows.py, a TensorFlow gather
  in dynamic_batch.py).
- ``check_shares``: the MASK/SAME/RND shares checked, naming the setting.

The defaults (15%, 20 predictions, the 80/10/10 shares) are data/objectives.py's.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from bert_jax.data.objectives import (
    DEFAULT_SHARES,
    MASKED_LM_PROB,
    MAX_PREDICTIONS_PER_SEQ,
    SHARE_KEYS,
)
from bert_jax.data.tokenizers.interface import Tokenizer
from bert_jax.runtime.errors import UserError


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
    mask_share: float = DEFAULT_SHARES["mask_share"]
    random_share: float = DEFAULT_SHARES["random_share"]

    @property
    def random_below(self) -> float:
        # Computed as the defaults always were (0.8 + 0.1), so 80/10/10 draws the same bits.
        return self.mask_share + self.random_share

    def outcomes(self, draws):
        """``(to_mask, to_random)`` for uniform draws in [0, 1), one per selected unit: [MASK]
        below ``mask_share``, a random ordinary token below ``mask_share + random_share``, else
        unchanged.

        The one place a draw becomes [MASK], random or same, for every masking path: ``draws``
        may be a Python float (``mask_ids``), a NumPy array (``static_rows``) or a TensorFlow
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
        mask_share: float = DEFAULT_SHARES["mask_share"],
        same_share: float = DEFAULT_SHARES["same_share"],
        random_share: float = DEFAULT_SHARES["random_share"],
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
        """How many of a sequence's ``num_candidates`` maskable tokens are masked:
        ``round(num_candidates * masked_lm_prob)`` (in float64, half to even, as Python's
        ``round``), at least 1, at most ``max_predictions_per_seq`` and ``num_candidates``.

        The one rule, for every masking path: ``mask_ids`` calls it, and the array paths read
        it through ``num_to_predict_table``."""
        if num_candidates <= 0:
            return 0
        wanted = max(1, int(round(num_candidates * self.masked_lm_prob)))
        return min(self.max_predictions_per_seq, wanted, num_candidates)

    def num_to_predict_table(self, max_candidates: int) -> np.ndarray:
        """int64 [max_candidates + 1]: ``num_to_predict(n)`` at index ``n``, the rule for array
        paths (indexed by each row's candidate count in ``mask_rows``, gathered by
        ``dynamic_mask_batch``)."""
        counts = [self.num_to_predict(n) for n in range(max_candidates + 1)]
        return np.asarray(counts, dtype=np.int64)
