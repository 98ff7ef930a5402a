"""The model and its step: what runs on the accelerator, with no files and no schedule of runs.

- ``bert_config``: ``BertConfig`` and the names of its closed-set settings (``dtypes``: the
  dtype names, without JAX); ``dropout``:
  counter-hash dropout; ``layers``: initializers, LayerNorm, Dense, Embed, the embeddings;
  ``attention``: the Pallas attention kernel that keeps attention dropout; ``model``: the Linen
  modules (attention, encoder, pooler, MLM/NSP heads); ``losses``: MLM/NSP losses as (sum,
  weight) pairs.
- ``partitioning``: the device mesh and the logical-axis rules.
- ``optim``: BERT's AdamW, LAMB and their schedules.
- ``trainer``: ``TrainState`` and ``ShardedTrainer``, the jitted train/eval steps that pretraining
  and fine-tuning share.
"""
