"""Planning a run for a TPU slice from any host, by compiling the real step ahead of time.

- ``cost_model``: what XLA's cost model says of a compiled step (loops and links corrected).
- ``compile_check``: one phase compiled for local devices or a TPU topology: fit, memory, cost.
- ``plan``: ``bert-jax plan``, meshes x accumulation per phase, the schedule's days and cost.
"""
