"""The plumbing every other part stands on; it imports nothing else of bert-jax.

- ``errors``: what a user error is (one line, exit 2) and the other exit statuses.
- ``fs``: the one file-system layer, local paths and ``gs://`` alike.
- ``outputs``: atomic writes, and the one rule for replacing an output directory (only what
  bert-jax wrote).
- ``checkpoint_health``: what is wrong with an Orbax save (a checkpoint, a model directory's
  params), in one line, read without Orbax's stderr noise.
- ``host_memory``: what this host can give a child process (a compile, a prepare worker).
- ``topology``: Cloud TPU slice names -> topologies and compile-only devices.
- ``distributed``: ``jax.distributed`` start-up, host agreement, heartbeats between hosts.
- ``heartbeat``: what every host of a run writes into the workdir (its step and when), which a
  supervisor reads (``bert_jax.launch``).
"""
