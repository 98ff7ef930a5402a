"""Table 5, "LTR & No NSP" (`--config paper/table5_ltr`): BERT-Base as a left-to-right language
model: causal self-attention, every position predicts the next token, no NSP. Fine-tuning keeps
the causal mask (the model directory records the objective).

Records: `data prepare --objective ltr` (unmasked full_sentences, the objective's default, or
doc_sentences); dynamic masking is skipped for this objective. Then MNLI, QNLI, MRPC, SST-2 and
SQuAD v1.1 as in Tables 1 and 2.

Changes to the recipe (bert:base): config.objective.
"""

from bert_jax.training.config_lib import pretraining_config


def get_config():
    config = pretraining_config("base")
    config.objective = "ltr"
    return config
