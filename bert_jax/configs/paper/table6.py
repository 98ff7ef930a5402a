"""Table 6, model size (`--config paper/table6:ROW`): one pretraining per row, named
L{layers}_H{hidden}_A{heads} as the paper's #L, #H and #A columns: L3_H768_A12, L6_H768_A3,
L6_H768_A12, L12_H768_A12 (BERT-Base), L12_H1024_A16, L24_H1024_A16 (BERT-Large).

A row of hidden size 768 is the recipe of bert:base, one of 1024 that of bert:large (the same
training, the size preset's shapes), with its layers and heads; the feed-forward size stays 4 x
hidden. Then MNLI, MRPC and SST-2; "LM (ppl)" is the held-out masked-LM perplexity
(`mlm_perplexity` in the eval rows of metrics.jsonl).

Changes to the recipe (bert:base or bert:large): config.model.num_hidden_layers,
config.model.num_attention_heads.
"""

from bert_jax.runtime.errors import UserError
from bert_jax.training.config_lib import pretraining_config

# Row: (layers, hidden, heads), in the paper's order.
ROWS = {
    "L3_H768_A12": (3, 768, 12),
    "L6_H768_A3": (6, 768, 3),
    "L6_H768_A12": (6, 768, 12),
    "L12_H768_A12": (12, 768, 12),
    "L12_H1024_A16": (12, 1024, 16),
    "L24_H1024_A16": (24, 1024, 16),
}
PRESETS = {768: "base", 1024: "large"}  # the size preset whose recipe a row keeps


def get_config(row: str = ""):
    if row not in ROWS:
        raise UserError(f"unknown Table 6 row {row!r}; choose one of {', '.join(ROWS)}")
    layers, hidden, heads = ROWS[row]
    config = pretraining_config(PRESETS[hidden])
    config.model.num_hidden_layers = layers
    config.model.num_attention_heads = heads
    return config
