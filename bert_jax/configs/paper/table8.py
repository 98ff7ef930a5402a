"""Table 8, masking procedures (`--config paper/table8:ROW`): BERT-Base with one MASK/SAME/RND
mix of the selected tokens, named by its percentages: 80_10_10 (the paper's, as bert:base),
100_0_0, 80_0_20, 80_20_0, 0_20_80, 0_0_100.

With dynamic masking (the recipe's) the records are re-masked with the row's mix every epoch;
with static masking (`--config.data.dynamic_masking=False`) prepare the records with the same
mix (`data prepare --mask-share M --same-share S --random-share R`: a run refuses records of
another). Then MNLI, fine-tuned NER and feature-based NER (`--features concat_last_four`).

Changes to the recipe (bert:base): config.data.mask_share, config.data.same_share,
config.data.random_share.
"""

from bert_jax.data.objectives import SHARE_KEYS
from bert_jax.runtime.errors import UserError
from bert_jax.training.config_lib import pretraining_config

# Row: percentages of the selected tokens that become [MASK], stay the same, become a random token.
ROWS = {
    "80_10_10": (80, 10, 10),
    "100_0_0": (100, 0, 0),
    "80_0_20": (80, 0, 20),
    "80_20_0": (80, 20, 0),
    "0_20_80": (0, 20, 80),
    "0_0_100": (0, 0, 100),
}


def get_config(row: str = ""):
    if row not in ROWS:
        raise UserError(f"unknown Table 8 row {row!r}; choose one of {', '.join(ROWS)}")
    config = pretraining_config("base")
    for key, percent in zip(SHARE_KEYS, ROWS[row]):
        config.data[key] = percent / 100
    return config
