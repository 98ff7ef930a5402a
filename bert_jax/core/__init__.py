"""The model and its step: what runs on the accelerator, with no files and no schedule of runs.

- ``model``: ``BertConfig`` and the Linen modules (embeddings, encoder, pooler, MLM/NSP heads);
  ``dropout``: counter-hash dropout; ``losses``: MLM/NSP losses as (sum, weight) pairs.
- ``partitioning``: the device mesh and the logical-axis rules.
- ``optim``: BERT's AdamW, LAMB and their schedules.
- ``train``: ``TrainState`` and ``ShardedTrainer``, the jitted train/eval steps that pretraining
  and fine-tuning share.
"""
