"""A pretraining run: its settings, its inputs, its loop, and what it leaves in the workdir.

- ``metrics``: JSONL + TensorBoard writers, FLOPs per token, peak table, MFU.
- ``checkpointing``: Orbax train-state checkpoints, the resume order, params-only restore.
- ``workdir``: the pretraining workdir's lock and leftovers.
- ``config_lib``: configs -> frozen settings, the phases plan, validation, parameter counts.
- ``model_dir``: a workdir's checkpoint read as a model, and the loader of every command's MODEL
  (the model-directory format itself is ``bert_jax.convert.model_dir``).
- ``inputs``: the tokenizer and records of each phase, iterators, the eval source.
- ``pretrain``: the pretraining loop (read it on one screen).
"""
