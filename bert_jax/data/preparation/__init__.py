"""``bert-jax data prepare``: a corpus -> masked instances -> TFRecord shards.

- ``groups``: the unit of work: documents hashed into groups, one group -> one shard.
- ``run``: ``PrepareSettings``, the run checked before anything is written, the local processes,
  ``prepare_cached`` (a corpus prepared once for a pretraining run).
- ``beam_pipeline``: the same steps as an Apache Beam pipeline (``--runner beam``), the way
  past one machine.
"""
