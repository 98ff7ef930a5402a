"""Masked-LM masking (15% of tokens; [MASK] 80%, random 10%, same 10% by default).

- ``settings``: ``MaskingConfig`` (from a tokenizer) and ``outcomes``, the one rule that turns a
  uniform draw into [MASK], random or same; ``check_shares``.
- ``static_sequence``: one sequence at a time, host Python (``mask_instance``, ``mask_ids``).
- ``static_rows``: many rows at once with NumPy, exactly ``mask_ids``' draws (``mask_rows``).
- ``dynamic_batch``: a batch re-masked with TF ops inside the tf.data pipeline.
"""
