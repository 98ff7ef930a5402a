"""`--config demo` (`make demo`): BERT-Tiny pretrained on the embedded corpus in a few minutes on
2 CPU cores.

The paper's recipe at a size that fits a laptop: both phases (90% of steps at length 128, 10% at
512), dynamic masking, a 4,000-piece SentencePiece vocabulary trained on the corpus (the model's
vocabulary follows it), held-out evaluation next to the most-frequent-token baseline. Shorter and
hotter than the paper (500 steps, lr 1e-3).
"""

from bert_jax.training.config_lib import pretraining_config


def get_config():
    # bert:tiny (batches of 32 and 8, lr 1e-3, evaluations of 10 batches of 32) for 500 steps,
    # with a fixed warmup and intervals that fit them.
    config = pretraining_config("tiny")
    config.total_steps = 500
    config.optimizer.warmup_steps = 50
    config.log_every_steps = 50
    config.checkpoint.every_steps = 250
    config.eval.every_steps = 250
    return config
