"""ModernBERT's pretraining recipe at each size: `--config modernbert:SIZE` (or
`configs/modernbert.py:SIZE`), SIZE tiny (a CPU trial), base or large (the published shapes).

The model is ModernBERT (config.model.family "modernbert": pre-LN, GeGLU, rotary positions,
global attention every third layer and a 128-token window elsewhere; docs/modernbert.md), trained
as Warner et al. (2024) describe, as far as one config holds it:
- masked LM alone at 30% masking (config.objective mlm, data.masked_lm_prob 0.3), every position
  able to be masked: max_predictions_per_seq is 30% of the length, rounded up;
- single-segment instances (data.instance_format full_sentences: contiguous text up to the
  length, crossing documents with a [SEP]), masks drawn anew each epoch (dynamic masking);
- phase 1 at length 1024, then a context extension at 8192 for the last 15% of the steps, with
  the same tokens per step (4,608 x 1024 = 576 x 8192, about 4.7M): 1.7T then 0.3T tokens in
  425,000 steps;
- StableAdamW (optimizer.name stableadamw: AdamW with each tensor's step divided by
  max(1, RMS(g^2 / v_hat)); the paper's training settings, where its update clipping replaces
  gradient clipping, so optimizer.clip_norm is 0) with betas (0.9, 0.98), eps 1e-6 and weight
  decay 1e-5 (the reference recipe, ModernBERT's yamls/modernbert/modernbert-base-pretrain.yaml),
  the decay decoupled from the rate (optimizer.decouple_lr: that yaml's `decoupled_stableadamw`
  builds optimi's StableAdamW with decouple_lr=True) and skipping norms and biases (its
  filter_bias_norm_wd);
- a peak rate of 8e-4 (base) or 5e-4 (large) (the paper's training settings) after a warmup of
  about 3B tokens (640 steps), held (the trapezoid, optimizer.decay wsd) and decayed as
  1 - sqrt over the last 2.5% of the steps (ModernBERT's 50B tokens).
What it does not reproduce: the batch-size warmup, the global rotary base raised for the extension
only (here it is the published model's 160,000 throughout), the extension's lower rate (one
schedule runs over both phases) and large's restart at a rate of 5e-5.

tiny trains on the embedded corpus on a CPU (config_lib.CPU_TRIAL: batches of 32 and 8, a warmup
of 10% of the run, lr 1e-3) at lengths 128 then 256, 400 steps, its SentencePiece vocabulary
trained for the run, with AdamW: StableAdamW with the paper's settings learns less in those 400
steps (held-out MLM accuracy 0.144 against AdamW's 0.186). Override any setting from the
command line; `bert-jax pretrain --config modernbert:tiny --config-help` lists them.
"""

import math

from bert_jax.core.modernbert_config import ModernBertConfig
from bert_jax.training.config_lib import CPU_SIZES, pretraining_config

MASKED_LM_PROB = 0.3
# (phase 1, phase 2) lengths and global batches: the paper's at base and large, CPU-sized at tiny.
LENGTHS = {"tiny": (128, 256)}
PAPER_LENGTHS = (1024, ModernBertConfig.max_position_embeddings)
PAPER_BATCHES = (4608, 576)
PEAK_RATE = {"base": 8e-4, "large": 5e-4}


def get_config(size: str | None = None):
    """ModernBERT's recipe at `size` (none named: base)."""
    size = size or "base"
    config = pretraining_config(size, family="modernbert")
    config.objective = "mlm"
    config.data.masked_lm_prob = MASKED_LM_PROB
    config.data.instance_format = "full_sentences"
    config.data.dynamic_masking = True
    config.optimizer.decay = "wsd"
    lengths = LENGTHS.get(size, PAPER_LENGTHS)
    for phase, length in zip((config.phase1, config.phase2), lengths):
        phase.max_seq_length = length
        phase.max_predictions_per_seq = math.ceil(MASKED_LM_PROB * length)
    if size in CPU_SIZES:
        config.total_steps = 400
        return config
    config.total_steps = 425_000
    config.phase1.fraction, config.phase2.fraction = 0.85, 0.15
    config.phase1.batch_size, config.phase2.batch_size = PAPER_BATCHES
    config.optimizer.learning_rate = PEAK_RATE[size]
    config.optimizer.warmup_steps = 640
    config.optimizer.decay_fraction = 0.025
    config.optimizer.name = "stableadamw"
    config.optimizer.b1, config.optimizer.b2, config.optimizer.eps = 0.9, 0.98, 1e-6
    config.optimizer.weight_decay = 1e-5
    config.optimizer.decouple_lr = True
    config.optimizer.clip_norm = 0.0
    return config
