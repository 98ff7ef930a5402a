"""BERT pretraining configs, one per size: `--config bert:SIZE` (or `configs/bert.py:SIZE`).

SIZE is tiny (2/128/2), mini (4/256/4), small (4/512/8), medium (8/512/8), base (12/768/12) or
large (24/1024/16) as layers/hidden/heads; all carry the paper's pretraining recipe, which
`bert_jax/training/config_lib.py` documents (tiny, mini and small as a CPU trial of 1,000 steps
with CPU-sized batches, a 4,000-piece vocabulary and a warmup of 10% of the run:
config_lib.CPU_TRIAL; base and large train the paper's 1,000,000 steps). base and large are
the paper's BERT-Base and BERT-Large runs; its experiments (`paper/`) are a few settings over
them. Override any setting from the command line, e.g. `--config.total_steps=100000
--config.optimizer.learning_rate=5e-5`; `bert-jax pretrain --config-help` lists them all (each
declared once, in bert_jax/training/config_schema.py).
"""

from bert_jax.training.config_lib import pretraining_config


def get_config(size: str | None = None):
    """The recipe at `size` (none named: the declared default size, base)."""
    return pretraining_config(size or None)
