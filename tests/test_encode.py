"""`bert-jax encode`: real all-MiniLM-L6-v2 features against transformers, padding invariance."""

from __future__ import annotations

import jax
import numpy as np
import pytest
import torch
import transformers

from bert_jax import cli
from bert_jax.convert.between_formats import convert
from bert_jax.convert.model_dir import save_model_dir
from bert_jax.core.model import BertModel
from bert_jax.inference import encode as encode_lib
from bert_jax.training.load_model import load_model_dir
from tests import faults
from tests.convert_fixtures import random_params, write_vocab
from tests.helpers import REAL_SENTENCES, minilm_dir, tiny_config

# Six sentences in batches of four: the last batch is padded with two empty rows.
BATCH_SIZE = 4


@pytest.fixture(scope="module")
def minilm(tmp_path_factory):
    """all-MiniLM-L6-v2 converted to a bert-jax model dir, the text file, and transformers'
    hidden states for the same sentences (tokenized by transformers' BertTokenizer)."""
    root = tmp_path_factory.mktemp("minilm")
    report = convert("hf", minilm_dir(), "bert-jax", root / "model")
    assert not report.has_heads
    texts = root / "texts.txt"
    texts.write_text("\n".join(REAL_SENTENCES) + "\n", encoding="utf-8")
    tokenizer = transformers.BertTokenizer(f"{minilm_dir()}/vocab.txt", do_lower_case=True)
    encoded = tokenizer(REAL_SENTENCES, padding=True, return_tensors="pt")
    model = transformers.BertModel.from_pretrained(minilm_dir(), attn_implementation="eager")
    with torch.no_grad():
        hidden = model.eval()(**encoded, output_hidden_states=True).hidden_states
    mask = encoded["attention_mask"]
    return root, texts, hidden, mask


def _torch_mean(hidden, mask):
    """sentence-transformers' mean pooling: average over tokens where attention_mask is 1."""
    mask = mask[..., None].float()
    return ((hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)).numpy()


def _report(ours, ref, what):
    err = float(np.max(np.abs(ours - ref)))
    print(f"max abs error {what}: {err:.2e}")
    np.testing.assert_allclose(ours, ref, atol=1e-5, rtol=0, err_msg=what)


@pytest.mark.parametrize("pool, layer", [("mean", "-1"), ("cls", "-1"), ("none", "-1")])
def test_minilm_features_match_transformers(minilm, tmp_path, capsys, pool, layer):
    _check_minilm_features(minilm, tmp_path, capsys, pool, layer)


@pytest.mark.parametrize("pool, layer", [("mean", "3"), ("none", "2")])
def test_minilm_features_of_inner_layers_match_transformers(minilm, tmp_path, capsys, pool, layer):
    _check_minilm_features(minilm, tmp_path, capsys, pool, layer)


def _check_minilm_features(minilm, tmp_path, capsys, pool, layer):
    root, texts, hidden, mask = minilm
    out = tmp_path / "features.npy"
    code = cli.main(
        [
            "encode",
            "--model",
            str(root / "model"),
            "--input",
            str(texts),
            "--output",
            str(out),
            "--pool",
            pool,
            "--layer",
            layer,
            "--batch-size",
            str(BATCH_SIZE),
        ]
    )
    assert code == 0, capsys.readouterr().err
    features = np.load(out)
    ref_hidden = hidden[int(layer)]
    if pool == "mean":
        _report(features, _torch_mean(ref_hidden, mask), f"MiniLM mean pooling layer {layer}")
    elif pool == "cls":
        _report(features, ref_hidden[:, 0].numpy(), f"MiniLM [CLS] layer {layer}")
    else:
        lengths = np.load(encode_lib.lengths_path(out))
        np.testing.assert_array_equal(lengths, mask.sum(1).numpy())
        assert features.shape == (len(REAL_SENTENCES), lengths.max(), 384)
        ref = (ref_hidden * mask[..., None]).numpy()
        _report(features, ref, f"MiniLM per-token layer {layer}")


def test_several_layers_are_concatenated(minilm):
    root, _, hidden, mask = minilm
    model = load_model_dir(root / "model")
    result = encode_lib.encode_texts(
        model, REAL_SENTENCES, pool="mean", layers="-2,-1", batch_size=BATCH_SIZE
    )
    ref = np.concatenate([_torch_mean(hidden[-2], mask), _torch_mean(hidden[-1], mask)], -1)
    _report(result.features, ref, "MiniLM mean of concat(-2, -1)")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    config = tiny_config(num_hidden_layers=2)
    vocab = write_vocab(str(root / "vocab.txt"), config.vocab_size)
    path = save_model_dir(root / "model", config, random_params(config, seed=4), vocab)
    return load_model_dir(path)


def test_padding_batching_and_pairs_do_not_change_features(tiny_model, tmp_path):
    lines = [REAL_SENTENCES[0], "", "Where is the dog? ||| The dog jumps over the fox."]
    result = encode_lib.encode_texts(
        tiny_model, _write_and_read(tmp_path, lines), pool="none", batch_size=2
    )
    tokenizer = tiny_model.tokenizer
    assert result.num_truncated == 0
    apply = jax.jit(BertModel(tiny_model.config).apply)
    for row, line in enumerate(lines):
        a, _, b = line.partition(" ||| ")
        ids = [tokenizer.cls_id, *tokenizer.encode(a), tokenizer.sep_id]
        segments = [0] * len(ids)
        if b:
            ids += [*tokenizer.encode(b), tokenizer.sep_id]
            segments += [1] * (len(ids) - len(segments))
        assert result.lengths[row] == len(ids)
        # The same example alone, unpadded: padding and batch neighbours must not leak in.
        alone = apply(
            {"params": tiny_model.params["bert"]},
            np.array([ids], np.int32),
            np.ones((1, len(ids)), np.int32),
            np.array([segments], np.int32),
        )["sequence_output"][0]
        np.testing.assert_allclose(result.features[row, : len(ids)], alone, atol=1e-5, rtol=0)
        assert not result.features[row, len(ids) :].any()


def _write_and_read(tmp_path, lines):
    path = tmp_path / "texts.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    examples = encode_lib.read_texts(path)
    assert len(examples) == len(lines)
    return examples


def test_truncation_is_counted(tiny_model):
    long_text = " ".join(["dog"] * 50)
    result = encode_lib.encode_texts(
        tiny_model, [long_text, "the dog"], pool="cls", max_seq_length=16, batch_size=2
    )
    assert result.num_truncated == 1 and result.lengths.tolist() == [16, 4]


def test_bad_settings_are_refused_clearly(tiny_model, tmp_path, capsys):
    texts = tmp_path / "texts.txt"
    texts.write_text("the dog\n")
    base = ["encode", "--model", tiny_model.path, "--input", str(texts)]
    out = str(tmp_path / "o.npy")
    assert cli.main([*base, "--output", out, "--layer", "3"]) == 2
    assert "layer 3 does not exist: the model has 2 layers" in capsys.readouterr().err
    assert cli.main([*base, "--output", out, "--max-seq-length", "65"]) == 2
    assert "max_position_embeddings=64" in capsys.readouterr().err
    (tmp_path / "empty.txt").write_text("")
    empty = ["encode", "--model", tiny_model.path, "--input", str(tmp_path / "empty.txt")]
    assert cli.main([*empty, "--output", out]) == 2
    assert "holds no lines" in capsys.readouterr().err
    no_tok = save_model_dir(tmp_path / "no_tok", tiny_model.config, tiny_model.params)
    assert cli.main(["encode", "--model", no_tok, "--input", str(texts), "--output", out]) == 2
    assert "no tokenizer/" in capsys.readouterr().err
    # The output name is kept as given (np.save alone would append ".npy").
    assert cli.main([*base, "--output", str(tmp_path / "feats.bin")]) == 0
    assert np.load(tmp_path / "feats.bin").shape == (1, 64)


def test_settings_are_checked_before_the_model_is_read(tmp_path, capsys):
    """A value outside its declared range is one line naming its flag, before anything is read;
    Python callers give the layers as the flag does, and the dtypes are BertConfig's."""
    from bert_jax.core import bert_config
    from bert_jax.inference.encode_settings import DTYPES, EncodeSettings

    base = ["encode", "--model", str(tmp_path / "absent"), "--input", "t", "--output", "o.npy"]
    for flag, value, message in [
        ("--batch-size", "0", "--batch-size 0 must be >= 1"),
        ("--max-seq-length", "0", "--max-seq-length 0 must be >= 1"),
        ("--layer", ",", "--layer names no layer"),
    ]:
        faults.assert_user_error(faults.run_cli(capsys, [*base, flag, value]), message)
    assert (
        EncodeSettings(layers="-2,-1").layers == (-2, -1) == EncodeSettings(layers=[-2, -1]).layers
    )
    assert EncodeSettings().layers == (-1,) and DTYPES is bert_config.DTYPES
    with pytest.raises(ValueError, match="--pool 'max' is not one of cls, last, mean, none"):
        EncodeSettings(pool="max")


def test_output_replaces_only_npy_files(tiny_model, tmp_path, capsys):
    """OUT is written atomically; an existing OUT that is not a .npy array (a source file, a
    directory) is refused with one line and left as it was; an earlier OUT.npy is replaced."""
    texts = tmp_path / "texts.txt"
    texts.write_text("the dog\nthe fox\n")
    base = ["encode", "--model", tiny_model.path, "--input", str(texts), "--output"]
    precious = tmp_path / "notes.txt"
    precious.write_text("my notes\n")
    outcome = faults.run_cli(capsys, [*base, str(precious)])
    faults.assert_user_error(outcome, str(precious), "not a NumPy .npy file")
    assert precious.read_text() == "my notes\n"
    faults.assert_user_error(faults.run_cli(capsys, [*base, str(tmp_path)]), "is a directory")
    lengths = tmp_path / "tokens.lengths.npy"
    lengths.write_text("not numpy\n")
    outcome = faults.run_cli(capsys, [*base, str(tmp_path / "tokens.npy"), "--pool", "none"])
    faults.assert_user_error(outcome, str(lengths))
    assert not (tmp_path / "tokens.npy").exists() and lengths.read_text() == "not numpy\n"
    out = tmp_path / "o.npy"
    np.save(out, np.zeros(3))
    assert cli.main([*base, str(out)]) == 0
    assert np.load(out).shape == (2, 64)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_a_left_to_right_model_is_read_at_its_last_token(tmp_path, capsys):
    """Under a causal mask [CLS] sees only itself, so its state is one vector for every text:
    encode reads a left-to-right model where its pooler does (the last real token) and refuses
    --pool cls in one line."""
    config = tiny_config(num_hidden_layers=1, objective="ltr")
    vocab = write_vocab(str(tmp_path / "vocab.txt"), config.vocab_size)
    path = save_model_dir(tmp_path / "model", config, random_params(config, seed=5), vocab)
    model = load_model_dir(path)
    lines = ["the dog", "Where is the dog? ||| The dog jumps over the fox.", "fox"]
    examples = _write_and_read(tmp_path, lines)
    tokens = encode_lib.encode_texts(model, examples, pool="none", batch_size=2)
    np.testing.assert_allclose(tokens.features[0, 0], tokens.features[2, 0], atol=1e-6, rtol=0)
    default = encode_lib.encode_texts(model, examples, batch_size=2)
    last = tokens.features[np.arange(len(lines)), tokens.lengths - 1]
    np.testing.assert_allclose(default.features, last, atol=1e-6, rtol=0)
    assert np.abs(default.features[0] - default.features[2]).max() > 1e-3
    out = tmp_path / "o.npy"
    base = ["encode", "--model", path, "--input", str(tmp_path / "texts.txt"), "--output", str(out)]
    outcome = faults.run_cli(capsys, [*base, "--pool", "cls"])
    faults.assert_user_error(outcome, "--pool cls", path, "left-to-right", "--pool last")
    assert not out.exists()
    assert cli.main([*base, "--pool", "last", "--batch-size", "2"]) == 0
    np.testing.assert_array_equal(np.load(out), default.features)
