"""``bert-jax data prepare``: a corpus -> masked instances -> TFRecord shards.

- ``settings``: ``PrepareSettings``, every setting declared once (flags, checks, manifest, key).
- ``groups``: the unit of work: documents hashed into groups, one group -> one shard.
- ``stage``: a run's steps every runner shares: checked before anything is written, the output
  opened, the completion marks.
- ``local_runner``: ``prepare_records``, the splits and groups in processes on this machine.
- ``progress``: progress lines; ``result``: ``PrepareResult`` and its summary.
- ``cached``: ``prepare_cached``, a corpus prepared once for a pretraining run.
- ``beam_pipeline``: the same steps as an Apache Beam pipeline (``--runner beam``), the way
  past one machine (``beam_watch``: what its job shows).
"""
