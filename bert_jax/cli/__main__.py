"""`python -m bert_jax.cli ...`: the same as the `bert-jax` console script."""

import sys

from bert_jax.cli import main

sys.exit(main())
