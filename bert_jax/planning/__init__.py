"""Planning a run for a TPU slice from any host, by compiling the real step ahead of time.

- ``cost_model``: what XLA's cost model says of a compiled step (loops and links corrected).
- ``compile_cache``: the on-disk cache of TPU compiles' figures, by program hash.
- ``compile_report``: a compile check's records and its report in words.
- ``compile_check``: one phase compiled for local devices or a TPU topology: fit, memory, cost.
- ``candidates``: ``plan``'s records (setting, candidate, schedule) and the plan in words.
- ``search``: ``plan``'s staged search, each stage pruning what cannot win.
- ``plan``: ``bert-jax plan``, meshes x accumulation per phase, the schedule's days and cost.
"""
