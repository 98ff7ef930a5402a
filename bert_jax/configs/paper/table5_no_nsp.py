"""Table 5, "No NSP" (`--config paper/table5_no_nsp`): BERT-Base trained with the masked LM
alone, no next-sentence prediction (no NSP loss, no NSP metrics).

Records: `data prepare --objective mlm` (RoBERTa's full_sentences, the objective's default;
`--instance-format sentence_pairs` keeps the paper's pairs without their NSP label). A run
refuses records prepared for another objective. Then MNLI, QNLI, MRPC, SST-2 and SQuAD v1.1 as
in Tables 1 and 2.

Changes to the recipe (bert:base): config.objective.
"""

from bert_jax.training.config_lib import pretraining_config


def get_config():
    config = pretraining_config("base")
    config.objective = "mlm"
    return config
