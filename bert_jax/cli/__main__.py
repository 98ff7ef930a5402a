"""`python -m bert_jax.cli ...`: the same as the `bert-jax` console script."""

from bert_jax.cli import console_main

console_main()
