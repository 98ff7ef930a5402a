"""`--config demo` (`make demo`): BERT-Tiny pretrained on the embedded corpus in a few minutes on
2 CPU cores.

The paper's recipe at a size that fits a laptop: both phases (90% of steps at length 128, 10% at
512), dynamic masking, a 4,000-piece SentencePiece vocabulary trained on the corpus (the model's
vocabulary follows it), held-out evaluation next to the most-frequent-token baseline. Shorter and
hotter than the paper (500 steps, lr 1e-3).
"""

from bert_jax.training.config_lib import pretraining_config


def get_config():
    config = pretraining_config("tiny")
    config.total_steps = 500
    config.phase1.batch_size = 32
    config.phase2.batch_size = 8
    config.optimizer.learning_rate = 1e-3
    config.optimizer.warmup_steps = 50
    config.log_every_steps = 50
    config.checkpoint.every_steps = 250
    config.eval.every_steps = 250
    config.eval.batches = 10
    config.eval.batch_size = 32
    return config
