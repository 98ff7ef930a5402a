"""Fixtures for the conversion tests: a tiny WordPiece vocabulary, random Hugging Face models, and
Google TF1 checkpoints written with TensorFlow under the original variable names.

The TF1 -> Hugging Face name and layout mapping here is written out by hand, independently of
`bert_jax.convert.mapping`, so the tests do not check the table against itself.
"""

from __future__ import annotations

import json
import os

import numpy as np

from bert_jax.core.model import BertConfig
from tests.helpers import REAL_SENTENCES

SPECIALS = ["[PAD]", "[unused0]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def write_vocab(path: str, size: int | None = None) -> str:
    """An uncased WordPiece vocab.txt covering REAL_SENTENCES (words, letters, ##letters)."""
    words = set()
    for sentence in REAL_SENTENCES:
        for word in sentence.lower().replace(".", " . ").replace(",", " , ").split():
            words.add(word.strip("!?:"))
    letters = "abcdefghijklmnopqrstuvwxyz0123456789"
    tokens = SPECIALS + sorted(w for w in words if w) + list(".,!?:;'\"()-")
    tokens += list(letters) + ["##" + c for c in letters]
    tokens = list(dict.fromkeys(tokens))
    if size is not None:
        assert size >= len(tokens), f"vocab needs at least {len(tokens)} entries"
        tokens += [f"[unused{i}]" for i in range(1, size - len(tokens) + 1)]
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(token + "\n" for token in tokens)
    return path


def random_params(config: BertConfig, seed: int = 0, with_heads: bool = True) -> dict:
    """Random bert-jax params (NumPy) in the model's tree, without compiling an init: kernels and
    embeddings N(0, 0.1), LayerNorm scales around 1 and biases around 0, so no mapping mistake
    hides behind 0 or 1. (test_model_dir checks the table's tree equals the model's.)"""
    from bert_jax.convert import mapping

    rng = np.random.default_rng(seed)
    params: dict = {}
    for entry in mapping.entries(config, with_heads=with_heads):
        shape = mapping.expected_shape(entry, config)
        value = 0.1 * rng.standard_normal(shape)
        if entry.path[-1] == "scale":
            value += 1.0
        mapping.set_path(params, entry.path, value.astype(np.float32))
    return params


def perturb_hf_model(model, seed: int = 0) -> None:
    """Non-trivial biases and LayerNorm parameters, so a mapping mistake cannot hide behind 0/1."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias") or "LayerNorm" in name:
                param.add_(0.1 * torch.randn(param.shape, generator=generator))


# ----------------------------------------------------------------------------------------------
# Google TF1 checkpoints.
# ----------------------------------------------------------------------------------------------


def tf1_arrays(config: BertConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """Random weights under google-research/bert's variable names, in its layouts."""
    rng = np.random.default_rng(seed)
    d, f, v = config.hidden_size, config.intermediate_size, config.vocab_size

    def kernel(rows, cols):  # [in, out], as tf.layers.dense stores it
        return (rng.standard_normal((rows, cols)) * 0.15).astype(np.float32)

    def vector(n, center=0.0):
        return (center + 0.1 * rng.standard_normal(n)).astype(np.float32)

    arrays = {
        "bert/embeddings/word_embeddings": kernel(v, d),
        "bert/embeddings/token_type_embeddings": kernel(config.type_vocab_size, d),
        "bert/embeddings/position_embeddings": kernel(config.max_position_embeddings, d),
        "bert/embeddings/LayerNorm/gamma": vector(d, 1.0),
        "bert/embeddings/LayerNorm/beta": vector(d),
    }
    for i in range(config.num_hidden_layers):
        p = f"bert/encoder/layer_{i}"
        for name in ("query", "key", "value"):
            arrays[f"{p}/attention/self/{name}/kernel"] = kernel(d, d)
            arrays[f"{p}/attention/self/{name}/bias"] = vector(d)
        arrays[f"{p}/attention/output/dense/kernel"] = kernel(d, d)
        arrays[f"{p}/attention/output/dense/bias"] = vector(d)
        arrays[f"{p}/attention/output/LayerNorm/gamma"] = vector(d, 1.0)
        arrays[f"{p}/attention/output/LayerNorm/beta"] = vector(d)
        arrays[f"{p}/intermediate/dense/kernel"] = kernel(d, f)
        arrays[f"{p}/intermediate/dense/bias"] = vector(f)
        arrays[f"{p}/output/dense/kernel"] = kernel(f, d)
        arrays[f"{p}/output/dense/bias"] = vector(d)
        arrays[f"{p}/output/LayerNorm/gamma"] = vector(d, 1.0)
        arrays[f"{p}/output/LayerNorm/beta"] = vector(d)
    arrays["bert/pooler/dense/kernel"] = kernel(d, d)
    arrays["bert/pooler/dense/bias"] = vector(d)
    arrays["cls/predictions/transform/dense/kernel"] = kernel(d, d)
    arrays["cls/predictions/transform/dense/bias"] = vector(d)
    arrays["cls/predictions/transform/LayerNorm/gamma"] = vector(d, 1.0)
    arrays["cls/predictions/transform/LayerNorm/beta"] = vector(d)
    arrays["cls/predictions/output_bias"] = vector(v)
    arrays["cls/seq_relationship/output_weights"] = kernel(2, d)  # [2, hidden]: not transposed
    arrays["cls/seq_relationship/output_bias"] = vector(2)
    return arrays


def google_bert_config(config: BertConfig) -> dict:
    """bert_config.json as Google wrote it ("gelu" there means the tanh approximation)."""
    return {
        "attention_probs_dropout_prob": 0.1,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "hidden_size": config.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": config.intermediate_size,
        "max_position_embeddings": config.max_position_embeddings,
        "num_attention_heads": config.num_attention_heads,
        "num_hidden_layers": config.num_hidden_layers,
        "type_vocab_size": config.type_vocab_size,
        "vocab_size": config.vocab_size,
    }


def write_tf1_checkpoint(
    directory: str,
    arrays: dict[str, np.ndarray],
    bert_config: dict,
    vocab_size: int | None = None,
    optimizer_slots: bool = True,
) -> str:
    """Writes bert_model.ckpt.* with tf.compat.v1.train.Saver (graph mode, as the original code
    did), plus adam_m/adam_v slots and global_step as run_pretraining.py leaves them."""
    import tensorflow as tf

    os.makedirs(directory, exist_ok=True)
    graph = tf.Graph()
    with graph.as_default():
        variables = []
        for name, value in arrays.items():
            variables.append(tf.compat.v1.Variable(value, name=name))
            if optimizer_slots:
                variables.append(tf.compat.v1.Variable(np.zeros_like(value), name=f"{name}/adam_m"))
                variables.append(tf.compat.v1.Variable(np.ones_like(value), name=f"{name}/adam_v"))
        variables.append(tf.compat.v1.train.get_or_create_global_step())
        saver = tf.compat.v1.train.Saver(var_list=variables)
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            saver.save(
                session,
                os.path.join(directory, "bert_model.ckpt"),
                write_meta_graph=False,
                write_state=False,
            )
    with open(os.path.join(directory, "bert_config.json"), "w", encoding="utf-8") as f:
        json.dump(bert_config, f, indent=2)
    write_vocab(os.path.join(directory, "vocab.txt"), vocab_size)
    return directory


def hf_state_dict_from_tf1(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Hugging Face BertForPreTraining keys for the original names (written out by hand, as
    transformers' own `load_tf_weights_in_bert` reads them): dense kernels transpose to
    [out, in]; gamma/beta become weight/bias; the NSP output_weights are already [2, hidden]."""
    state = {}
    for name, value in arrays.items():
        key = name.replace("/", ".")
        for i in range(100):
            key = key.replace(f".layer_{i}.", f".layer.{i}.")
        if name.endswith("/kernel"):
            state[key[: -len("kernel")] + "weight"] = value.T.copy()
        elif name.endswith("/gamma"):
            state[key[: -len("gamma")] + "weight"] = value
        elif name.endswith("/beta"):
            state[key[: -len("beta")] + "bias"] = value
        elif name == "cls/predictions/output_bias":
            state["cls.predictions.bias"] = value
            state["cls.predictions.decoder.bias"] = value
        elif name == "cls/seq_relationship/output_weights":
            state["cls.seq_relationship.weight"] = value
        elif name == "cls/seq_relationship/output_bias":
            state["cls.seq_relationship.bias"] = value
        elif name.startswith("bert/embeddings/") and name.endswith("_embeddings"):
            state[key + ".weight"] = value
            if name.endswith("word_embeddings"):
                state["cls.predictions.decoder.weight"] = value
        else:
            state[key] = value
    return state
