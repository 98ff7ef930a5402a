"""Default pretraining configs (ml_collections) and the step from config to `BertConfig`.

`configs/bert.py` is thin: `get_config(SIZE)` returns `pretraining_config(SIZE)`, which users then
override from the command line (`--config.optimizer.learning_rate=5e-5`). Defaults are the paper's
(Devlin et al., 2018; the small sizes from Turc et al., 2019): Adam lr 1e-4, b1 0.9, b2 0.999,
eps 1e-6, weight decay 0.01 (not on LayerNorm and biases), 10k warmup steps then linear decay,
global-norm clipping 1.0, dropout 0.1, batch 256, 1M steps, 90% of them at sequence length 128
(20 predictions) and 10% at 512 (80 predictions).
"""

from __future__ import annotations

import ml_collections

from bert_jax import partitioning
from bert_jax.model import BertConfig

# name: (layers, hidden, heads); intermediate size is 4 x hidden throughout.
SIZES: dict[str, tuple[int, int, int]] = {
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "medium": (8, 512, 8),
    "base": (12, 768, 12),
    "large": (24, 1024, 16),
}


def model_config(size: str) -> ml_collections.ConfigDict:
    if size not in SIZES:
        raise ValueError(f"unknown model size {size!r}; choose one of {sorted(SIZES)}")
    layers, hidden, heads = SIZES[size]
    return ml_collections.ConfigDict(
        {
            "vocab_size": 30522,
            "hidden_size": hidden,
            "num_hidden_layers": layers,
            "num_attention_heads": heads,
            "intermediate_size": 4 * hidden,
            "hidden_act": "gelu",
            "hidden_dropout_prob": 0.1,
            "attention_probs_dropout_prob": 0.1,
            "max_position_embeddings": 512,
            "type_vocab_size": 2,
            "initializer_range": 0.02,
            "layer_norm_eps": 1e-12,
            "dtype": "float32",
            "param_dtype": "float32",
            "attention_impl": "auto",
            "sparse_last_layer": True,
            "dropout_impl": "hash",
            # Word-embedding rows padded to a multiple of 128 (30522 -> 30592): the table then
            # divides over a tensor axis of up to 128 devices (see model.BertConfig).
            "vocab_pad_multiple": 128,
        }
    )


def pretraining_config(size: str) -> ml_collections.ConfigDict:
    """The paper's pretraining recipe for one model size."""
    config = ml_collections.ConfigDict()
    config.size = size
    config.model = model_config(size)
    config.seed = 0
    # PRNG of the dropout keys (jax.random key implementations). With the default hash masks
    # (model.dropout_impl) it only derives three words per dropout site and step; with "prng"
    # masks it draws every bit: "rbg" through XLA's RngBitGenerator, "threefry2x32" (~13% more
    # thread time per Base step than rbg on CPU, recomputed in backward fusions). Same masks on
    # any mesh (tested). Parameter init always uses threefry2x32.
    config.dropout_rng_impl = "rbg"
    config.total_steps = 1_000_000
    config.optimizer = ml_collections.ConfigDict(
        {
            "name": "adamw",
            "learning_rate": 1e-4,
            "end_learning_rate": 0.0,
            "warmup_steps": 10_000,
            "b1": 0.9,
            "b2": 0.999,
            "eps": 1e-6,
            "weight_decay": 0.01,
            "clip_norm": 1.0,
            "bias_correction": True,
        }
    )
    config.optimizer.schedule = "whole_run"  # or "per_phase" (each phase warms up and decays)
    config.grad_accum_steps = 1
    # Global batch sizes (all hosts together); each phase may name its own data (`data`: '' uses
    # config.data.source) and, with optimizer.schedule="per_phase", its own learning_rate and
    # warmup_steps (-1: the optimizer's).
    phase = lambda fraction, length, predictions: ml_collections.ConfigDict(  # noqa: E731
        {
            "fraction": fraction,
            "max_seq_length": length,
            "max_predictions_per_seq": predictions,
            "batch_size": 256,
            "data": "",
            "learning_rate": -1.0,
            "warmup_steps": -1,
            # Sequence packing (bert_jax/data/packing.py): records read per packed row, several
            # instances sharing a row with attention kept within each; 0 = one per row. About
            # 0.95 x max_seq_length / mean instance length fills rows (1.6 for the embedded corpus
            # at 512); instances that do not fit are dropped. Training only, not evaluation.
            "packing_factor": 0.0,
        }
    )
    config.phase1 = phase(0.9, 128, 20)
    config.phase2 = phase(0.1, 512, 80)
    small = size in ("tiny", "mini", "small")
    config.data = ml_collections.ConfigDict(
        {
            # Prepared records (`bert-jax data prepare`), a corpus (text files in the original
            # format, .jsonl, tfds:NAME[/CONFIG][:SPLIT]) prepared on the fly, or "embedded" (text
            # that ships with Python: the default for the small sizes, so they run anywhere).
            "source": "embedded" if small else "",
            # Tokenizer directory, SentencePiece .model or WordPiece vocab.txt. Empty: the one
            # saved next to prepared records, else a SentencePiece model trained on the corpus.
            "tokenizer": "",
            "tokenizer_vocab_size": 4000,
            "lowercase": True,
            "dynamic_masking": True,
            "whole_word_mask": False,
            "masked_lm_prob": 0.15,
            "short_seq_prob": 0.1,
            "dupe_factor": -1,  # on-the-fly preparation; -1: 1 with dynamic masking, else 5
            "shuffle_buffer_size": 10_000,
            "cache_dir": "",  # default <workdir>/data
            "num_workers": 1,
            # Disjoint input shards the global batch is drawn from (data/shards.py); 0: one per
            # host. A fixed number (a multiple of every host count you will use) keeps the data
            # order, and exact resume, independent of how many hosts run the job.
            "shards": 0,
        }
    )
    config.eval = ml_collections.ConfigDict(
        {
            "every_steps": 10_000,
            "batches": 20,
            "batch_size": 64,
            "source": "",  # default: embedded:eval when training on the embedded corpus
        }
    )
    config.checkpoint = ml_collections.ConfigDict(
        {"every_steps": 10_000, "keep": 3, "async_save": True}
    )
    config.log_every_steps = 100
    config.resume_from = ""  # a checkpoint directory or workdir of another run
    config.init_from = ""  # a model directory: params only
    config.max_consecutive_nonfinite = 10
    config.export_model = True
    config.mesh = ml_collections.ConfigDict(
        {
            # (data, fsdp, tensor); -1 takes the remaining devices.
            "shape": (-1, 1, 1),
            # Logical axis -> mesh axes, tried in order (see bert_jax/partitioning.py).
            "rules": partitioning.DEFAULT_RULES,
        }
    )
    return config


def bert_config(config: ml_collections.ConfigDict) -> BertConfig:
    """The frozen model config: the ConfigDict stops at the model's door."""
    return BertConfig(**config.model.to_dict())
